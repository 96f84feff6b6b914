"""The sans-IO UAS core and its transactions, driven by a fake clock (no sockets, no sleeps)."""

from __future__ import annotations

import hashlib
import logging

import pytest

from asr_common.audio import CountingPcmSink
from asr_common.errors import CapacityError
from calls.call import CallInfo, LegInfo
from calls.handler import CountingCallHandler
from calls.registry import CallRegistry
from calls.routing import Router, RoutesFile
from rtp.sink import CountingSink
from sip.actions import Action, CallEnded, LegUpdated, SendMessage, StartMedia, StopMedia, UpdateMedia
from sip.config import AuthSettings, SipSettings
from sip.dialog import Call, CallEvent, CallState
from sip.errors import LocalProtocolError, RemoteProtocolError
from sip.header_values import NameAddr
from sip.message import Address, Request, Response, parse
from sip.transaction import ServerTransaction, TimerConfig, TxState
from sip.uas import UasCore
from tests.test_sip_support import OFFER_PCMU, SOURCE, FakePorts, ack, invite

OFFER_PCMA = OFFER_PCMU.replace("RTP/AVP 0 8 101", "RTP/AVP 8 101")


def responses(actions: list[Action]) -> list[Response]:
    return [a.message for a in actions if isinstance(a, SendMessage) and isinstance(a.message, Response)]


def requests(actions: list[Action]) -> list[Request]:
    return [a.message for a in actions if isinstance(a, SendMessage) and isinstance(a.message, Request)]


def statuses(actions: list[Action]) -> list[int]:
    return [r.status for r in responses(actions)]


def make_core(handler: CountingCallHandler | None = None, **settings: object) -> UasCore:
    return UasCore(SipSettings(**settings), handler or CountingCallHandler(), FakePorts())


def answer(core: UasCore, now: float = 0.0, **kwargs: object) -> tuple[str, list[Action]]:
    actions = core.receive(invite(**kwargs), SOURCE, now)  # type: ignore[arg-type]
    final = responses(actions)[-1]
    assert final.status == 200, final
    tag = NameAddr.parse(final.headers.get("To") or "").tag
    assert tag
    return tag, actions


def bye(tag: str, cseq: int = 2, branch: str = "z9hG4bK-bye") -> bytes:
    return invite(method="BYE", to_tag=tag, cseq=cseq, branch=branch, body="")


def test_invite_answer_ack_bye() -> None:
    handler = CountingCallHandler()
    core = make_core(handler)
    tag, actions = answer(core)
    assert statuses(actions) == [100, 200]
    (start,) = [a for a in actions if isinstance(a, StartMedia)]
    assert start.payload_types == {0: "PCMU", 101: "telephone-event"}
    assert start.leg.role == "mixed" and start.leg.aor == "sip:alice@10.0.0.5"
    ok = responses(actions)[-1]
    assert b"a=recvonly" in ok.body and f"m=audio {start.port} RTP/AVP 0 101".encode() in ok.body
    assert core.receive(ack(to_tag=tag), SOURCE, 0.1) == []
    assert core.call(start.call.call_id).state is CallState.CONFIRMED  # type: ignore[union-attr]
    actions = core.receive(bye(tag), SOURCE, 1.0)
    assert statuses(actions) == [200]
    assert [type(a) for a in actions] == [SendMessage, StopMedia, CallEnded]
    assert core.active_calls == 0
    assert core.receive(bye(tag), SOURCE, 1.1)[0].message.status == 200  # type: ignore[union-attr]
    assert core.counters["retransmissions.absorbed"] == 1


def test_2xx_retransmitted_until_ack_with_timer_g() -> None:
    core = make_core()
    tag, _ = answer(core)
    assert statuses(core.on_timer(0.5)) == [200]
    assert core.on_timer(0.9) == []
    assert statuses(core.on_timer(1.5)) == [200]
    assert statuses(core.receive(invite(), SOURCE, 1.6)) == [200]
    core.receive(ack(to_tag=tag), SOURCE, 1.7)
    assert core.on_timer(10.0) == []


