"""One call leg's RTP receiver: UDP sockets (RTP on an even port, RTCP on the next) feeding
parse -> reorder buffer -> G.711 decode -> 8->16 kHz resample -> sink, or for G.722
parse -> reorder buffer -> G.722 decode at 16 kHz -> sink (no 8 kHz step; a model at 8 kHz
gets it resampled down). RFC 4733 telephone-events are counted and read as digits
(`rtp.dtmf`), never decoded as audio.

All protocol work is in the sans-IO modules (`packet`, `jitter`, `g711`, `resample`); this
module adds the sockets (read by the event loop's shared `rtp.poller.DatagramPoller`), source
latching, RFC 3550 jitter, RTCP BYE and the inactivity timer; handing in-order packets to the
optional C receive path and taking its state back is `rtp.fastpath`. An SRTP leg (`set_srtp`)
unprotects each admitted datagram (`rtp.srtp`) before parsing it; the C path, when built,
unprotects the in-order ones itself with the same libsrtp session. A plain leg pays one
attribute test per packet that leaves the C path.
Malformed packets are counted in `stats.bad_packets` and dropped; nothing a peer sends can
raise out of the datagram handlers.
Kept whole (just over 500 lines): the datagram handlers, latching and the inactivity timer
all update the same per-leg state, read on every packet.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from asr_common.audio import PcmSink
from rtp.dtmf import KeyPress, TelephoneEvents
from rtp.fastpath import FastPath
from rtp.g711 import DECODE_TABLES
from rtp.g722 import SAMPLE_RATE as WIDEBAND_RATE
from rtp.g722 import SAMPLES_PER_TICK, G722Decoder
from rtp.jitter import Frame, FrameKind, LossFill, PacketKind, ReorderBuffer
from rtp.latch import DropReason, LatchMode, SourcePolicy
from rtp.packet import RTP_HEADER_LENGTH, RtpPacket, is_rtcp, parse_rtcp
from rtp.poller import DatagramPoller
from rtp.resample import PassThroughStream, SoxrStream, UpsamplerStream, loop_stream
from rtp.seq import timestamp_diff
from rtp.sink import DtmfSink
from rtp.srtp import SrtpKeys, SrtpReceiver
from rtp.stats import LegStats

CLOCK_RATE_HZ = 8000
END_RTP_TIMEOUT = "rtp-timeout"
END_RTCP_BYE = "rtcp-bye"
DEFAULT_RESAMPLE_BATCH_MS = 80
DEFAULT_POLL_INTERVAL_MS = 20

Address = tuple[Any, ...]

_RTP_HEADER = struct.Struct("!BBHII")
_PLAIN_RTP_FIRST_BYTE = 0x80
# RTCP packet types 192-223 in the second byte: RTCP multiplexed on the RTP port (RFC 5761).
_RTCP_SECOND_BYTE_MIN = 192
_RTCP_SECOND_BYTE_MAX = 223


async def _bind_udp(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A non-blocking UDP socket bound to (host, port); OSError when that cannot be done."""
    kind, passive = socket.SOCK_DGRAM, socket.AI_PASSIVE
    try:
        infos = socket.getaddrinfo(host, port, type=kind, flags=passive | socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await loop.getaddrinfo(host, port, type=kind, flags=passive)
    family, _, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


RESAMPLERS = ("halfband", "soxr", "none")


def _upsampler_stream(
    kind: str, deliver: Callable[[np.ndarray], None]
) -> UpsamplerStream | SoxrStream | PassThroughStream:
    """`halfband`: a stream of the running loop's shared upsampler (without a running loop,
    one that upsamples at once); `soxr`: a per-leg soxr stream; `none`: 8 kHz as decoded, for
    a model whose front end runs at 8 kHz. ValueError otherwise."""
    if kind == "soxr":
        return SoxrStream(deliver)
    if kind == "none":
        return PassThroughStream(deliver)
    if kind != "halfband":
        raise ValueError(f"unknown resampler {kind!r}; use one of {', '.join(RESAMPLERS)}")
    return loop_stream(deliver)


class RtpLeg:
    """Receives one RTP stream and hands 16 kHz int16 PCM to `sink`.

    payload_types maps RTP payload type numbers to encoding names from the SDP answer, e.g.
    {0: "PCMU", 8: "PCMA", 101: "telephone-event", 13: "CN"}; names are case-insensitive.
    Decoded audio is resampled in batches of `resample_batch_ms` (default 80 ms = 4 packets
    of 20 ms; 0 = every packet) by `resampler`: "halfband" (default) hands each batch to the
    event loop's `rtp.resample.SharedUpsampler`, which upsamples the batches of all legs
    ready in the same pass in one matrix product and calls the sink with each leg's output;
    "soxr" runs a soxr stream per leg. Per-batch costs (decode, submission, the sink call) are
    paid once per 4 packets at 80 ms. The price is latency: a sample waits (batch - packet) / 2
    on average for its batch, 30 ms at 80 ms (10 ms at 40 ms), plus the resampler's lag
    (2.5 ms for halfband, 63 ms on average for soxr; see `rtp.resample`); the engine
    consumes 160-640 ms chunks, so it hardly sees the difference.
    A batch left incomplete when packets stop is delivered with the next packet or at `close()`.
    The sockets are read every `poll_interval_ms` (default 20 ms, one packet period) by the
    loop's shared `rtp.poller.DatagramPoller`, which adds up to that much delay before a
    packet is handled (half on average) and saves event-loop wake-ups; 0 reads on readiness.
    With `fast_path` (default) and the C extension built, the poller's C receiver takes this
    leg's in-order packets once the leg has armed it, and hands them over in whole batches
    (`fast_batch`); every other datagram still comes through `handle_rtp` (see `_arm`,
    `_take_fast`). `stats` includes the packets counted in C.
    on_end(reason) is called at most once: "rtp-timeout" after `inactivity_timeout_s` without
    packets (not counted while on hold), or "rtcp-bye". The owner still calls `close()`.

    Source rule (`rtp.latch`): `expected_remote` is the (address, port) the peer signalled in
    its SDP, `latch` the mode: "strict" (that address and port), "address" (default: that IP,
    any port; another port of it takes the latch over only with a new SSRC, after 200 ms of
    silence from the latched one and 3 packets in a row) or "first" (the first valid source
    latches; risky, for peers behind NAT whose SDP address is wrong).
    Datagrams from other sources are counted in `stats.foreign_address` / `foreign_port` (and
    in total in `foreign_packets`) and dropped before they are parsed or decoded, in Python
    and in the C receive path alike. Until the address is known every mode acts like "first";
    a re-INVITE that changes it (`set_expected_remote`) releases the latch. RTCP is taken from
    the signalled IP, or in "first"-like operation from the latched or signalled host.

    `srtp` (or `set_srtp` later): the SDES keys of an SRTP stream. Each datagram the source
    rule admits is unprotected (`rtp.srtp`) before it is parsed, SRTCP too (also on the RTP
    port); one failing authentication or the replay check is counted in `stats.srtp_*` and
    dropped. The C receive path unprotects in-order packets with the same libsrtp session
    (not with an MKI, whose packets all take the Python path).

    G.722 (`rtp.g722`) is decoded with one stateful decoder per stream: a new SSRC or a payload
    type map that changes the G.722 types (a re-INVITE or UPDATE switching codecs) starts a
    fresh one, as the sender's encoder does.
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
        resample_batch_ms: int = DEFAULT_RESAMPLE_BATCH_MS,
        poll_interval_ms: float = DEFAULT_POLL_INTERVAL_MS,
        resampler: str = "halfband",
        fast_path: bool = True,
        expected_remote: tuple[str, int] | None = None,
        latch: LatchMode | str = LatchMode.ADDRESS,
        srtp: SrtpKeys | None = None,
    ) -> None:
        self._stats = LegStats()
        self._srtp_keys: SrtpKeys | None = None
        self._srtp: SrtpReceiver | None = None
        if srtp is not None:
            self._srtp_keys, self._srtp = srtp, SrtpReceiver(srtp, self._stats)
        # whether the C path may be armed: always for plain RTP; for SRTP when it unprotects too
        self._fast_armable = srtp is None
        # The C receive path (`rtp._fastrtp`, through the poller) when built and `fast_path`;
        # `self._fast.armed` while it takes this leg's in-order packets (`rtp.fastpath`).
        self._use_fast = fast_path
        self._fast = FastPath()
        self._sink = sink
        self._on_end = on_end
        self._timeout_s = inactivity_timeout_s
        self._buffer = ReorderBuffer(
            reorder_ms=reorder_ms,
            clock_rate=CLOCK_RATE_HZ,
            loss_fill=loss_fill,
            max_gap_fill_ms=max_gap_fill_ms,
            stats=self._stats,
        )
        self._upsampler = _upsampler_stream(resampler, self._emit)
        self._batch_samples = resample_batch_ms * CLOCK_RATE_HZ // 1000
        # Audio waiting for the next resampler call, in order: G.711 bytes of one codec not yet
        # decoded (`_raw`, decoded with `_raw_table`), after decoded PCM (`_pcm`).
        self._raw: list[bytes] = []
        self._raw_table: np.ndarray | None = None
        self._pcm: list[np.ndarray] = []
        self._queued_samples = 0
        self._kinds: dict[int, PacketKind] = {}
        self._tables: dict[int, np.ndarray] = {}
        self._telephone_events: set[int] = set()
        self._key_presses = TelephoneEvents(CLOCK_RATE_HZ)
        # G.722: payload types, the stream's decoder (made at its first packet, made anew after
        # an SSRC change or a codec switch), decoded 16 kHz PCM waiting for a batch and its
        # length in ticks; `_narrow` for a model at 8 kHz.
        self._wideband: set[int] = set()
        self._wide_decoder: G722Decoder | None = None
        self._wide_pcm: list[np.ndarray] = []
        self._wide_ticks = 0
        self._narrow = resampler == "none"
        self._downsampler: SoxrStream | None = None
        self.set_payload_types(payload_types)
        self._policy = SourcePolicy(latch)
        self._policy.set_signalled(expected_remote)
        self._poll_interval_s = poll_interval_ms / 1000
        self._poller: DatagramPoller | None = None
        self._sockets: tuple[socket.socket, ...] = ()
        self._timer: asyncio.TimerHandle | None = None
        self._last_seen = time.monotonic()
        self._on_hold = False
        self._ended = False
        self._closed = False
        self._jitter_ticks = 0.0
        self._jitter_arrival = 0.0
        self._jitter_timestamp = 0
        self._jitter_ssrc = -1

    @property
    def stats(self) -> LegStats:
        """The leg's counters, including the packets the C receive path has taken so far."""
        if self._fast.available:
            self._take_fast(disarm=False)
        return self._stats

    @property
    def local_port(self) -> int | None:
        if not self._sockets:
            return None
        port: int = self._sockets[0].getsockname()[1]
        return port

    @property
    def remote(self) -> Address | None:
        """The latched RTP source address, None until the first accepted packet."""
        return self._policy.latched

    @property
    def expected_remote(self) -> tuple[str, int] | None:
        """The peer's RTP address from its SDP, None when not known."""
        return self._policy.signalled

    @property
    def latch(self) -> LatchMode:
        """The source policy's mode (see the class doc)."""
        return self._policy.mode

    async def open(self, host: str, port: int) -> None:
        """Bind RTP on (host, port) and RTCP on port + 1; OSError if either is taken."""
        loop = asyncio.get_running_loop()
        rtp = await _bind_udp(loop, host, port)
        try:
            rtcp = await _bind_udp(loop, host, rtp.getsockname()[1] + 1)
        except OSError:
            rtp.close()
            raise
        self._poller = DatagramPoller.for_loop(loop, self._poll_interval_s)
        batch_bytes = self._batch_samples  # G.711: one byte per sample
        if self._poller.add(rtp, self.handle_rtp, owner=self if self._use_fast else None, batch_bytes=batch_bytes):
            self._fast.attach(self._poller.fast, rtp.fileno())
            self._fast.screen(self._policy.screen_filter())
            self._fast_armable = self._fast.set_srtp(self._srtp)
        self._poller.add(rtcp, self.handle_rtcp)
        self._sockets = (rtp, rtcp)
        self._last_seen = time.monotonic()
        self._timer = loop.call_later(self._timeout_s, self._check_inactivity)

    def set_payload_types(self, payload_types: dict[int, str]) -> None:
        """Apply a new SDP answer's payload type map (re-INVITE); unknown names are skipped."""
        if self._fast.armed:
            self._take_fast(disarm=True)
        kinds: dict[int, PacketKind] = {}
        tables: dict[int, np.ndarray] = {}
        events: set[int] = set()
        wideband: set[int] = set()
        for number, name in payload_types.items():
            encoding = name.upper()
            if encoding in DECODE_TABLES:
                kinds[number] = PacketKind.AUDIO
                tables[number] = DECODE_TABLES[encoding]
            elif encoding == "G722":
                kinds[number] = PacketKind.AUDIO
                wideband.add(number)
            elif encoding == "CN":
                kinds[number] = PacketKind.COMFORT_NOISE
            elif encoding == "TELEPHONE-EVENT":
                events.add(number)
        self._kinds, self._tables, self._telephone_events = kinds, tables, events
        if wideband != self._wideband:
            self._wide_decoder = None  # a codec switch: a G.722 stream after it starts afresh
        self._wideband = wideband

    def set_expected_remote(self, address: tuple[str, int] | None) -> None:
        """The peer's SDP connection address and port (offer, answer or re-INVITE); see the
        class doc and `rtp.latch.SourcePolicy.set_signalled`."""
        if address is None:
            return
        if self._fast.armed:
            self._take_fast(disarm=True)
        if self._policy.set_signalled(address):
            self._fast.screen(self._policy.screen_filter())

    def set_latch(self, mode: LatchMode | str) -> None:
        """Use another source policy mode (a routing profile's); ValueError for an unknown one."""
        if self._fast.armed:
            self._take_fast(disarm=True)
        self._policy.set_mode(mode)
        self._fast.screen(self._policy.screen_filter())

    def set_srtp(self, keys: SrtpKeys | None) -> None:
        """Unprotect with `keys` from now on (SDP with SDES keys, or a re-INVITE that changes
        them); None: plain RTP. The same keys again keep the session and its replay window."""
        if keys == self._srtp_keys:
            return
        if self._fast.armed:
            self._take_fast(disarm=True)
        self._srtp_keys = keys
        self._srtp = SrtpReceiver(keys, self._stats) if keys is not None else None
        self._fast_armable = self._fast.set_srtp(self._srtp) if self._fast.available else keys is None

    def set_hold(self, on_hold: bool) -> None:
        """inactive/sendonly media suspends the inactivity timeout; resuming restarts it."""
        self._on_hold = on_hold
        self._last_seen = time.monotonic()

    def handle_rtp(self, data: bytes, addr: Address) -> None:
        """Datagram handler of the RTP socket (public for tests and fuzzing).

        This runs for every packet of every call, so the common case (plain header, known
        source, next packet in order) takes one unpack, one payload slice and no other object:
        the payload is queued as bytes and decoded once per resampler batch.
        """
        if self._closed:
            return
        policy = self._policy
        if addr != policy.latched:
            reason = policy.screen(addr)
            if reason is not None:
                self._drop(reason)
                return
        if self._fast.armed:  # a packet that bypassed the C path: take over its state first
            self._take_fast(disarm=True)
        srtp = self._srtp
        if srtp is not None:
            if len(data) > 1 and _RTCP_SECOND_BYTE_MIN <= data[1] <= _RTCP_SECOND_BYTE_MAX:
                self.handle_rtcp(data, addr)
                return
            unprotected = srtp.unprotect(data)
            if unprotected is None:
                return
            data = unprotected
        if len(data) >= RTP_HEADER_LENGTH and data[0] == _PLAIN_RTP_FIRST_BYTE:
            _, second, sequence_number, timestamp, ssrc = _RTP_HEADER.unpack_from(data)
            if _RTCP_SECOND_BYTE_MIN <= second <= _RTCP_SECOND_BYTE_MAX:
                self.handle_rtcp(data, addr)
                return
            payload_type = second & 0x7F
            payload = data[RTP_HEADER_LENGTH:]
        elif is_rtcp(data):
            self.handle_rtcp(data, addr)
            return
        else:
            try:
                packet = RtpPacket.parse(data)
            except ValueError:
                self._stats.bad_packets += 1
                return
            payload_type, sequence_number = packet.payload_type, packet.sequence_number
            timestamp, ssrc, payload = packet.timestamp, packet.ssrc, packet.payload
        if addr != policy.latched:
            silent_s = time.monotonic() - self._last_seen
            reason = policy.admit(addr, ssrc, sequence_number, self._buffer.ssrc, silent_s)
            if reason is not None:
                self._drop(reason)
                return
        now = time.monotonic()
        stats = self._stats
        stats.packets += 1
        stats.bytes += len(data)
        if stats.first_packet_time is None:
            stats.first_packet_time = now
        stats.last_packet_time = now
        self._last_seen = now

        table = self._tables.get(payload_type)
        if table is not None:
            # RFC 3550 section 6.4.1 interarrival jitter: J += (|D| - J) / 16, D in clock ticks.
            if ssrc == self._jitter_ssrc:
                transit_change = (now - self._jitter_arrival) * CLOCK_RATE_HZ - timestamp_diff(
                    timestamp, self._jitter_timestamp
                )
                self._jitter_ticks += (abs(transit_change) - self._jitter_ticks) / 16
                stats.jitter_ms = self._jitter_ticks * 1000 / CLOCK_RATE_HZ
            self._jitter_ssrc, self._jitter_arrival, self._jitter_timestamp = ssrc, now, timestamp
            if self._buffer.push_in_order(sequence_number, timestamp, ssrc, payload_type, payload):
                if table is not self._raw_table:
                    self._decode_raw()
                    self._raw_table = table
                self._raw.append(payload)
                self._queued_samples += len(payload)
                if self._queued_samples >= self._batch_samples:
                    self._resample_queued()
                if self._fast.available and self._fast_armable:
                    self._arm(payload_type, addr)
                return
            kind = PacketKind.AUDIO
        else:
            kind = self._kinds.get(payload_type, PacketKind.SKIP)
            if kind is PacketKind.COMFORT_NOISE:
                stats.comfort_noise_packets += 1
            elif payload_type in self._telephone_events:
                stats.telephone_event_packets += 1
                self._key_pressed(ssrc, timestamp, payload)
            elif kind is PacketKind.SKIP:
                stats.unknown_payload_packets += 1
        if self._wide_decoder is not None and ssrc != self._buffer.ssrc:
            # A new stream (RFC 3550 8.2: a restarted or another sender) comes with a fresh
            # G.722 encoder: what the old one left plays with the old decoder state, the new
            # stream starts from a fresh one.
            self._deliver(self._buffer.flush())
            self._wide_decoder = None
        frames = self._buffer.push(sequence_number, timestamp, ssrc, payload_type, payload, kind)
        if frames:
            self._deliver(frames)

    def handle_rtcp(self, data: bytes, addr: Address) -> None:
        """Datagram handler of the RTCP socket: counts packets and ends the leg on BYE."""
        if self._closed:
            return
        if not self._policy.admit_rtcp(addr):
            self._stats.foreign_packets += 1
            return
        if self._srtp is not None:
            unprotected = self._srtp.unprotect_rtcp(data)
            if unprotected is None:
                return
            data = unprotected
        try:
            packets = parse_rtcp(data)
        except ValueError:
            self._stats.bad_packets += 1
            return
        self._stats.rtcp_packets += 1
        ssrc = self._buffer.ssrc
        for packet in packets:
            if packet.is_bye:
                sources = packet.bye_sources
                if ssrc is None or not sources or ssrc in sources:
                    self._end(END_RTCP_BYE)

    async def close(self) -> LegStats:
        """Play out what is buffered, flush the resampler, finish the sink, release the ports."""
        if self._closed:
            return self._stats
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._fast.available:
            self._take_fast(disarm=self._fast.armed)
            self._fast.detach()
        self._deliver(self._buffer.flush())
        last_press = self._key_presses.flush()
        if last_press is not None:
            self._report_presses([last_press])
        self._resample_queued()
        self._upsampler.flush()
        self._emit_wideband()
        if self._downsampler is not None:
            self._downsampler.flush()
        self._sink.input_finished()
        for sock in self._sockets:
            if self._poller is not None:
                self._poller.remove(sock)
            sock.close()
        self._sockets, self._poller = (), None
        return self._stats

    def fast_batch(self, payloads: bytes) -> None:
        """A batch of in-order payloads the C receive path took (poller callback)."""
        if self._closed:
            return
        self._raw.append(payloads)
        self._queued_samples += len(payloads)
        if self._queued_samples >= self._batch_samples:
            self._resample_queued()

    def _arm(self, payload_type: int, addr: Address) -> None:
        """Let the C receive path take the packets that continue the stream from `addr`:
        called after a packet took the in-order path (`push_in_order`), so the reorder buffer
        holds nothing and its expectation is known."""
        expected = self._buffer.in_order_expectation()
        if expected is not None:
            jitter = (self._jitter_ticks, self._jitter_arrival, self._jitter_timestamp)
            self._fast.arm(expected, payload_type, addr, jitter, self._queued_samples)

    def _take_fast(self, *, disarm: bool) -> None:
        """Bring what the C path took into this leg (see `rtp.fastpath.FastPath.take`)."""
        taken = self._fast.take(disarm=disarm)
        if taken.foreign_address or taken.foreign_port:
            stats = self._stats
            stats.foreign_address += taken.foreign_address
            stats.foreign_port += taken.foreign_port
            stats.foreign_packets += taken.foreign_address + taken.foreign_port
        if taken.packets:
            stats = self._stats
            stats.packets += taken.packets
            stats.bytes += taken.size
            stats.last_packet_time = taken.arrival
            self._last_seen = max(self._last_seen, taken.arrival)
            self._jitter_ticks, self._jitter_arrival = taken.jitter_ticks, taken.jitter_arrival
            self._jitter_timestamp = taken.jitter_timestamp
            stats.jitter_ms = taken.jitter_ticks * 1000 / CLOCK_RATE_HZ
        if not disarm:
            return
        if taken.since_arm:
            self._buffer.advance_in_order(taken.since_arm, taken.next_timestamp, taken.payload_type, taken.last_payload)
        if taken.pending:
            self._raw.append(taken.pending)
            self._queued_samples += len(taken.pending)

    def _key_pressed(self, ssrc: int, timestamp: int, payload: bytes) -> None:
        """A telephone-event packet: read it as a key press (never as audio)."""
        presses = self._key_presses.feed(ssrc, timestamp, payload)
        if presses:
            self._report_presses(presses)

    def _report_presses(self, presses: list[KeyPress]) -> None:
        self._stats.dtmf_events += len(presses)
        if isinstance(self._sink, DtmfSink):
            for press in presses:
                self._sink.dtmf(press)

    def _drop(self, reason: DropReason) -> None:
        """Count a datagram the source policy refused (`LegStats.foreign_*`)."""
        stats = self._stats
        stats.foreign_packets += 1
        if reason is DropReason.FOREIGN_ADDRESS:
            stats.foreign_address += 1
        else:
            stats.foreign_port += 1

    def _deliver(self, frames: list[Frame]) -> None:
        """Queue the frames' audio (G.711 bytes, or silence for SILENCE frames and payload types
        no longer known) and resample once a batch is full; G.722 frames are decoded at 16 kHz."""
        for frame in frames:
            if frame.payload_type in self._wideband:
                self._queue_wideband(frame)
                continue
            if self._wide_pcm:
                self._emit_wideband()
            table = self._tables.get(frame.payload_type) if frame.kind is not FrameKind.SILENCE else None
            if table is None:
                self._decode_raw()
                self._pcm.append(np.zeros(frame.samples, dtype=np.int16))
                self._queued_samples += frame.samples
                continue
            if table is not self._raw_table:
                self._decode_raw()
                self._raw_table = table
            self._raw.append(frame.payload)
            self._queued_samples += len(frame.payload)
        if self._queued_samples >= self._batch_samples:
            self._resample_queued()
        if self._wide_ticks >= self._batch_samples:
            self._emit_wideband()

    def _queue_wideband(self, frame: Frame) -> None:
        """Decode one G.722 frame (audio, a repeat for a lost packet, or silence) at 16 kHz.
        Narrowband audio queued before it goes to the resampler first."""
        if self._raw or self._pcm:
            self._resample_queued()
        if frame.kind is FrameKind.SILENCE:
            pcm = np.zeros(frame.samples * SAMPLES_PER_TICK, dtype=np.int16)
        else:
            if self._wide_decoder is None:
                self._wide_decoder = G722Decoder()
            pcm = self._wide_decoder.decode(frame.payload)
        self._wide_pcm.append(pcm)
        self._wide_ticks += frame.samples

    def _emit_wideband(self) -> None:
        """Hand the decoded 16 kHz audio to the sink (resampled to 8 kHz for a model at 8 kHz)."""
        pieces = self._wide_pcm
        if not pieces:
            return
        pcm = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        self._wide_pcm, self._wide_ticks = [], 0
        if not self._narrow:
            self._emit(pcm)
            return
        if self._downsampler is None:
            self._downsampler = SoxrStream(self._emit, WIDEBAND_RATE, CLOCK_RATE_HZ)
        self._downsampler.submit(pcm)

    def _decode_raw(self) -> None:
        """Decode the queued G.711 bytes with one table lookup (`take` is cheaper than indexing)."""
        raw = self._raw
        if not raw or self._raw_table is None:
            return
        data = raw[0] if len(raw) == 1 else b"".join(raw)
        self._pcm.append(self._raw_table.take(np.frombuffer(data, dtype=np.uint8)))
        self._raw = []

    def _resample_queued(self) -> None:
        """One resampler submission per batch; the loop's shared upsampler runs the batches of
        all legs together and calls `_emit` with the output. A batch of G.711 bytes only (the
        usual case) is submitted undecoded: the upsampler decodes all legs' bytes at once."""
        if not self._pcm and self._raw and self._raw_table is not None:
            raw = self._raw
            self._upsampler.submit_g711(raw[0] if len(raw) == 1 else b"".join(raw), self._raw_table)
            self._raw = []
            self._queued_samples = 0
            return
        self._decode_raw()
        pcm_pieces = self._pcm
        if not pcm_pieces:
            return
        pcm = pcm_pieces[0] if len(pcm_pieces) == 1 else np.concatenate(pcm_pieces)
        self._pcm = []
        self._queued_samples = 0
        self._upsampler.submit(pcm)

    def _emit(self, pcm16k: np.ndarray) -> None:
        self._stats.samples_out += len(pcm16k)
        self._sink.accept_waveform(pcm16k)

    def _check_inactivity(self) -> None:
        """Runs once per timeout period (not per packet): re-arms for the remaining time."""
        self._timer = None
        if self._closed or self._ended:
            return
        if self._fast.armed:
            self._take_fast(disarm=False)
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
