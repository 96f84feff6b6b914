"""Offer/answer shapes real PBXs use (RFC 3261 13/14, RFC 3264, RFC 3311, RFC 6337): delayed
offer (INVITE without SDP, answer in the ACK), offerless re-INVITE, UPDATE with SDP, and the
SRTP policy. Sans-IO: the UAS core driven by a fake clock."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from calls.handler import CountingCallHandler
from calls.profile import Profile
from calls.routing import Router, RoutesFile
from sip.actions import Action, CallEnded, LegUpdated, StartMedia, UpdateMedia
from sip.config import SipSettings
from sip.dialog import CallState
from sip.header_values import NameAddr
from sip.message import Request
from sip.sdp import SessionDescription, build_answer, plan_streams
from sip.uas import UasCore
from tests.test_sip_support import OFFER_PCMU, SOURCE, FakePorts, ack, invite
from tests.test_sip_uas import make_core, requests, responses, statuses


def answer_to(offer: bytes, payload_type: int = 8, direction: str = "sendonly", port: int = 41000) -> str:
    """The peer's SDP answer to our one-stream offer, choosing ``payload_type``."""
    assert b"m=audio" in offer
    return (
        "v=0\r\no=- 7 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\n"
        f"m=audio {port} RTP/AVP {payload_type}\r\na={direction}\r\n"
    )


def ack_with(tag: str, body: str, cseq: int = 1, branch: str = "z9hG4bK-ack1") -> bytes:
    return invite(method="ACK", to_tag=tag, cseq=cseq, branch=branch, body=body)


def delayed_offer_call() -> tuple[UasCore, str, bytes, StartMedia]:
    core = make_core()
    actions = core.receive(invite(body=""), SOURCE, 0.0)
    assert statuses(actions) == [100, 200]
    ok = responses(actions)[-1]
    tag = NameAddr.parse(ok.headers.get("To") or "").tag
    assert tag
    (start,) = [a for a in actions if isinstance(a, StartMedia)]
    return core, tag, ok.body, start


def test_delayed_offer_gets_our_offer_in_the_200_and_the_answer_in_the_ack() -> None:
    core, tag, offer, start = delayed_offer_call()
    sdp = SessionDescription.parse(offer)
    (media,) = sdp.media
    assert (media.port, media.proto, media.direction) == (start.port, "RTP/AVP", "recvonly")
    assert media.formats == ["9", "0", "8", "96", "97", "101", "102"]
    assert b"a=rtpmap:9 G722/8000" in offer  # RFC 3551: 8000 in the rtpmap, 16 kHz audio
    assert b"a=rtpmap:96 L16/16000" in offer and b"a=rtpmap:97 L16/8000" in offer
    assert b"a=rtpmap:101 telephone-event/8000" in offer and b"a=fmtp:101 0-15" in offer
    assert b"a=rtpmap:102 telephone-event/16000" in offer and b"a=fmtp:102 0-15" in offer
    assert start.payload_types == {
        9: "G722", 0: "PCMU", 8: "PCMA", 96: "L16/16000", 97: "L16/8000",
        101: "telephone-event", 102: "telephone-event/16000",
    }  # fmt: skip
    assert start.on_hold and start.remote is None
    actions = core.receive(ack_with(tag, answer_to(offer)), SOURCE, 0.1)
    (update,) = [a for a in actions if isinstance(a, UpdateMedia)]
    assert (update.payload_types, update.on_hold, update.remote) == ({8: "PCMA"}, False, ("10.0.0.5", 41000))
    (changed,) = [a for a in actions if isinstance(a, LegUpdated)]
    assert changed.leg.codec == "PCMA"
    call = core.call(start.call.call_id)
    assert call is not None
    assert call.state is CallState.CONFIRMED and not call.awaiting_answer
    assert core.receive(ack_with(tag, answer_to(offer)), SOURCE, 0.2) == []


