"""A small, fast SIP UAC and RTP pacer for load tests, built on our own `sip.message`.

One UDP socket carries the SIP of every call; a few UDP sockets send their RTP, and each call's
SDP offer names the socket that will send its packets (so the receiver sees them come from the
SDP address). Per call: INVITE offering one codec of `rtp.codecs` (PCMU, PCMA, G.722 ...),
retransmitted after T1, 2·T1, 4·T1 ... until a response arrives (a provisional one stops the
retransmissions); a 2xx is ACKed (again for each retransmitted 2xx), a final non-2xx is ACKed
and counts as a setup failure, as does no final answer 64·T1 after the first INVITE. At the
end, BYE with T1-doubling retransmissions capped at T2, until a final response or 64·T1. BYEs
and OPTIONS from the server are answered 200. No CANCEL, authentication or TCP: a load
generator's job is to be fast and predictable, not complete.

`stream_rtp` paces one 20 ms packet per call per tick. All calls carry the same SSRC,
sequence numbers and timestamps (each goes to its own leg, and a receiver keys nothing on
them across legs), so a tick builds one packet and the per-packet cost is the `sendto`.
"""

from __future__ import annotations

import enum
import os
import select
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from rtp.codecs import codec as codec_named
from rtp.codecs import telephone_events
from sip.errors import SipParseError
from sip.header_values import NameAddr
from sip.message import Headers, Request, Response, parse
from sip.sdp import SessionDescription

PACKET_MS = 20
BENCH_SSRC = 0x5EED0001
_RTP_HEADER = struct.Struct("!BBHII")
_TIMEOUT_FACTOR = 64  # RFC 3261 timers B and F: 64·T1


class CallState(enum.Enum):
    CALLING = "calling"  # INVITE sent, no response yet: retransmitting
    PROCEEDING = "proceeding"  # provisional response seen: waiting for the final one
    UP = "up"  # 2xx received and ACKed
    FAILED = "failed"  # non-2xx final response or timer B
    HANGING_UP = "hanging-up"  # our BYE sent, retransmitting
    ENDED = "ended"  # our BYE answered (or timed out: see bye_failed)
    ENDED_BY_SERVER = "ended-by-server"  # the server sent BYE


@dataclass
class UacCall:
    """One call's dialog state; `media` is the RTP address of the server's SDP answer."""

    index: int
    call_id: str
    from_tag: str
    rtp_socket: int
    request_uri: str
    state: CallState = CallState.CALLING
    invite_branch: str = ""
    first_sent: float = 0.0
    answered_at: float | None = None
    to_tag: str | None = None
    remote_target: str | None = None
    media: tuple[str, int] | None = None
    failure: str | None = None
    bye_failed: bool = False
    packets_sent: int = 0
    # The request being retransmitted (INVITE or BYE), when it is next due, the current interval.
    pending: bytes = b""
    retransmit_at: float = 0.0
    interval: float = 0.0
    give_up_at: float = 0.0


@dataclass(frozen=True)
class UacConfig:
    """What the child process needs: where the server is, how many calls, how fast."""

    host: str
    server_port: int
    calls: int
    rate_per_s: float
    seconds: float
    codec: str
    rtp_sockets: int = 4
    t1_s: float = 0.5
    t2_s: float = 4.0


@dataclass
class StreamReport:
    packets_sent: int = 0
    send_errors: int = 0
    ticks_behind: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    end_time: float = 0.0  # time.monotonic() after the last packet (the clock is system-wide)

    def message(self) -> dict[str, Any]:
        """The "streamed" message to the parent process (what `media_load` reads)."""
        return {
            "event": "streamed",
            "packets_sent": self.packets_sent,
            "send_errors": self.send_errors,
            "sender_ticks_behind": self.ticks_behind,
            "sender_cpu_s": self.cpu_s,
            "send_wall_s": self.wall_s,
            "send_end_time": self.end_time,
        }