def test_no_ack_gives_up_with_bye_then_bye_times_out() -> None:
    core = make_core()
    answer(core)
    sent: list[Action] = []
    now = 0.0
    while (deadline := core.next_deadline()) is not None and deadline < 31.0:
        now = deadline
        sent += core.on_timer(now)
    actions = core.on_timer(32.0)
    assert [r.method for r in requests(actions)] == ["BYE"]
    assert any(isinstance(a, CallEnded) and a.reason == "ack-timeout" for a in actions)
    (bye_request,) = requests(actions)
    assert bye_request.uri == "sip:alice@10.0.0.5:5062"
    assert bye_request.headers.get("To") == '"Alice" <sip:alice@10.0.0.5>;tag=from1'
    assert core.active_calls == 1
    retransmits = 0
    while (deadline := core.next_deadline()) is not None:
        retransmits += len(requests(core.on_timer(deadline)))
    assert retransmits >= 5
    assert core.active_calls == 0
    assert core.counters["bye.timeout"] == 1


def test_our_bye_completes_on_200() -> None:
    core = make_core()
    tag, actions = answer(core)
    core.receive(ack(to_tag=tag), SOURCE, 0.1)
    call_id = next(a for a in actions if isinstance(a, StartMedia)).call.call_id
    actions = core.media_ended(call_id, "rtp-timeout", 5.0)
    (request,) = requests(actions)
    assert request.headers.get("Reason") == 'SIP;cause=200;text="rtp-timeout"'
    response = Response(200, "OK", request.headers)
    assert core.receive(bytes(response), SOURCE, 5.1) == []
    assert core.active_calls == 0


def test_cancel_while_ringing() -> None:
    core = make_core(answer_delay_ms=2000)
    actions = core.receive(invite(), SOURCE, 0.0)
    assert statuses(actions) == [100, 180]
    cancel = invite(method="CANCEL", body="")
    actions = core.receive(cancel, SOURCE, 0.5)
    assert statuses(actions) == [200, 487]
    tag = NameAddr.parse(responses(actions)[1].headers.get("To") or "").tag
    assert core.receive(ack(to_tag=tag or "", branch="z9hG4bK-1"), SOURCE, 0.6) == []
    assert core.on_timer(3.0) == []
    assert core.active_calls == 0
    assert statuses(core.receive(invite(method="CANCEL", body="", branch="z9hG4bK-x"), SOURCE, 1)) == [481]


def to_tag_of(response: Response) -> str | None:
    return NameAddr.parse(response.headers.get("To") or "").tag


def test_cancel_200_and_487_carry_the_same_to_tag_as_the_180() -> None:
    core = make_core(answer_delay_ms=2000)
    ringing = responses(core.receive(invite(), SOURCE, 0.0))[-1]
    ok, terminated = responses(core.receive(invite(method="CANCEL", body=""), SOURCE, 0.5))
    assert to_tag_of(ringing) and to_tag_of(ok) == to_tag_of(terminated) == to_tag_of(ringing)


@pytest.mark.parametrize(
    "data",
    [
        invite(method="CANCEL", body="", branch="z9hG4bK-none"),
        invite(method="BYE", body="", branch="z9hG4bK-bye"),
        invite(method="REGISTER", body=""),
        invite(method="FOO", body=""),
        invite(extra="Require: 100rel\r\n"),
        invite(body="", extra="Session-Expires: 10\r\n"),
        invite(body="v=0\r\nm=video 1 RTP/AVP 31\r\n"),
    ],
)
def test_every_final_response_carries_a_to_tag(data: bytes) -> None:
    core = make_core()
    for response in responses(core.receive(data, SOURCE, 0.0)):
        assert (to_tag_of(response) is None) == (response.status == 100), response


def test_acl_refusal_carries_a_to_tag() -> None:
    core = make_core(acl_cidrs=["192.0.2.0/24"])
    (refused,) = responses(core.receive(invite(), SOURCE, 0.0))
    assert refused.status == 403 and to_tag_of(refused)


