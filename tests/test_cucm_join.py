"""Plain-call roles and joining (issue 23 item 3; a CUCM INVITE joined without a rule: issue 40
item 7): ``sip.cucm`` and ``CallBridge`` making two INVITEs with one join key a single call with
two participants (the rules, the profile fields and the joiner: tests/test_calls_join.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asr_core.events import Ended
from asr_gateway.bridge import CallBridge
from calls.call import CallInfo, LegInfo
from calls.handler import CountingCallHandler
from calls.profile import Profile
from calls.routing import Router, RoutesFile
from sip.actions import SendMessage, StartMedia, UpdateMedia
from sip.config import SipSettings
from sip.cucm import plain_call
from sip.header_values import NameAddr
from sip.message import Headers, Request, Response
from sip.uas import UasCore
from tests.bridge_fakes import FakeEngine, RecordingPublisher, bare_processor
from tests.test_sip_support import OFFER_PCMU, SOURCE, FakePorts, ack
from tests.test_sip_support import invite as raw_invite
from tests.waiting import wait_until_async

NEAR = "sip:1001@cucm.example;x-nearend;x-refci=25396399;x-nearenddevice=SEP0011;x-farendaddr=2000"
FAR = "sip:2000@cucm.example;x-farend;x-refci=25396399;x-farenddevice=SEP0022;x-nearendaddr=1001"


def invite(**headers: str) -> Request:
    return Request("INVITE", "sip:rec@asr", Headers(list(headers.items())))


def test_cucm_near_end_is_the_agent_far_end_the_caller_tied_by_refci() -> None:
    near = plain_call(invite(), NEAR, "mixed", "cucm")
    far = plain_call(invite(), FAR, "mixed", "cucm")
    assert (near.role, far.role) == ("agent", "caller")
    assert near.join_key == far.join_key == "cucm=25396399"


def test_plain_calls_without_cucm_params_keep_the_profile_role_and_stand_alone() -> None:
    assert plain_call(invite(), "sip:citizen@pbx", "mixed", "cucm") == plain_call(invite(), "sip:x@y", "mixed", None)
    assert plain_call(invite(), "sip:citizen@pbx", "caller", None).role == "caller"
    assert plain_call(invite(), "not a uri", "agent", "cucm").join_key is None


def test_a_cucm_invite_is_joined_and_given_its_role_without_a_join_rule() -> None:
    near, far = plain_call(invite(), NEAR, "mixed", None), plain_call(invite(), FAR, "caller", None)
    assert (near.role, far.role) == ("agent", "caller")
    assert near.join_key == far.join_key == "cucm=25396399"
    assert plain_call(invite(), NEAR, "mixed", None) == plain_call(invite(), NEAR, "mixed", "cucm")


def test_join_by_none_turns_the_automatic_cucm_join_off() -> None:
    assert plain_call(invite(), NEAR, "mixed", "none") == plain_call(invite(), FAR, "mixed", "none")
    assert plain_call(invite(), NEAR, "caller", "none").join_key is None


@pytest.mark.parametrize(
    "uri",
    [
        "sip:1001@cucm.example;x-nearend",  # no x-refci: nothing to pair by
        "sip:1001@cucm.example;x-nearend;x-refci=",
        "sip:1001@cucm.example;x-refci=25396399",  # neither end named
        "sip:1001@cucm.example;x-nearend;x-farend;x-refci=25396399",  # both: which?
        "sip:1001@pbx.example;refci=25396399",
    ],
)
def test_only_an_unmistakable_cucm_uri_is_joined_without_a_rule(uri: str) -> None:
    assert plain_call(invite(), uri, "caller", None) == plain_call(invite(), uri, "caller", "none")


def test_header_and_uri_param_join_keys() -> None:
    by_header = plain_call(invite(**{"X-Recording-Ref": " abc "}), "sip:a@b", "agent", "header:x-recording-ref")
    assert by_header.join_key == "header:x-recording-ref=abc" and by_header.role == "agent"
    assert plain_call(invite(), "sip:a@b", "agent", "header:X-Recording-Ref").join_key is None
    by_param = plain_call(invite(), "sip:a@b;Session=77", "caller", "uri-param:session")
    assert by_param.join_key == "uri-param:session=77"


# -- CallBridge joining, with stand-ins for the engine and the Redis side (tests/bridge_fakes.py)


def call(call_id: str, key: str | None, timeout_s: float = 5.0) -> CallInfo:
    profile = Profile(join_by="cucm", join_timeout_s=timeout_s)
    return CallInfo(call_id, "sip", f"sip-{call_id}", "sip:a@b", None, "sip:r@asr", None,
                    ("127.0.0.1", 5060, "udp"), "cucm", profile, False, join_key=key)  # fmt: skip


def leg(call_id: str, role: Any) -> LegInfo:
    return LegInfo(f"{call_id}-0", None, role, None, "PCMU")


def make_bridge() -> tuple[CallBridge, FakeEngine, RecordingPublisher]:
    engine, publisher = FakeEngine(), RecordingPublisher()
    bridge = CallBridge(engine, bare_processor(), publisher)
    bridge.start()
    return bridge, engine, publisher


def end(bridge: CallBridge, engine: FakeEngine, info: CallInfo) -> None:
    stream_id = f"{info.call_id}-0"
    engine.callbacks[stream_id](Ended(stream_id, 0, "input_finished", 1000))
    bridge.call_ended(info, "bye")


def test_two_invites_with_one_key_are_one_call_ended_when_both_end() -> None:
    bridge, engine, publisher = make_bridge()
    first, second = call("a", "cucm=1"), call("b", "cucm=1")

    async def scenario() -> None:
        bridge.open_leg(first, leg("a", "agent"))
        await asyncio.sleep(0.05)  # a window in which it must not be announced
        assert publisher.started == []  # waiting for the partner
        bridge.open_leg(second, leg("b", "caller"))
        await wait_until_async(lambda: publisher.started, 5.0, "call.started")
        end(bridge, engine, first)
        await asyncio.sleep(0.05)  # a window in which it must not end
        assert publisher.ended == []  # the other direction is still up
        end(bridge, engine, second)

    asyncio.run(scenario())
    bridge.stop()
    assert publisher.started == [("a", ["agent", "caller"])]
    assert publisher.ended == ["a"]
    assert bridge.active_calls == 0 and bridge.table.empty()


def test_a_partner_that_never_comes_times_out_and_a_late_one_is_its_own_call() -> None:
    bridge, engine, publisher = make_bridge()
    first, late = call("a", "cucm=2", timeout_s=0.05), call("b", "cucm=2", timeout_s=0.05)

    async def scenario() -> None:
        bridge.open_leg(first, leg("a", "agent"))
        await wait_until_async(lambda: publisher.started, 5.0, "call.started of a after its join timeout")
        assert publisher.started == [("a", ["agent"])]
        bridge.open_leg(late, leg("b", "caller"))
        await wait_until_async(lambda: len(publisher.started) == 2, 5.0, "call.started of b after its join timeout")
        end(bridge, engine, first)
        end(bridge, engine, late)

    asyncio.run(scenario())
    bridge.stop()
    assert publisher.started == [("a", ["agent"]), ("b", ["caller"])]
    assert sorted(publisher.ended) == ["a", "b"]


def test_calls_without_a_key_are_announced_at_once() -> None:
    bridge, _engine, publisher = make_bridge()

    async def scenario() -> None:
        bridge.open_leg(call("a", None), leg("a", "mixed"))
        await wait_until_async(lambda: publisher.started, 5.0, "call.started")

    asyncio.run(scenario())
    bridge.stop()
    assert publisher.started == [("a", ["mixed"])]


# -- through the sans-IO UAS: role and key on CallInfo, kept across a re-INVITE -----------


@pytest.mark.parametrize("join_by", [None, "cucm"])
def test_uas_gives_a_cucm_near_end_invite_the_agent_role_and_the_join_key(join_by: str | None) -> None:
    router = Router(RoutesFile(profiles={"default": Profile(join_by=join_by)}))
    core = UasCore(SipSettings(), CountingCallHandler(), FakePorts(), router)

    def near(data: bytes) -> bytes:
        return data.replace(b"<sip:alice@10.0.0.5>;tag", b"<sip:alice@10.0.0.5;x-nearend;x-refci=42>;tag")

    actions = core.receive(near(raw_invite()), SOURCE, 0.0)
    (start,) = [a for a in actions if isinstance(a, StartMedia)]
    assert start.leg.role == "agent" and start.call.join_key == "cucm=42"
    final = [a.message for a in actions if isinstance(a, SendMessage) and isinstance(a.message, Response)][-1]
    assert final.status == 200
    tag = NameAddr.parse(final.headers.get("To") or "").tag
    assert tag
    core.receive(ack(to_tag=tag), SOURCE, 0.1)
    hold = raw_invite(to_tag=tag, cseq=2, branch="z9hG4bK-r2", body=OFFER_PCMU.replace("sendrecv", "sendonly"))
    actions = core.receive(near(hold), SOURCE, 1.0)
    (update,) = [a for a in actions if isinstance(a, UpdateMedia)]
    assert update.on_hold and update.leg.role == "agent"