def tone_payloads(codec: str) -> list[bytes]:
    """One second of a 440 Hz tone as 50 packet payloads of `codec` (`rtp.codecs`, at its
    sample rate), reused in a loop."""
    sent = codec_named(codec)
    if sent.make_encoder is None:
        raise ValueError(f"codec {sent.name} carries no audio to send")
    rate = sent.sample_rate
    tone = (np.sin(2 * np.pi * 440 * np.arange(rate) / rate) * 8000).astype(np.int16)
    encoder = sent.make_encoder()
    step = rate * PACKET_MS // 1000
    return [encoder.encode(tone[i : i + step]) for i in range(0, rate, step)]


def paced_ticks(seconds: float, report: StreamReport) -> Iterator[int]:
    """The tick numbers of `seconds` of 20 ms packets, each yielded when its time comes.

    A tick that starts more than one period late counts in `report.ticks_behind` and is
    yielded anyway. Once the last tick's packets are sent, `report` gets the CPU and wall
    seconds spent and the end time.
    """
    cpu_start, start = time.process_time(), time.monotonic()
    for tick in range(round(seconds * 1000 / PACKET_MS)):
        delay = start + tick * PACKET_MS / 1000 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -PACKET_MS / 1000:
            report.ticks_behind += 1
        yield tick
    report.cpu_s = time.process_time() - cpu_start
    report.end_time = time.monotonic()
    report.wall_s = report.end_time - start


def stream_rtp(
    targets: list[tuple[socket.socket, tuple[str, int]]],
    seconds: float,
    codec: str,
    *,
    active: list[bool] | None = None,
    sent: list[int] | None = None,
    on_tick: Callable[[], None] | None = None,
    protectors: list[Callable[[bytes], bytes]] | None = None,
) -> StreamReport:
    """Send one 20 ms packet to every target per tick for `seconds`, pacing by the clock.

    targets: (socket to send from, destination). A target whose `active` entry
    turns False (its call ended) is skipped; `sent` counts packets per target. `on_tick`
    runs after each tick's packets (the UAC answers SIP there). A tick that starts more than
    one period late counts in `ticks_behind`; it is sent anyway, so nothing is skipped.
    `protectors` (one per target) turn each packet into SRTP before it is sent.
    """
    payload_type = codec_named(codec).payload_type
    packet_ticks = codec_named(codec).clock_rate * PACKET_MS // 1000
    payloads = tone_payloads(codec)
    sends = [(sender.sendto, address) for sender, address in targets]
    report = StreamReport()
    for tick in paced_ticks(seconds, report):
        header = _RTP_HEADER.pack(0x80, payload_type, tick & 0xFFFF, (tick * packet_ticks) & 0xFFFFFFFF, BENCH_SSRC)
        packet = header + payloads[tick % len(payloads)]
        for index, (sendto, address) in enumerate(sends):
            if active is not None and not active[index]:
                continue
            try:
                sendto(packet if protectors is None else protectors[index](packet), address)
            except OSError:
                report.send_errors += 1
                continue
            report.packets_sent += 1
            if sent is not None:
                sent[index] += 1
        if on_tick is not None:
            on_tick()
    return report