def test_answer_delay_then_answer() -> None:
    core = make_core(answer_delay_ms=200)
    core.receive(invite(), SOURCE, 0.0)
    assert core.next_deadline() == pytest.approx(0.2)
    assert statuses(core.on_timer(0.2)) == [200]


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (invite(method="BYE", to_tag="nope", body=""), 481),
        (invite(method="FOO", body=""), 501),
        (invite(method="REGISTER", body=""), 405),
        (invite(content_type="text/plain"), 415),
        (invite(body="", extra="Require: siprec\r\n"), 488),
        (invite(body=OFFER_PCMU.replace("RTP/AVP 0 8 101", "RTP/AVP 18")), 488),
        (invite(body=OFFER_PCMU.replace("m=audio 40000", "m=audio 0")), 488),
        (invite(extra="Require: 100rel\r\n"), 420),
        (invite(extra="Session-Expires: 60\r\n"), 422),
        (invite(body="garbage"), 400),
        (invite(method="UPDATE", to_tag="nope", body=""), 481),
        (invite(method="INFO", to_tag="nope", body=""), 481),
    ],
)
def test_error_statuses(data: bytes, status: int) -> None:
    core = make_core()
    assert statuses(core.receive(data, SOURCE, 0.0))[-1] == status
    assert core.active_calls == 0


def test_422_names_min_se() -> None:
    core = make_core()
    (response,) = responses(core.receive(invite(extra="Session-Expires: 60\r\n"), SOURCE, 0.0))
    assert response.headers.get("Min-SE") == "90"


def test_bad_request_missing_header_gets_400() -> None:
    core = make_core()
    data = invite().replace(b"Call-ID: call-1@10.0.0.5\r\n", b"")
    (response,) = responses(core.receive(data, SOURCE, 0.0))
    assert response.status == 400
    assert core.receive(b"\x00garbage", SOURCE, 0.0) == []
    assert core.counters["dropped.unparseable"] == 1


def test_options_and_admission() -> None:
    handler = CountingCallHandler(capacity=1)
    core = make_core(handler)
    (ok,) = responses(core.receive(invite(method="OPTIONS", body=""), SOURCE, 0.0))
    assert ok.status == 200 and "INVITE" in (ok.headers.get("Allow") or "")
    assert "timer" in (ok.headers.get("Supported") or "")
    answer(core, call_id="c1")
    assert statuses(core.receive(invite(method="OPTIONS", body="", branch="z9hG4bK-o2"), SOURCE, 0.1)) == [503]
    (full,) = responses(core.receive(invite(call_id="c2", branch="z9hG4bK-2"), SOURCE, 0.2))
    assert (full.status, full.headers.get("Retry-After")) == (503, "5")
    core.set_draining()
    handler.capacity = 10
    assert statuses(core.receive(invite(call_id="c3", branch="z9hG4bK-3"), SOURCE, 0.3)) == [503]


def test_capacity_error_from_open_leg_gives_503() -> None:
    class Refusing(CountingCallHandler):
        def open_leg(self, call: CallInfo, leg: LegInfo) -> CountingSink:
            raise CapacityError("engine full")

    ports = FakePorts()
    core = UasCore(SipSettings(), Refusing(), ports)
    assert statuses(core.receive(invite(), SOURCE, 0.0)) == [100, 503]
    assert ports.used == set()
    assert core.active_calls == 0


def test_reinvite_hold_codec_change_and_removed_stream() -> None:
    core = make_core()
    tag, _ = answer(core)
    core.receive(ack(to_tag=tag), SOURCE, 0.1)
    hold = invite(to_tag=tag, cseq=2, branch="z9hG4bK-r2", body=OFFER_PCMU.replace("sendrecv", "sendonly"))
    actions = core.receive(hold, SOURCE, 1.0)
    (update,) = [a for a in actions if isinstance(a, UpdateMedia)]
    assert update.on_hold
    ok = responses(actions)[-1]
    assert ok.status == 200 and b"a=recvonly" in ok.body and b" 2 IN IP4" in ok.body
    core.receive(ack(to_tag=tag, cseq=2, branch="z9hG4bK-a2"), SOURCE, 1.1)
    pcma = invite(to_tag=tag, cseq=3, branch="z9hG4bK-r3", body=OFFER_PCMA)
    actions = core.receive(pcma, SOURCE, 2.0)
    (update,) = [a for a in actions if isinstance(a, UpdateMedia)]
    assert (update.on_hold, update.payload_types, update.leg.codec) == (
        False,
        {8: "PCMA", 101: "telephone-event"},
        "PCMA",
    )
    assert any(isinstance(a, LegUpdated) for a in actions)
    core.receive(ack(to_tag=tag, cseq=3, branch="z9hG4bK-a3"), SOURCE, 2.1)
    stale = invite(to_tag=tag, cseq=3, branch="z9hG4bK-r4", body=OFFER_PCMA)
    assert statuses(core.receive(stale, SOURCE, 3.0)) == [500]
    two = OFFER_PCMU.replace("m=audio 40000", "m=audio 0") + "m=audio 40002 RTP/AVP 0\r\n"
    actions = core.receive(invite(to_tag=tag, cseq=5, branch="z9hG4bK-r5", body=two), SOURCE, 4.0)
    assert [type(a) for a in actions if not isinstance(a, SendMessage)] == [StopMedia, StartMedia]
    assert b"m=audio 0 RTP/AVP 0 8 101" in responses(actions)[-1].body