def test_answer_that_keeps_pcmu_changes_only_direction_and_address() -> None:
    core, tag, offer, _ = delayed_offer_call()
    actions = core.receive(ack_with(tag, answer_to(offer, payload_type=0)), SOURCE, 0.1)
    assert [type(a) for a in actions] == [UpdateMedia]


def bye_after(actions: list[Action]) -> Request:
    (bye,) = requests(actions)
    assert bye.method == "BYE"
    assert any(isinstance(a, CallEnded) and a.reason == "no-acceptable-answer" for a in actions)
    return bye


def test_ack_without_answer_ends_the_call_with_a_bye_and_a_reason() -> None:
    core, tag, _, _ = delayed_offer_call()
    bye = bye_after(core.receive(ack(to_tag=tag), SOURCE, 0.1))
    assert bye.headers.get("Reason") == 'SIP;cause=488;text="the ACK carried no SDP answer to our offer in the 200"'
    assert core.counters["calls.answer_refused"] == 1


def test_unacceptable_answers_end_the_call() -> None:
    for body in (
        answer_to(b"m=audio", payload_type=18),
        answer_to(b"m=audio", port=0),
        answer_to(b"m=audio") + "m=audio 41002 RTP/AVP 0\r\n",
        "garbage",
    ):
        core, tag, _, _ = delayed_offer_call()
        bye = bye_after(core.receive(ack_with(tag, body), SOURCE, 0.1))
        assert (bye.headers.get("Reason") or "").startswith("SIP;cause=488;text="), body


def test_offerless_siprec_invite_is_refused_with_a_warning() -> None:
    core = make_core()
    (refused,) = responses(core.receive(invite(body="", extra="Require: siprec\r\n"), SOURCE, 0.0))
    assert refused.status == 488
    assert "delayed offer is not supported" in (refused.headers.get("Warning") or "")


def test_delayed_offer_for_a_profile_that_transcribes_no_mixed_stream_is_refused() -> None:
    routes = RoutesFile(profiles={"default": Profile(transcribe=["agent"])})
    core = UasCore(SipSettings(), CountingCallHandler(), FakePorts(), Router(routes))
    assert statuses(core.receive(invite(body=""), SOURCE, 0.0))[-1] == 488


def confirmed_call() -> tuple[UasCore, str, StartMedia]:
    core = make_core()
    actions = core.receive(invite(), SOURCE, 0.0)
    tag = NameAddr.parse(responses(actions)[-1].headers.get("To") or "").tag or ""
    (start,) = [a for a in actions if isinstance(a, StartMedia)]
    core.receive(ack(to_tag=tag), SOURCE, 0.1)
    return core, tag, start


def test_offerless_reinvite_gets_our_offer_and_takes_the_answer_from_the_ack() -> None:
    core, tag, start = confirmed_call()
    actions = core.receive(invite(to_tag=tag, cseq=2, branch="z9hG4bK-re", body=""), SOURCE, 1.0)
    (ok,) = responses(actions)
    assert ok.status == 200
    (media,) = SessionDescription.parse(ok.body).media
    assert (media.port, media.formats, media.direction) == (
        start.port,
        ["9", "0", "8", "96", "97", "101", "102"],
        "recvonly",
    )
    assert b"o=hotline-asr" in ok.body and b" 2 IN IP4" in ok.body
    update = core.receive(invite(to_tag=tag, cseq=3, branch="z9hG4bK-up", method="UPDATE"), SOURCE, 1.05)
    assert statuses(update) == [491]
    actions = core.receive(ack_with(tag, answer_to(ok.body, direction="inactive"), cseq=2), SOURCE, 1.1)
    (changed,) = [a for a in actions if isinstance(a, UpdateMedia)]
    assert changed.payload_types == {8: "PCMA"} and changed.on_hold