class BenchUac:
    """The SIP side of the load generator: place calls at a rate, keep them, hang them up."""

    def __init__(self, config: UacConfig) -> None:
        self.config = config
        self.server = (config.host, config.server_port)
        self.sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sip.bind((config.host, 0))
        self.sip.setblocking(False)
        self.sip.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.local_port = int(self.sip.getsockname()[1])
        self.rtp = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(config.rtp_sockets)]
        for sender in self.rtp:
            sender.bind((config.host, 0))
        self.calls: list[UacCall] = []
        self._by_call_id: dict[str, UacCall] = {}
        self._retransmitting: dict[int, UacCall] = {}
        self.ended_by_server: list[UacCall] = []
        self._prefix = f"bench-{os.getpid()}-{os.urandom(3).hex()}"
        self.counters: Counter[str] = Counter()

    # ---- call setup --------------------------------------------------------------------

    def place_calls(self) -> None:
        """INVITE `calls` calls at `rate_per_s`; returns when every call is up or has failed.

        While it waits it answers the server and retransmits (see `poll`)."""
        config = self.config
        start = time.monotonic()
        for index in range(config.calls):
            self._wait_until(start + index / config.rate_per_s)
            self._invite(index)
            self.poll(0)
        while any(call.state in (CallState.CALLING, CallState.PROCEEDING) for call in self.calls):
            self.poll(self._until_next_timer())

    def _invite(self, index: int) -> None:
        config = self.config
        host = config.host
        call = UacCall(
            index=index,
            call_id=f"{self._prefix}-{index}@{host}",
            from_tag=os.urandom(4).hex(),
            rtp_socket=index % len(self.rtp),
            request_uri=f"sip:bench@{host}:{config.server_port}",
            invite_branch=self._branch(),
        )
        rtp_port = self.rtp[call.rtp_socket].getsockname()[1]
        sent = codec_named(config.codec)
        events = telephone_events(sent)
        pt, event_pt = sent.payload_type, events.payload_type
        offer = (
            f"v=0\r\no=bench {index} 1 IN IP4 {host}\r\ns=bench\r\nc=IN IP4 {host}\r\nt=0 0\r\n"
            f"m=audio {rtp_port} RTP/AVP {pt} {event_pt}\r\n"
            f"a=rtpmap:{pt} {sent.rtpmap}\r\na=rtpmap:{event_pt} {events.rtpmap}\r\na=sendrecv\r\n"
        ).encode()
        headers = self._dialog_headers(call, call.invite_branch, "1 INVITE", to_tag=None)
        headers.add("Contact", f"<sip:bench@{host}:{self.local_port}>")
        headers.add("Content-Type", "application/sdp")
        call.first_sent = time.monotonic()
        self.calls.append(call)
        self._by_call_id[call.call_id] = call
        self._start_retransmitting(call, bytes(Request("INVITE", call.request_uri, headers, offer)))

    # ---- hang-up -----------------------------------------------------------------------

    def hang_up_all(self) -> None:
        """BYE every call that is up, at `rate_per_s` like the INVITEs (a burst of BYEs would
        only measure the retransmissions it causes); returns when each is answered or timed out."""
        start = time.monotonic()
        for sent, call in enumerate([call for call in self.calls if call.state is CallState.UP]):
            self._wait_until(start + sent / self.config.rate_per_s)
            if call.state is CallState.UP:
                self._bye(call)
            self.poll(0)
        while self._retransmitting:
            self.poll(self._until_next_timer())

    def _bye(self, call: UacCall) -> None:
        call.state = CallState.HANGING_UP
        headers = self._dialog_headers(call, self._branch(), "2 BYE", to_tag=call.to_tag)
        uri = call.remote_target or call.request_uri
        self._start_retransmitting(call, bytes(Request("BYE", uri, headers)))

    # ---- the socket --------------------------------------------------------------------

    def _wait_until(self, due: float) -> None:
        """Serve the socket until time.monotonic() reaches `due`."""
        while (wait := due - time.monotonic()) > 0:
            self.poll(wait)

    def poll(self, timeout: float) -> None:
        """Handle every datagram waiting (up to `timeout` s for the first), then retransmit what is due."""
        readable, _, _ = select.select([self.sip], [], [], max(0.0, timeout))
        while readable:
            try:
                data, source = self.sip.recvfrom(65536)
            except BlockingIOError:
                break
            try:
                message = parse(data)
            except SipParseError:
                self.counters["unparsable"] += 1
                continue
            if isinstance(message, Response):
                self._on_response(message)
            else:
                self._on_request(message, source)
        self._retransmit(time.monotonic())

    def _on_response(self, response: Response) -> None:
        call = self._by_call_id.get(response.headers.get("Call-ID") or "")
        if call is None:
            self.counters["stray_responses"] += 1
            return
        method = (response.headers.get("CSeq") or "").partition(" ")[2].strip()
        status = response.status
        if method == "INVITE":
            self._on_invite_response(call, response)
        elif method == "BYE" and status >= 200 and call.state is CallState.HANGING_UP:
            call.state = CallState.ENDED
            self._retransmitting.pop(call.index, None)
            if status not in (200, 481):
                call.bye_failed = True
                self.counters[f"bye_responses.{status}"] += 1

    def _on_invite_response(self, call: UacCall, response: Response) -> None:
        """Provisional: stop retransmitting (timer B still runs). Final non-2xx: ACK, failed.
        2xx: ACK (again for a retransmitted one); a 2xx we cannot use, or one that comes after
        timer B, is ACKed and its dialog ended with BYE (the call stays a setup failure)."""
        status = response.status
        waiting = call.state in (CallState.CALLING, CallState.PROCEEDING)
        if status < 200:
            if call.state is CallState.CALLING:
                call.state = CallState.PROCEEDING
            return
        to_tag = NameAddr.parse(response.headers.get("To") or "").tag
        if status >= 300:
            self._ack_failure(call, response)
            if waiting:
                self._retransmitting.pop(call.index, None)
                call.state, call.failure = CallState.FAILED, str(status)
            return
        if call.to_tag is not None:
            if to_tag == call.to_tag and call.state is CallState.UP:
                self._ack_success(call)
            return
        self._retransmitting.pop(call.index, None)
        contacts = response.headers.get_all("Contact")
        call.to_tag = to_tag
        call.remote_target = NameAddr.parse(contacts[0]).uri if contacts else call.request_uri
        self._ack_success(call)
        if not waiting:
            self._bye(call)
            return
        call.media = _answer_address(response.body)
        call.answered_at = time.monotonic()
        if call.media is None:
            call.failure = "no-media-in-answer"
            self._bye(call)
        else:
            call.state = CallState.UP

    def _ack_success(self, call: UacCall) -> None:
        """ACK of a 2xx: its own transaction (new branch), sent to the remote target."""
        headers = self._dialog_headers(call, self._branch(), "1 ACK", to_tag=call.to_tag)
        self.sip.sendto(bytes(Request("ACK", call.remote_target or call.request_uri, headers)), self.server)

    def _ack_failure(self, call: UacCall, response: Response) -> None:
        """ACK of a non-2xx final response: part of the INVITE transaction (same branch and URI)."""
        to_tag = NameAddr.parse(response.headers.get("To") or "").tag
        headers = self._dialog_headers(call, call.invite_branch, "1 ACK", to_tag=to_tag)
        self.sip.sendto(bytes(Request("ACK", call.request_uri, headers)), self.server)

    def _on_request(self, request: Request, source: tuple[str, int]) -> None:
        headers = Headers()
        for via in request.headers.get_all("Via"):
            headers.add("Via", via)
        for name in ("From", "To", "Call-ID", "CSeq"):
            headers.add(name, request.headers.get(name) or "")
        call = self._by_call_id.get(request.headers.get("Call-ID") or "")
        status = 200
        if request.method == "BYE":
            if call is None:
                status = 481
            elif call.state is not CallState.ENDED_BY_SERVER:
                self._retransmitting.pop(call.index, None)
                call.state = CallState.ENDED_BY_SERVER
                self.ended_by_server.append(call)
        if request.method != "ACK":
            self.counters[f"server_requests.{request.method}"] += 1
            reason = "OK" if status == 200 else "Call/Transaction Does Not Exist"
            self.sip.sendto(bytes(Response(status, reason, headers)), source)

    # ---- retransmissions ---------------------------------------------------------------

    def _start_retransmitting(self, call: UacCall, data: bytes) -> None:
        now = time.monotonic()
        t1 = self.config.t1_s
        call.pending = data
        call.interval = t1
        call.retransmit_at = now + t1
        call.give_up_at = now + _TIMEOUT_FACTOR * t1
        self._retransmitting[call.index] = call
        self.sip.sendto(data, self.server)

    def _until_next_timer(self, longest: float = 0.05) -> float:
        """Seconds until the next retransmission or give-up is due (at most `longest`)."""
        due = min(
            (min(call.retransmit_at, call.give_up_at) for call in self._retransmitting.values()),
            default=time.monotonic() + longest,
        )
        return min(longest, due - time.monotonic())

    def _retransmit(self, now: float) -> None:
        for call in list(self._retransmitting.values()):
            if now >= call.give_up_at:
                del self._retransmitting[call.index]
                if call.state is CallState.HANGING_UP:
                    call.state, call.bye_failed = CallState.ENDED, True
                else:
                    call.state, call.failure = CallState.FAILED, "timeout"
            elif now >= call.retransmit_at and call.state is not CallState.PROCEEDING:
                self.counters["retransmissions." + call.pending.split(b" ", 1)[0].decode()] += 1
                self.sip.sendto(call.pending, self.server)
                cap = self.config.t2_s if call.state is CallState.HANGING_UP else None
                call.interval = call.interval * 2 if cap is None else min(call.interval * 2, cap)
                call.retransmit_at = now + call.interval

    # ---- helpers -----------------------------------------------------------------------

    def _dialog_headers(self, call: UacCall, branch: str, cseq: str, to_tag: str | None) -> Headers:
        host = self.config.host
        headers = Headers()
        headers.add("Via", f"SIP/2.0/UDP {host}:{self.local_port};branch={branch};rport")
        headers.add("Max-Forwards", "70")
        headers.add("From", f"<sip:load@{host}>;tag={call.from_tag}")
        headers.add("To", f"<{call.request_uri}>" + (f";tag={to_tag}" if to_tag else ""))
        headers.add("Call-ID", call.call_id)
        headers.add("CSeq", cseq)
        return headers

    def _branch(self) -> str:
        return "z9hG4bK" + os.urandom(6).hex()

    def close(self) -> None:
        self.sip.close()
        for sender in self.rtp:
            sender.close()