def test_session_timer_expiry_and_refresh() -> None:
    core = make_core()
    timer = "Supported: timer\r\nSession-Expires: 90;refresher=uac\r\n"
    tag, actions = answer(core, extra=timer)
    ok = responses(actions)[-1]
    assert (ok.headers.get("Session-Expires"), ok.headers.get("Require")) == ("90;refresher=uac", "timer")
    core.receive(ack(to_tag=tag), SOURCE, 0.1)
    update = invite(method="UPDATE", to_tag=tag, cseq=2, branch="z9hG4bK-u", body="", extra=timer)
    assert statuses(core.receive(update, SOURCE, 50.0)) == [200]
    assert requests(core.on_timer(61.0)) == []
    actions = core.on_timer(50.0 + 60.0)
    assert [r.method for r in requests(actions)] == ["BYE"]
    assert any(isinstance(a, CallEnded) and a.reason == "session-expired" for a in actions)


def test_acl_reject_and_drop() -> None:
    core = make_core(acl_cidrs=["192.168.0.0/16"])
    assert statuses(core.receive(invite(), SOURCE, 0.0)) == [403]
    dropping = make_core(acl_cidrs=["192.168.0.0/16"], acl_action="drop")
    assert dropping.receive(invite(), SOURCE, 0.0) == []
    assert make_core(acl_cidrs=["10.0.0.0/8"]).receive(invite(), SOURCE, 0.0)[-1].message.status == 200  # type: ignore[union-attr]


def test_invite_rate_limit_per_source() -> None:
    core = make_core(invite_rate_per_s=1.0, invite_burst=2)
    results = [
        statuses(core.receive(invite(call_id=f"c{i}", branch=f"z9hG4bK-{i}"), SOURCE, 0.0))[-1] for i in range(3)
    ]
    assert results == [200, 200, 503]
    other = Address("udp", "10.0.0.6", 5062)
    assert statuses(core.receive(invite(call_id="d", branch="z9hG4bK-d"), other, 0.0))[-1] == 200
    assert statuses(core.receive(invite(call_id="e", branch="z9hG4bK-e"), SOURCE, 1.5))[-1] == 200


def test_digest_auth() -> None:
    core = make_core(auth=AuthSettings(realm="hotline", users={"pbx": "secret"}))
    (challenge,) = responses(core.receive(invite(), SOURCE, 0.0))
    assert challenge.status == 401
    header = challenge.headers.get("WWW-Authenticate") or ""
    nonce = header.split('nonce="')[1].split('"')[0]

    def md5(text: str) -> str:
        return hashlib.md5(text.encode()).hexdigest()

    uri = "sip:4000@10.0.0.1"
    ha1, ha2 = md5("pbx:hotline:secret"), md5(f"INVITE:{uri}")
    digest = md5(f"{ha1}:{nonce}:00000001:abc:auth:{ha2}")
    auth = (
        f'Authorization: Digest username="pbx", realm="hotline", nonce="{nonce}", uri="{uri}", '
        f'response="{digest}", algorithm=MD5, qop=auth, nc=00000001, cnonce="abc"\r\n'
    )
    assert statuses(core.receive(invite(branch="z9hG4bK-2", cseq=2, extra=auth), SOURCE, 1.0))[-1] == 200
    wrong = auth.replace(digest, "0" * 32)
    assert statuses(core.receive(invite(call_id="x", branch="z9hG4bK-3", extra=wrong), SOURCE, 1.0)) == [401]
    assert statuses(core.receive(invite(call_id="y", branch="z9hG4bK-4", extra=auth), SOURCE, 400.0)) == [401]