def test_update_with_sdp_mid_dialog_is_answered_and_applied() -> None:
    core, tag, start = confirmed_call()
    hold = OFFER_PCMU.replace("a=sendrecv", "a=sendonly").replace("RTP/AVP 0 8 101", "RTP/AVP 8 101")
    actions = core.receive(invite(method="UPDATE", to_tag=tag, cseq=2, branch="z9hG4bK-u1", body=hold), SOURCE, 1.0)
    (ok,) = responses(actions)
    assert ok.status == 200 and ok.headers.get("Content-Type") == "application/sdp"
    (media,) = SessionDescription.parse(ok.body).media
    assert (media.port, media.formats, media.direction) == (start.port, ["8", "101"], "recvonly")
    (changed,) = [a for a in actions if isinstance(a, UpdateMedia)]
    assert changed.on_hold and changed.payload_types == {8: "PCMA", 101: "telephone-event"}
    refresh = core.receive(invite(method="UPDATE", to_tag=tag, cseq=3, branch="z9hG4bK-u2", body=""), SOURCE, 2.0)
    assert statuses(refresh) == [200] and responses(refresh)[0].body == b""


def test_update_before_the_invite_is_answered_gets_500_with_retry_after() -> None:
    core = make_core(answer_delay_ms=2000)
    ringing = responses(core.receive(invite(), SOURCE, 0.0))[-1]
    tag = NameAddr.parse(ringing.headers.get("To") or "").tag or ""
    (refused,) = responses(core.receive(invite(method="UPDATE", to_tag=tag, cseq=2, branch="z9hG4bK-u"), SOURCE, 0.5))
    assert refused.status == 500 and refused.headers.get("Retry-After") == "1"


CRYPTO = "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz|2^20|1:4\r\n"
SAVP_ONLY = OFFER_PCMU.replace("RTP/AVP", "RTP/SAVP") + CRYPTO
AVP_AND_SAVP = SAVP_ONLY + "m=audio 40002 RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"


def test_savp_only_offer_is_refused_488_with_a_warning_never_answered_without_keys() -> None:
    core = make_core()
    (refused,) = responses(core.receive(invite(body=SAVP_ONLY), SOURCE, 0.0))[-1:]
    assert refused.status == 488
    assert (refused.headers.get("Warning") or "").startswith('302 hotline-asr "SRTP (RTP/SAVP) is not taken')
    assert "srtp: off" in (refused.headers.get("Warning") or "")
    for proto in ("RTP/SAVPF", "UDP/TLS/RTP/SAVP"):
        body = OFFER_PCMU.replace("RTP/AVP", proto)
        assert statuses(make_core().receive(invite(body=body), SOURCE, 0.0))[-1] == 488, proto


def test_offer_with_avp_and_savp_alternatives_takes_avp_when_srtp_is_off() -> None:
    routes = RoutesFile(profiles={"default": Profile(srtp="off")})
    core = UasCore(SipSettings(), CountingCallHandler(), FakePorts(), Router(routes))
    actions = core.receive(invite(body=AVP_AND_SAVP), SOURCE, 0.0)
    ok = responses(actions)[-1]
    assert ok.status == 200
    savp, avp = SessionDescription.parse(ok.body).media
    assert (savp.port, savp.proto) == (0, "RTP/SAVP") and b"a=crypto" not in ok.body
    assert avp.proto == "RTP/AVP" and avp.port != 0
    (start,) = [a for a in actions if isinstance(a, StartMedia)]
    assert start.remote == ("10.0.0.5", 40002) and start.srtp is None


def test_reinvite_to_savp_only_is_refused_and_the_call_keeps_its_leg() -> None:
    core, tag, start = confirmed_call()
    actions = core.receive(invite(to_tag=tag, cseq=2, branch="z9hG4bK-re", body=SAVP_ONLY), SOURCE, 1.0)
    assert statuses(actions) == [488]
    call = core.call(start.call.call_id)
    assert call is not None and list(call.legs) == [0]


