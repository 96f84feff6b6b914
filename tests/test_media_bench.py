"""`asr-bench media`: real SIP call setup through SipServer, RTP to the legs, one JSON object;
and the load generator's UAC against a scripted peer that loses and ignores requests."""

from __future__ import annotations

import socket
import sys
import threading
import timeit
from collections import Counter
from typing import Any

import pytest

from deploy.bench import media_load
from deploy.bench.sip_uac import BenchUac, CallState, UacConfig
from sip.message import Headers, Request, Response, parse
from tests.bench_json import run_bench_module

pytestmark = pytest.mark.timeout(60)

FIELDS = {
    "calls",
    "pps",
    "packets_sent",
    "packets_received",
    "lost",
    "late",
    "server_cpu_us_per_packet",
    "setup_failures",
    "max_calls_held",
}


def run_bench(*args: str) -> dict[str, Any]:
    return run_bench_module("deploy.bench.media_load", *args, timeout=50)


def test_five_calls_through_sip() -> None:
    report = run_bench("--calls", "5", "--seconds", "2")
    assert report.keys() >= FIELDS
    assert report["mode"] == "sip"
    assert (report["calls"], report["calls_up"], report["setup_failures"], report["bye_failures"]) == (5, 5, 0, 0)
    assert report["packets_sent"] == 5 * 100
    assert report["packets_received"] == report["packets_sent"]
    assert report["lost"] == report["late"] == 0
    assert report["max_calls_held"] == 5
    # The generator sends from the address its SDP offer names: no leg saw a foreign packet.
    assert report["foreign_packets"] == 0
    assert isinstance(report["server_cpu_us_per_packet"], float) and report["server_cpu_us_per_packet"] > 0
    assert report["samples_out"] >= 0.9 * 5 * 2 * 16000  # less what the resampler still holds


def test_srtp_compare_runs_plain_then_srtp_legs() -> None:
    report = run_bench("--calls", "3", "--seconds", "1", "--srtp-compare")
    srtp = report["srtp"]
    assert report["mode"] == srtp["mode"] == "no-sip"
    assert report["packets_received"] == srtp["packets_received"] == 3 * 50
    assert srtp["srtp_auth_failed"] == srtp["lost"] == 0 and srtp["receive_path"] == report["receive_path"]
    assert srtp["samples_out"] >= 0.8 * report["samples_out"] > 0
    assert isinstance(report["srtp_extra_us_per_packet"], float)


def test_calls_beyond_the_server_limit_count_as_setup_failures() -> None:
    report = run_bench("--calls", "4", "--server-max-calls", "2", "--seconds", "1", "--compare-no-sip")
    assert (report["calls_up"], report["setup_failures"], report["max_calls_held"]) == (2, 2, 2)
    assert report["setup_failure_reasons"] == {"503": 2}
    assert report["packets_sent"] == report["packets_received"] == 2 * 50
    direct = report["no_sip"]
    assert isinstance(direct, dict)
    assert (direct["mode"], direct["calls_up"], direct["packets_received"]) == ("no-sip", 4, 4 * 50)
    assert isinstance(report["server_cpu_ratio_to_no_sip"], float)


class ScriptedPeer(threading.Thread):
    """A UAS that drops the first INVITE and the first BYE of every call and never answers
    calls whose Call-ID ends in "-1"; records the request methods it was sent."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.seen: Counter[tuple[str, str]] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                data, source = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            request = parse(data)
            assert isinstance(request, Request)
            call_id = request.headers.get("Call-ID") or ""
            self.seen[(call_id, request.method)] += 1
            if call_id.split("@")[0].endswith("-1") or request.method == "ACK":
                continue
            if self.seen[(call_id, request.method)] == 1:
                continue
            self._answer(request, source)

    def _answer(self, request: Request, source: tuple[str, int]) -> None:
        headers = Headers()
        for name in ("Via", "From", "Call-ID", "CSeq"):
            headers.add(name, request.headers.get(name) or "")
        to = request.headers.get("To") or ""
        headers.add("To", to if ";tag=" in to else to + ";tag=peer")
        body = b""
        if request.method == "INVITE":
            self.sock.sendto(bytes(Response(100, "Trying", headers)), source)
            headers.add("Contact", f"<sip:peer@127.0.0.1:{self.port}>")
            headers.add("Content-Type", "application/sdp")
            body = (
                b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0\r\n"
            )
        self.sock.sendto(bytes(Response(200, "OK", headers, body)), source)


def test_uac_retransmits_and_times_out() -> None:
    peer = ScriptedPeer()
    peer.start()
    uac = BenchUac(UacConfig("127.0.0.1", peer.port, calls=2, rate_per_s=100, seconds=0, codec="PCMU", t1_s=0.02))
    try:
        uac.place_calls()
        answered, ignored = uac.calls
        assert answered.state is CallState.UP and answered.media == ("127.0.0.1", 40000)
        assert (ignored.state, ignored.failure) == (CallState.FAILED, "timeout")
        # Timer A doubles from T1 until timer B (64·T1): sends at 0, 1, 3, 7, 15, 31, 63 T1 (the
        # last one is 1 T1 before timer B, so a late wake-up on a busy machine may skip it).
        ignored_invites = peer.seen[(ignored.call_id, "INVITE")]
        assert 6 <= ignored_invites <= 7
        assert peer.seen[(answered.call_id, "INVITE")] == 2
        uac.hang_up_all()
        assert answered.state is CallState.ENDED and not answered.bye_failed
        assert peer.seen[(answered.call_id, "BYE")] == 2
        assert peer.seen[(answered.call_id, "ACK")] >= 1
        assert uac.counters["retransmissions.INVITE"] == (ignored_invites - 1) + 1
        assert uac.counters["retransmissions.BYE"] == 1
    finally:
        peer.stop.set()
        peer.join()
        uac.close()
        peer.sock.close()


def test_parser_bench_runs_without_aiortc_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiortc.rtp", None)  # import fails as when not installed
    monkeypatch.setattr(timeit, "repeat", lambda *args, **kwargs: [0.1])
    report = media_load._parser_bench()
    assert report["aiortc_us_per_packet"].startswith("aiortc not installed")
    assert report["ours_us_per_packet"] == 1.0