def test_non_invite_retransmission_gets_cached_response_then_expires() -> None:
    core = make_core()
    options = invite(method="OPTIONS", body="")
    first = responses(core.receive(options, SOURCE, 0.0))
    again = responses(core.receive(options, SOURCE, 1.0))
    assert first == again
    core.on_timer(40.0)
    assert core.next_deadline() is None


def test_tables_name_event_role_and_state() -> None:
    tx = ServerTransaction.create(("b", "h", "OPTIONS"), parse(invite(method="OPTIONS", body="")), False, TimerConfig())  # type: ignore[arg-type]
    with pytest.raises(RemoteProtocolError, match="'ack' is illegal for the non-INVITE server in state Trying"):
        tx.ack(0.0)
    tx.send_response(Response(200, "OK"), 0.0)
    with pytest.raises(LocalProtocolError, match="'final' is illegal for the non-INVITE server in state Completed"):
        tx.send_response(Response(500, "Oops"), 0.0)
    assert tx.state is TxState.COMPLETED
    call = Call.__new__(Call)
    call.state = CallState.RINGING
    with pytest.raises(
        RemoteProtocolError, match="'bye received' is illegal for the UAS dialog in state Ringing"
    ) as info:
        call.handle(CallEvent.BYE_IN)
    assert info.value.status_hint == 481
    with pytest.raises(LocalProtocolError, match="'bye done' is illegal"):
        call.handle(CallEvent.BYE_DONE)


def test_tables_are_bounded_after_many_calls() -> None:
    core = make_core(max_calls=5)
    for i in range(50):
        tag, _ = answer(core, now=float(i), call_id=f"c{i}", branch=f"z9hG4bK-i{i}")
        core.receive(ack(to_tag=tag, call_id=f"c{i}", branch=f"z9hG4bK-a{i}"), SOURCE, i + 0.1)
        core.receive(
            invite(method="BYE", to_tag=tag, cseq=2, branch=f"z9hG4bK-b{i}", call_id=f"c{i}", body=""), SOURCE, i + 0.2
        )
    core.on_timer(1000.0)
    assert core.active_calls == 0
    assert len(core._server_tx) == 0 and len(core._client_tx) == 0


def test_siprec_metadata_update_changes_roles() -> None:
    from tests.test_sip_fuzz import SIPREC_BODY

    handler = CountingCallHandler()
    core = make_core(handler)
    siprec = "Require: siprec\r\n"
    tag, actions = answer(core, extra=siprec, body=SIPREC_BODY, content_type="multipart/mixed;boundary=fz")
    (start,) = [a for a in actions if isinstance(a, StartMedia)]
    assert (start.leg.label, start.leg.aor, start.leg.role, start.call.siprec) == ("1", "sip:a@b", "caller", True)
    ok = responses(actions)[-1]
    assert "+sip.srs" in (ok.headers.get("Contact") or "") and b"a=label:1" in ok.body
    core.receive(ack(to_tag=tag), SOURCE, 0.1)
    metadata = SIPREC_BODY.split("application/rs-metadata+xml\r\n\r\n")[1].split("\r\n--fz")[0]
    moved = metadata.replace("sip:a@b", "sip:agent7@pbx")
    update = invite(
        method="UPDATE",
        to_tag=tag,
        cseq=2,
        branch="z9hG4bK-u",
        body=moved,
        content_type="application/rs-metadata+xml",
        extra=siprec,
    )
    actions = core.receive(update, SOURCE, 1.0)
    assert statuses(actions) == [200]
    (updated,) = [a for a in actions if isinstance(a, LegUpdated)]
    assert (updated.leg.aor, updated.leg.leg_id) == ("sip:agent7@pbx", start.leg.leg_id)


