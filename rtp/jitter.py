"""A short reorder buffer for one RTP stream, sans-IO.

Packets go in as they arrive (`push`), frames come out in sequence order. In-order packets
are released at once, so the buffer adds no delay on a clean link; only a gap holds later
packets back, until the gap is `reorder_ms` old (default 60 ms = 3 packets of 20 ms: the
missing packet is declared lost when the third packet after it arrives).

What comes out is a list of `Frame`s: audio to decode, or silence to synthesize, with its
length in RTP clock ticks (= 8 kHz samples for G.711; a packet's ticks come with it, by
default its payload length; `rtp.codecs.Codec.ticks`):

- loss: a single lost packet is replaced by a repetition of the previous packet
  (`LossFill.REPEAT_SINGLE`, the default) or by silence; longer losses become silence.
- timestamp gaps: when a packet starts later than the previous one ended (lost packets,
  talkspurts after a marker bit, silence suppression, comfort noise), the gap is filled with
  silence, but at most `max_gap_fill_ms` (default 1000 ms) per gap. A sender that was silent
  for minutes therefore costs one second of silence, not minutes: the engine sees a pause
  long enough to end an utterance, and the stream's sample clock drifts from the RTP clock by
  the excess, which no consumer of ours relies on. Timestamps going backwards fill nothing.
- comfort noise (PT 13) anchors silence: it lasts until the next packet's timestamp.
- telephone-event and unknown payload types occupy their sequence numbers (so they are not
  taken for losses) and produce nothing.
- duplicates and late packets (their slot was already played or declared lost) are dropped.
- SSRC change: the buffered packets of the old source are released, then the state resets.
- sequence jumps beyond RFC 3550's limits (3000 ahead, 100 behind, A.1) resynchronize to the
  new numbering: immediately when ahead, after two consecutive packets when behind.

Counters go to a `LegStats` (lost, late, duplicate, reordered, ssrc_changes,
sequence_resets, concealed_samples).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rtp.seq import SequenceUnwrapper, timestamp_diff
from rtp.stats import LegStats

MAX_DROPOUT = 3000
MAX_MISORDER = 100
DEFAULT_PACKET_MS = 20
_HISTORY_BITS = 64
_HISTORY_MASK = (1 << _HISTORY_BITS) - 1


class PacketKind(enum.Enum):
    AUDIO = "audio"
    COMFORT_NOISE = "comfort-noise"
    SKIP = "skip"


class FrameKind(enum.Enum):
    AUDIO = "audio"
    REPEAT = "repeat"
    SILENCE = "silence"


class LossFill(enum.Enum):
    SILENCE = "silence"
    REPEAT_SINGLE = "repeat-single"


@dataclass(slots=True)
class Frame:
    """A piece of output: `payload` to decode with `payload_type` (AUDIO, REPEAT) or
    `samples` ticks of silence (SILENCE, payload empty)."""

    kind: FrameKind
    payload_type: int
    payload: bytes
    samples: int


@dataclass(slots=True)
class _Held:
    timestamp: int
    payload_type: int
    payload: bytes
    kind: PacketKind
    samples: int


class ReorderBuffer:
    def __init__(
        self,
        *,
        reorder_ms: int = 60,
        clock_rate: int = 8000,
        loss_fill: LossFill = LossFill.REPEAT_SINGLE,
        max_gap_fill_ms: int = 1000,
        stats: LegStats | None = None,
    ) -> None:
        if reorder_ms < 0:
            raise ValueError(f"reorder_ms must be >= 0, got {reorder_ms}")
        self.reorder_ms = reorder_ms
        self.loss_fill = loss_fill
        self.stats = stats if stats is not None else LegStats()
        self._max_gap_fill_ms = max_gap_fill_ms
        self._packet_samples = 0
        self.set_clock_rate(clock_rate)
        self._reset()

    def set_clock_rate(self, clock_rate: int) -> None:
        """The RTP clock (Hz) of the stream's audio: the gap fill limit and the reorder depth
        are kept in its ticks. A re-INVITE may switch to a codec of another clock."""
        self.clock_rate = clock_rate
        self.max_gap_fill = self._max_gap_fill_ms * clock_rate // 1000
        self._depth = self._depth_for(self._packet_samples or DEFAULT_PACKET_MS * clock_rate // 1000)

    def _depth_for(self, packet_samples: int) -> int:
        """Gap age, in packets, after which a missing packet is declared lost (>= 1)."""
        return max(1, round(self.reorder_ms * self.clock_rate / 1000 / packet_samples))

    def _reset(self) -> None:
        self.ssrc: int | None = None
        self._unwrapper = SequenceUnwrapper()
        self._held: dict[int, _Held] = {}
        self._next: int | None = None
        self._history = 0
        self._bad_seq: int | None = None
        self._expected_timestamp: int | None = None
        # The last played audio packet as (payload_type, payload, samples), for REPEAT
        # concealment; None when the last thing played was not audio (comfort noise).
        self._previous: tuple[int, bytes, int] | None = None

    @property
    def held(self) -> int:
        """Packets waiting for an earlier one."""
        return len(self._held)

    def push_in_order(
        self, seq: int, timestamp: int, ssrc: int, payload_type: int, payload: bytes, ticks: int | None = None
    ) -> bool:
        """The common case without allocating frames: an audio packet that is exactly the next
        one, of the usual length (`ticks`, default its payload length), starting where the
        previous one ended, with nothing held.

        True: the packet is taken and plays now; the caller decodes `payload` itself (it is the
        same as `push` returning one AUDIO frame of it). False: nothing changed; use `push`.
        """
        if ticks is None:
            ticks = len(payload)
        expected = self._next
        if (
            expected is None
            or seq != expected & 0xFFFF
            or ssrc != self.ssrc
            or self._held
            or timestamp != self._expected_timestamp
            or ticks != self._packet_samples
        ):
            return False
        self._unwrapper.highest = expected
        self._next = expected + 1
        self._bad_seq = None
        self._expected_timestamp = (timestamp + ticks) & 0xFFFFFFFF
        self._previous = (payload_type, payload, ticks)
        self._history = (self._history << 1 | 1) & _HISTORY_MASK
        return True

    def in_order_expectation(self) -> tuple[int, int, int, int] | None:
        """(sequence number, timestamp, length in ticks, SSRC) of the packet that `push_in_order`
        would take next (the ticks are its payload size for the codecs of the C path); None
        while something is held or before the stream's shape is known."""
        if self._next is None or self._held or self.ssrc is None or self._expected_timestamp is None:
            return None
        if not self._packet_samples:
            return None
        return self._next & 0xFFFF, self._expected_timestamp, self._packet_samples, self.ssrc

    def advance_in_order(self, count: int, next_timestamp: int, payload_type: int, last_payload: bytes) -> None:
        """Account for `count` packets that continued the stream exactly as `in_order_expectation`
        said, taken elsewhere (the C receive path, `rtp._fastrtp`): the same state as `count`
        `push_in_order` calls that returned True, the last with `last_payload`."""
        expected = self._next
        if count <= 0 or expected is None:
            return
        self._unwrapper.highest = expected + count - 1
        self._next = expected + count
        self._bad_seq = None
        self._expected_timestamp = next_timestamp
        self._previous = (payload_type, last_payload, len(last_payload))
        shift = min(count, _HISTORY_BITS)
        self._history = (self._history << shift | ((1 << shift) - 1)) & _HISTORY_MASK

    def push(
        self,
        seq: int,
        timestamp: int,
        ssrc: int,
        payload_type: int,
        payload: bytes,
        kind: PacketKind,
        ticks: int | None = None,
    ) -> list[Frame]:
        """Add one received packet, lasting `ticks` (default its payload length) when AUDIO;
        returns the frames now ready, in order (often one)."""
        out: list[Frame] = []
        if ticks is None:
            ticks = len(payload)
        expected = self._next
        if expected is not None and ssrc == self.ssrc and not self._held and seq == expected & 0xFFFF:
            # Fast path: the next packet in order, nothing waiting; it plays at once.
            self._unwrapper.highest = expected
            self._next = expected + 1
            self._bad_seq = None
            samples = ticks if kind is PacketKind.AUDIO else 0
            if samples and samples != self._packet_samples:
                self._packet_samples = samples
                self._depth = self._depth_for(samples)
            self._emit(_Held(timestamp, payload_type, payload, kind, samples), out)
            self._history = (self._history << 1 | 1) & _HISTORY_MASK
            return out
        if self.ssrc != ssrc:
            if self.ssrc is not None:
                self._drain(out)
                self.stats.ssrc_changes += 1
                self._reset()
            self.ssrc = ssrc
        extended = self._unwrapper.extend(seq)
        if self._next is None:
            self._next = extended
        distance = extended - self._next
        if distance > MAX_DROPOUT or distance < -MAX_MISORDER:
            if distance < 0 and seq != self._bad_seq:
                self._bad_seq = (seq + 1) & 0xFFFF
                self.stats.late += 1
                return out
            self._resync(out)
            extended = self._unwrapper.extend(seq)
            self._next = extended
        elif distance < 0:
            back = -distance - 1
            if back < _HISTORY_BITS and self._history >> back & 1:
                self.stats.duplicate += 1
            else:
                self.stats.late += 1
            return out
        if extended in self._held:
            self.stats.duplicate += 1
            return out
        self._bad_seq = None
        highest = self._unwrapper.highest
        if highest is not None and extended < highest:
            self.stats.reordered += 1
        samples = ticks if kind is PacketKind.AUDIO else 0
        if samples and samples != self._packet_samples:
            self._packet_samples = samples
            self._depth = self._depth_for(samples)
        self._held[extended] = _Held(timestamp, payload_type, payload, kind, samples)
        self._release(out, force=False)
        return out

    def flush(self) -> list[Frame]:
        """Release everything held (end of call), declaring the gaps between them lost."""
        out: list[Frame] = []
        self._drain(out)
        return out

    def _drain(self, out: list[Frame]) -> None:
        self._release(out, force=True)

    def _resync(self, out: list[Frame]) -> None:
        """The sender renumbered its packets: play what is held, then start over."""
        self._drain(out)
        self.stats.sequence_resets += 1
        self._unwrapper.reset()
        self._held.clear()
        self._history = 0
        self._bad_seq = None

    def _release(self, out: list[Frame], *, force: bool) -> None:
        held = self._held
        next_seq = self._next
        if next_seq is None:
            return
        while held:
            packet = held.pop(next_seq, None)
            if packet is not None:
                self._emit(packet, out)
                self._history = (self._history << 1 | 1) & _HISTORY_MASK
                next_seq += 1
                continue
            highest = max(held) if force else self._unwrapper.highest
            if highest is None or (not force and highest - next_seq < self._depth):
                break
            resume = min(held) if force else min(min(held), highest - self._depth + 1)
            self._declare_lost(
                resume - next_seq, out, isolated=resume == next_seq + 1 and resume in held and bool(self._history & 1)
            )
            next_seq = resume
        self._next = next_seq

    def _declare_lost(self, count: int, out: list[Frame], *, isolated: bool) -> None:
        """count packets are missing; isolated: exactly one, and its neighbours both arrived."""
        self.stats.lost += count
        self._history = (self._history << count) & _HISTORY_MASK
        previous = self._previous
        if (
            isolated
            and self.loss_fill is LossFill.REPEAT_SINGLE
            and previous is not None
            and self._expected_timestamp is not None
        ):
            payload_type, payload, samples = previous
            out.append(Frame(FrameKind.REPEAT, payload_type, payload, samples))
            self.stats.concealed_samples += samples
            self._expected_timestamp = (self._expected_timestamp + samples) & 0xFFFFFFFF

    def _emit(self, packet: _Held, out: list[Frame]) -> None:
        if packet.kind is PacketKind.SKIP:
            return
        expected = self._expected_timestamp
        if expected is not None:
            gap = timestamp_diff(packet.timestamp, expected)
            if gap > 0:
                fill = min(gap, self.max_gap_fill)
                out.append(Frame(FrameKind.SILENCE, packet.payload_type, b"", fill))
                self.stats.concealed_samples += fill
        if packet.kind is PacketKind.AUDIO:
            out.append(Frame(FrameKind.AUDIO, packet.payload_type, packet.payload, packet.samples))
        self._expected_timestamp = (packet.timestamp + packet.samples) & 0xFFFFFFFF
        self._previous = (
            (packet.payload_type, packet.payload, packet.samples) if packet.kind is PacketKind.AUDIO else None
        )