def test_bare_yaml_off_is_the_off_policy() -> None:
    assert Profile.model_validate({"srtp": False}).srtp == "off"
    with pytest.raises(ValidationError):
        Profile.model_validate({"srtp": True})


def test_g722_is_preferred_and_telephone_event_kept() -> None:
    """An offer listing G.711 before G.722 is still answered with G.722 (wideband wins)."""
    offer = SessionDescription.parse(
        "v=0\r\nc=IN IP4 10.0.0.5\r\nm=audio 41000 RTP/AVP 0 8 9 101\r\n"
        "a=rtpmap:9 G722/8000\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
    )
    (plan,) = plan_streams(offer)
    assert (plan.codec, plan.payload_types) == ("G722", {9: "G722", 101: "telephone-event"})
    answer = build_answer(offer, [plan], {0: 30000}, "127.0.0.1", 1, 1)
    assert b"m=audio 30000 RTP/AVP 9 101\r\n" in answer and b"a=rtpmap:9 G722/8000" in answer
    narrow = SessionDescription.parse("v=0\r\nc=IN IP4 10.0.0.5\r\nm=audio 4000 RTP/AVP 18 8\r\n")
    assert [p.codec for p in plan_streams(narrow)] == ["PCMA"]


def test_l16_offer_is_accepted_at_the_rate_its_rtpmap_names() -> None:
    """L16 (RFC 3551, dynamic payload types): 16 kHz is wideband and wins over G.711 offered
    first; at 8 kHz the offerer's order among the narrowband codecs decides; stereo is refused."""
    offer = SessionDescription.parse(
        "v=0\r\nc=IN IP4 10.0.0.5\r\nm=audio 41000 RTP/AVP 0 118 101 120\r\n"
        "a=rtpmap:118 L16/16000\r\na=rtpmap:101 telephone-event/8000\r\na=rtpmap:120 telephone-event/48000\r\n"
        "a=sendrecv\r\n"
    )
    (plan,) = plan_streams(offer)
    assert (plan.codec, plan.payload_types) == ("L16/16000", {118: "L16/16000", 101: "telephone-event"})
    answer = build_answer(offer, [plan], {0: 30000}, "127.0.0.1", 1, 1)
    assert b"m=audio 30000 RTP/AVP 118 101\r\n" in answer and b"a=rtpmap:118 L16/16000\r\n" in answer
    events16k = SessionDescription.parse(
        "v=0\r\nc=IN IP4 10.0.0.5\r\nm=audio 41000 RTP/AVP 118 119\r\n"
        "a=rtpmap:118 L16/16000\r\na=rtpmap:119 telephone-event/16000\r\n"
    )
    (plan,) = plan_streams(events16k)
    assert plan.payload_types == {118: "L16/16000", 119: "telephone-event/16000"}
    answer = build_answer(events16k, [plan], {0: 30000}, "127.0.0.1", 1, 1)
    assert b"a=rtpmap:119 telephone-event/16000\r\na=fmtp:119 0-15\r\n" in answer

    def picked(formats: str, rtpmaps: str) -> list[str]:
        sdp = f"v=0\r\nc=IN IP4 10.0.0.5\r\nm=audio 4000 RTP/AVP {formats}\r\n{rtpmaps}"
        return [p.codec for p in plan_streams(SessionDescription.parse(sdp))]

    assert picked("99 0", "a=rtpmap:99 l16/8000\r\n") == ["L16/8000"]
    assert picked("0 99", "a=rtpmap:99 L16/8000\r\n") == ["PCMU"]
    assert picked("99 9", "a=rtpmap:99 L16/16000\r\n") == ["L16/16000"]  # same rate as G.722: offer order
    assert picked("99 0", "a=rtpmap:99 L16/16000/2\r\n") == ["PCMU"]
    assert picked("99", "a=rtpmap:99 L16/44100\r\n") == []
    assert picked("11", "") == []  # the static L16 types are 44.1 kHz