def test_we_refresh_when_the_uac_does_not_support_timers() -> None:
    core = make_core()
    tag, actions = answer(core, extra="Session-Expires: 90\r\n")
    ok = responses(actions)[-1]
    assert (ok.headers.get("Session-Expires"), ok.headers.get("Require")) == ("90;refresher=uas", None)
    core.receive(ack(to_tag=tag), SOURCE, 0.1)
    (update,) = requests(core.on_timer(45.0))
    assert update.method == "UPDATE" and update.headers.get("Session-Expires") == "90;refresher=uas"
    assert core.receive(bytes(Response(200, "OK", update.headers)), SOURCE, 45.1) == []
    (second,) = requests(core.on_timer(90.1))
    actions = core.receive(bytes(Response(481, "Gone", second.headers)), SOURCE, 90.2)
    assert [r.method for r in requests(actions)] == ["BYE"]
    assert any(isinstance(a, CallEnded) and a.reason == "session-refresh-failed" for a in actions)


def drain_timers(core: UasCore, until: float) -> None:
    """Fire every timer due up to ``until`` seconds (retransmissions, Timer H/I/J)."""
    while (deadline := core.next_deadline()) is not None and deadline <= until:
        core.on_timer(deadline)


def test_handler_bug_is_a_500_with_a_logged_traceback(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(CountingCallHandler):
        def open_leg(self, call: CallInfo, leg: LegInfo) -> CountingSink:
            raise KeyError("a bug in the application")

    ports = FakePorts()
    core = UasCore(SipSettings(), Broken(), ports)
    with caplog.at_level("ERROR", logger="sip"):
        actions = core.receive(invite(), SOURCE, 0.0)
    assert statuses(actions) == [100, 500]
    assert not [a for a in actions if isinstance(a, StartMedia)]
    (record,) = [r for r in caplog.records if r.exc_info is not None]
    assert record.exc_info[0] is KeyError  # type: ignore[index]
    assert "Traceback" in caplog.text and "a bug in the application" in caplog.text
    assert core.counters["errors.internal"] == 1 and core.counters["invites.no_capacity"] == 0
    assert ports.used == set() and core.active_calls == 0
    drain_timers(core, 60.0)
    assert len(core._server_tx) == 0


def test_bug_in_a_request_handler_is_a_500_and_frees_the_transaction(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core()

    def broken(*args: object) -> object:
        raise RuntimeError("a bug in the core")

    monkeypatch.setattr(core, "_on_options", broken)
    with caplog.at_level("ERROR", logger="sip.uas"):
        (response,) = responses(core.receive(invite(method="OPTIONS", body=""), SOURCE, 0.0))
    assert response.status == 500 and "Traceback" in caplog.text and "a bug in the core" in caplog.text
    drain_timers(core, 60.0)
    assert len(core._server_tx) == 0


def test_siprec_metadata_in_an_unknown_encoding_gets_400_with_a_warning() -> None:
    from tests.test_sip_fuzz import SIPREC_BODY

    ports = FakePorts()
    core = UasCore(SipSettings(), CountingCallHandler(), ports)
    start = SIPREC_BODY.index("<recording")
    body = SIPREC_BODY[:start] + '<?xml version="1.0" encoding="x-no-such-codec"?>' + SIPREC_BODY[start:]
    data = invite(extra="Require: siprec\r\n", body=body, content_type="multipart/mixed;boundary=fz")
    (response,) = responses(core.receive(data, SOURCE, 0.0))
    assert response.status == 400
    assert "x-no-such-codec" in (response.headers.get("Warning") or "")
    assert (response.headers.get("Warning") or "").startswith('399 hotline-asr "')
    assert core.active_calls == 0 and ports.used == set()
    drain_timers(core, 60.0)
    assert len(core._server_tx) == 0


def test_ports_exhausted_is_a_503_not_a_500() -> None:
    core = UasCore(SipSettings(), CountingCallHandler(), FakePorts(count=0))
    (trying, busy) = responses(core.receive(invite(), SOURCE, 0.0))
    assert (trying.status, busy.status, busy.headers.get("Retry-After")) == (100, 503, "5")
    assert core.counters["errors.internal"] == 0


TWO_STREAMS = OFFER_PCMU + "m=audio 40002 RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"


class SecondLegFails(CountingCallHandler):
    """Opens a call's first leg and fails its second with ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def open_leg(self, call: CallInfo, leg: LegInfo) -> CountingPcmSink:
        if self.sinks:
            raise self.error
        return super().open_leg(call, leg)


@pytest.mark.parametrize(
    ("error", "status", "counter", "reason"),
    [
        (CapacityError("engine full"), 503, "invites.no_capacity", "capacity"),
        (KeyError("a bug in the application"), 500, "errors.internal", "error"),
    ],
)
def test_a_second_leg_that_fails_undoes_the_first(error: Exception, status: int, counter: str, reason: str) -> None:
    """The all-or-none opening every door shares (``calls.admit.open_legs``): the first leg's sink
    is finished, the call ended with the handler, every port released; full is 503, a bug 500."""
    handler = SecondLegFails(error)
    ports = FakePorts()
    core = UasCore(SipSettings(), handler, ports)
    actions = core.receive(invite(body=TWO_STREAMS), SOURCE, 0.0)
    assert statuses(actions) == [100, status] and not [a for a in actions if isinstance(a, StartMedia)]
    assert (responses(actions)[-1].headers.get("Retry-After") is not None) == (status == 503)
    (sink,) = handler.sinks.values()
    assert sink.finished == 1 and handler.open_legs == 0 and list(handler.ended.values()) == [reason]
    assert core.counters[counter] == 1 and ports.used == set() and core.active_calls == 0


def test_a_draining_node_answers_503_from_the_leg_opening() -> None:
    """A node that starts draining between the INVITE's checks and its answer (``answer_delay_ms``)."""
    counting = CountingCallHandler()
    registry = CallRegistry(counting, max_calls=10)
    ports = FakePorts()
    core = UasCore(SipSettings(answer_delay_ms=100), registry, ports)
    assert statuses(core.receive(invite(), SOURCE, 0.0)) == [100, 180]
    registry.set_draining()
    actions: list[Action] = []
    while (deadline := core.next_deadline()) is not None and deadline <= 0.2:
        actions += core.on_timer(deadline)
    (busy,) = responses(actions)
    assert (busy.status, busy.headers.get("Retry-After")) == (503, "5")
    assert core.counters["invites.no_capacity"] == 1 and ports.used == set() and counting.sinks == {}


def test_an_invite_no_route_takes_gets_the_routes_files_code() -> None:
    router = Router(RoutesFile(default_profile=None, reject_code=403))
    core = UasCore(SipSettings(), CountingCallHandler(), FakePorts(), router)
    assert statuses(core.receive(invite(), SOURCE, 0.0)) == [403]
    assert core.active_calls == 0 and core.counters["invites.no_capacity"] == 0


def test_a_refused_invite_is_logged_as_the_peer_was_told_and_thinned(caplog: pytest.LogCaptureFixture) -> None:
    """A refusal the peer can act on (488: no codec we take) is logged with its Warning and counted
    by status; a peer that keeps sending it is logged at the 1st, 10th, 100th ... refusal; a digest
    challenge (401) is routine and not logged."""
    core = make_core()
    gsm_only = OFFER_PCMU.replace("RTP/AVP 0 8 101", "RTP/AVP 3")
    with caplog.at_level(logging.INFO, logger="sip.uas"):
        for n in range(12):
            data = invite(call_id=f"gsm-{n}@10.0.0.5", branch=f"z9hG4bK-gsm{n}", body=gsm_only)
            assert statuses(core.receive(data, SOURCE, float(n)))[-1] == 488
    refused = [r.getMessage() for r in caplog.records if "refused 488" in r.getMessage()]
    assert len(refused) == 2, refused  # the 1st and the 10th
    assert f"INVITE from {SOURCE.host} refused 488" in refused[0] and "audio stream to record" in refused[0]
    assert refused[1].endswith("10 such from it so far")
    assert core.counters["invites.refused.488"] == 12

    caplog.clear()
    challenged = make_core(auth=AuthSettings(realm="hotline", users={"pbx": "secret"}))
    with caplog.at_level(logging.INFO, logger="sip.uas"):
        assert statuses(challenged.receive(invite(), SOURCE, 0.0))[-1] == 401
    assert not [r for r in caplog.records if "refused" in r.getMessage()]
    assert challenged.counters["invites.refused.401"] == 0