def _answer_address(body: bytes) -> tuple[str, int] | None:
    """The first audio stream's (address, port) in an SDP answer; None without one."""
    try:
        answer = SessionDescription.parse(body)
    except SipParseError:
        return None
    for media in answer.media:
        address = media.connection or answer.connection
        if media.media == "audio" and media.port and address:
            return address, media.port
    return None


def run_uac(conn: Connection, config: UacConfig) -> None:
    """Child process: set up the calls, stream when told, hang up when told; reports on `conn`.

    Messages to the parent: {"event": "up", ...} after setup, {"event": "streamed", ...}
    after the last packet, {"event": "done", ...} after the BYEs. From the parent: "stream",
    then "hangup".
    """
    uac = BenchUac(config)
    setup_start = time.monotonic()
    uac.place_calls()
    up = [call for call in uac.calls if call.state is CallState.UP and call.media is not None]
    uac.ended_by_server.clear()  # those ended during setup are not in `up`
    latencies = sorted((call.answered_at or 0.0) - call.first_sent for call in up)
    conn.send(
        {
            "event": "up",
            "calls_up": len(up),
            "setup_failures": len(uac.calls) - len(up),
            "failure_reasons": dict(
                Counter(call.failure or call.state.value for call in uac.calls if call.state is not CallState.UP)
            ),
            "setup_wall_s": time.monotonic() - setup_start,
            "setup_ms_p50": _percentile_ms(latencies, 0.5),
            "setup_ms_max": _percentile_ms(latencies, 1.0),
        }
    )
    if conn.recv() != "stream":
        return
    targets = [(uac.rtp[call.rtp_socket], call.media) for call in up if call.media is not None]
    position = {call.index: n for n, call in enumerate(up)}
    active = [True] * len(up)

    def answer_sip() -> None:
        """Between ticks: answer the server (a BYE stops that call's packets)."""
        uac.poll(0)
        while uac.ended_by_server:
            active[position[uac.ended_by_server.pop().index]] = False

    sent = [0] * len(up)
    report = stream_rtp(targets, config.seconds, config.codec, active=active, sent=sent, on_tick=answer_sip)
    conn.send(
        report.message()
        | {
            "sent_by_call": {call.call_id: count for call, count in zip(up, sent, strict=True)},
            "ended_by_server": [call.call_id for call in up if not active[position[call.index]]],
        }
    )
    if conn.recv() != "hangup":
        return
    uac.hang_up_all()
    conn.send(
        {
            "event": "done",
            "bye_failures": sum(1 for call in uac.calls if call.bye_failed),
            "counters": dict(uac.counters),
        }
    )
    uac.close()


def _percentile_ms(sorted_seconds: list[float], q: float) -> float | None:
    if not sorted_seconds:
        return None
    return round(sorted_seconds[min(len(sorted_seconds) - 1, int(q * len(sorted_seconds)))] * 1000, 2)
