"""One call leg's RTP receiver: UDP sockets (RTP on an even port, RTCP on the next) feeding
parse -> reorder buffer -> G.711 decode -> 8->16 kHz resample -> sink.

All protocol work is in the sans-IO modules (`packet`, `jitter`, `g711`, `resample`); this
module adds the asyncio transports, source latching, RFC 3550 jitter, and the inactivity timer.
Malformed packets are counted in `stats.bad_packets` and dropped; nothing a peer sends can
raise out of the datagram handlers.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rtp.g711 import DECODE_TABLES
from rtp.jitter import Frame, FrameKind, LossFill, PacketKind, ReorderBuffer
from rtp.packet import RTP_HEADER_LENGTH, RtpPacket, is_rtcp, parse_rtcp
from rtp.resample import Upsampler
from rtp.seq import timestamp_diff
from rtp.sink import PcmSink
from rtp.stats import LegStats

CLOCK_RATE_HZ = 8000
END_RTP_TIMEOUT = "rtp-timeout"
END_RTCP_BYE = "rtcp-bye"

Address = tuple[Any, ...]

_RTP_HEADER = struct.Struct("!BBHII")
_PLAIN_RTP_FIRST_BYTE = 0x80


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, handler: Callable[[bytes, Address], None]) -> None:
        self.datagram_received = handler  # type: ignore[method-assign, assignment]

    def error_received(self, exc: Exception) -> None:
        """ICMP errors (port unreachable from a peer's earlier packets) do not concern a receiver."""


class RtpLeg:
    """Receives one RTP stream and hands 16 kHz int16 PCM to `sink`.

    payload_types maps RTP payload type numbers to encoding names from the SDP answer, e.g.
    {0: "PCMU", 8: "PCMA", 101: "telephone-event", 13: "CN"}; names are case-insensitive.
    Decoded audio is resampled and handed to the sink in batches of `resample_batch_ms`
    (default 40 ms = 2 packets; 0 = every packet): this adds ~10 ms on average to the
    resampler's own block lag (see `rtp.resample`) and halves its CPU per packet. A batch
    left incomplete when packets stop is delivered with the next packet or at `close()`.
    on_end(reason) is called at most once: "rtp-timeout" after `inactivity_timeout_s` without
    packets (not counted while on hold), or "rtcp-bye". The owner still calls `close()`.
    """

    def __init__(
        self,
        *,
        sink: PcmSink,
        payload_types: dict[int, str],
        reorder_ms: int = 60,
        inactivity_timeout_s: float = 30.0,
        on_end: Callable[[str], None] | None = None,
        loss_fill: LossFill = LossFill.REPEAT_SINGLE,
        max_gap_fill_ms: int = 1000,
        low_latency_resampler: bool = False,
        resample_batch_ms: int = 40,
    ) -> None:
        self.stats = LegStats()
        self._sink = sink
        self._on_end = on_end
        self._timeout_s = inactivity_timeout_s
        self._buffer = ReorderBuffer(
            reorder_ms=reorder_ms, clock_rate=CLOCK_RATE_HZ, loss_fill=loss_fill,
            max_gap_fill_ms=max_gap_fill_ms, stats=self.stats,
        )
        self._upsampler = Upsampler(low_latency=low_latency_resampler)
        self._batch_samples = resample_batch_ms * CLOCK_RATE_HZ // 1000
        self._pending: list[np.ndarray] = []
        self._pending_samples = 0
        self._kinds: dict[int, PacketKind] = {}
        self._codecs: dict[int, str] = {}
        self._telephone_events: set[int] = set()
        self.set_payload_types(payload_types)
        self._remote: Address | None = None
        self._rtp_transport: asyncio.DatagramTransport | None = None
        self._rtcp_transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_seen = time.monotonic()
        self._on_hold = False
        self._ended = False
        self._closed = False
        self._jitter_ticks = 0.0
        self._jitter_arrival = 0.0
        self._jitter_timestamp: int | None = None
        self._jitter_ssrc = -1

    @property
    def local_port(self) -> int | None:
        if self._rtp_transport is None:
            return None
        port: int = self._rtp_transport.get_extra_info("sockname")[1]
        return port

    @property
    def remote(self) -> Address | None:
        """The latched RTP source address, None until the first valid packet."""
        return self._remote

    async def open(self, host: str, port: int) -> None:
        """Bind RTP on (host, port) and RTCP on port + 1; OSError if either is taken."""
        loop = asyncio.get_running_loop()
        self._rtp_transport, _ = await loop.create_datagram_endpoint(
            lambda: _Datagrams(self.handle_rtp), local_addr=(host, port)
        )
        rtp_port = self._rtp_transport.get_extra_info("sockname")[1]
        try:
            self._rtcp_transport, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self.handle_rtcp), local_addr=(host, rtp_port + 1)
            )
        except OSError:
            self._rtp_transport.close()
            self._rtp_transport = None
            raise
        self._last_seen = time.monotonic()
        self._timer = loop.call_later(self._timeout_s, self._check_inactivity)

    def set_payload_types(self, payload_types: dict[int, str]) -> None:
        """Apply a new SDP answer's payload type map (re-INVITE); unknown names are skipped."""
        kinds: dict[int, PacketKind] = {}
        codecs: dict[int, str] = {}
        events: set[int] = set()
        for number, name in payload_types.items():
            encoding = name.upper()
            if encoding in DECODE_TABLES:
                kinds[number] = PacketKind.AUDIO
                codecs[number] = encoding
            elif encoding == "CN":
                kinds[number] = PacketKind.COMFORT_NOISE
            elif encoding == "TELEPHONE-EVENT":
                events.add(number)
        self._kinds, self._codecs, self._telephone_events = kinds, codecs, events

    def set_hold(self, on_hold: bool) -> None:
        """inactive/sendonly media suspends the inactivity timeout; resuming restarts it."""
        self._on_hold = on_hold
        self._last_seen = time.monotonic()

    def handle_rtp(self, data: bytes, addr: Address) -> None:
        """Datagram handler of the RTP socket (public for tests and fuzzing)."""
        if self._closed:
            return
        if is_rtcp(data):
            self.handle_rtcp(data, addr)
            return
        remote = self._remote
        if remote is not None and addr != remote:
            self.stats.foreign_packets += 1
            return
        if len(data) >= RTP_HEADER_LENGTH and data[0] == _PLAIN_RTP_FIRST_BYTE:
            # Fast path (no padding, extension or CSRC): one unpack, no packet object.
            _, second, sequence_number, timestamp, ssrc = _RTP_HEADER.unpack_from(data)
            payload_type = second & 0x7F
            payload = data[RTP_HEADER_LENGTH:]
        else:
            try:
                packet = RtpPacket.parse(data)
            except ValueError:
                self.stats.bad_packets += 1
                return
            payload_type, sequence_number = packet.payload_type, packet.sequence_number
            timestamp, ssrc, payload = packet.timestamp, packet.ssrc, packet.payload
        if remote is None:
            self._remote = addr
        now = time.monotonic()
        stats = self.stats
        stats.packets += 1
        stats.bytes += len(data)
        if stats.first_packet_time is None:
            stats.first_packet_time = now
        stats.last_packet_time = now
        self._last_seen = now

        kind = self._kinds.get(payload_type)
        if kind is None:
            kind = PacketKind.SKIP
            if payload_type in self._telephone_events:
                stats.telephone_event_packets += 1
            else:
                stats.unknown_payload_packets += 1
        elif kind is PacketKind.AUDIO:
            self._update_jitter(now, timestamp, ssrc)
        else:
            stats.comfort_noise_packets += 1
        frames = self._buffer.push(sequence_number, timestamp, ssrc, payload_type, payload, kind)
        if frames:
            self._deliver(frames)

    def handle_rtcp(self, data: bytes, addr: Address) -> None:
        """Datagram handler of the RTCP socket: counts packets and ends the leg on BYE."""
        if self._closed:
            return
        remote = self._remote
        if remote is not None and addr[0] != remote[0]:
            self.stats.foreign_packets += 1
            return
        try:
            packets = parse_rtcp(data)
        except ValueError:
            self.stats.bad_packets += 1
            return
        self.stats.rtcp_packets += 1
        ssrc = self._buffer.ssrc
        for packet in packets:
            if packet.is_bye:
                sources = packet.bye_sources
                if ssrc is None or not sources or ssrc in sources:
                    self._end(END_RTCP_BYE)

    async def close(self) -> LegStats:
        """Play out what is buffered, flush the resampler, finish the sink, release the ports."""
        if self._closed:
            return self.stats
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deliver(self._buffer.flush())
        self._resample_pending()
        tail = self._upsampler.flush()
        if len(tail):
            self.stats.samples_out += len(tail)
            self._sink.accept_waveform(tail)
        self._sink.input_finished()
        for transport in (self._rtp_transport, self._rtcp_transport):
            if transport is not None:
                transport.close()
        self._rtp_transport = self._rtcp_transport = None
        return self.stats

    def _update_jitter(self, now: float, timestamp: int, ssrc: int) -> None:
        """RFC 3550 section 6.4.1: J += (|D| - J) / 16, D in timestamp ticks."""
        previous = self._jitter_timestamp
        if previous is not None and ssrc == self._jitter_ssrc:
            transit_change = (now - self._jitter_arrival) * CLOCK_RATE_HZ - timestamp_diff(timestamp, previous)
            self._jitter_ticks += (abs(transit_change) - self._jitter_ticks) / 16
            self.stats.jitter_ms = self._jitter_ticks * 1000 / CLOCK_RATE_HZ
        self._jitter_ssrc = ssrc
        self._jitter_arrival = now
        self._jitter_timestamp = timestamp

    def _deliver(self, frames: list[Frame]) -> None:
        """Decode the frames (one table lookup per run of same-codec audio), resample, sink."""
        codec = self._codecs.get(frames[0].payload_type) if len(frames) == 1 else None
        if codec is not None and frames[0].kind is FrameKind.AUDIO:
            pcm = DECODE_TABLES[codec][np.frombuffer(frames[0].payload, dtype=np.uint8)]
        else:
            pcm = self._decode_frames(frames)
        if not len(pcm):
            return
        self._pending.append(pcm)
        self._pending_samples += len(pcm)
        if self._pending_samples >= self._batch_samples:
            self._resample_pending()

    def _resample_pending(self) -> None:
        """One resampler call and one sink call per batch: soxr costs ~5 us per call of any
        size up to 80 ms, so 40 ms batches halve it per packet."""
        pending = self._pending
        if not pending:
            return
        pcm = pending[0] if len(pending) == 1 else np.concatenate(pending)
        self._pending = []
        self._pending_samples = 0
        out = self._upsampler.process(pcm)
        if len(out):
            self.stats.samples_out += len(out)
            self._sink.accept_waveform(out)

    def _decode_frames(self, frames: list[Frame]) -> np.ndarray:
        pieces: list[np.ndarray] = []
        run: list[bytes] = []
        run_codec: str | None = None
        for frame in frames:
            codec = self._codecs.get(frame.payload_type) if frame.kind is not FrameKind.SILENCE else None
            if codec is not None and codec == run_codec:
                run.append(frame.payload)
                continue
            if run_codec is not None:
                pieces.append(DECODE_TABLES[run_codec][np.frombuffer(b"".join(run), dtype=np.uint8)])
            if codec is None:
                pieces.append(np.zeros(frame.samples, dtype=np.int16))
                run, run_codec = [], None
            else:
                run, run_codec = [frame.payload], codec
        if run_codec is not None:
            pieces.append(DECODE_TABLES[run_codec][np.frombuffer(b"".join(run), dtype=np.uint8)])
        if not pieces:
            return np.zeros(0, dtype=np.int16)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _check_inactivity(self) -> None:
        """Runs once per timeout period (not per packet): re-arms for the remaining time."""
        self._timer = None
        if self._closed or self._ended:
            return
        idle = time.monotonic() - self._last_seen
        if not self._on_hold and idle >= self._timeout_s:
            self._end(END_RTP_TIMEOUT)
            return
        remaining = self._timeout_s if self._on_hold else self._timeout_s - idle
        self._timer = asyncio.get_running_loop().call_later(remaining, self._check_inactivity)

    def _end(self, reason: str) -> None:
        if self._ended:
            return
        self._ended = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._on_end is not None:
            self._on_end(reason)
