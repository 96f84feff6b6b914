import random

import pytest

from rtp.jitter import Frame, FrameKind, LossFill, PacketKind, ReorderBuffer
from rtp.seq import SequenceUnwrapper, seq_diff, seq_gt, timestamp_diff

SSRC = 0x1234
SAMPLES = 160


def test_seq_helpers_wrap() -> None:
    assert seq_diff(0, 65535) == 1
    assert seq_diff(65535, 0) == -1
    assert seq_diff(10, 5) == 5
    assert seq_gt(0, 65535)
    assert not seq_gt(65535, 0)
    assert timestamp_diff(0, 0xFFFFFF60) == 160
    assert timestamp_diff(0xFFFFFF60, 0) == -160
    unwrapper = SequenceUnwrapper()
    extended = [unwrapper.extend(s) for s in (65533, 65534, 65535, 0, 65535, 1, 2)]
    assert extended == [65536 + 65533, 65536 + 65534, 65536 + 65535, 131072, 65536 + 65535, 131073, 131074]


def packet(n: int, first_seq: int = 65530, first_ts: int = 0xFFFFF000) -> tuple[int, int, bytes]:
    """Packet n of a stream: (seq, timestamp, payload) with wraparound of both near n=6/26."""
    return (first_seq + n) & 0xFFFF, (first_ts + n * SAMPLES) & 0xFFFFFFFF, bytes([n % 256]) * SAMPLES


def run_link(order: list[int], buffer: ReorderBuffer, *, flush: bool = True) -> list[Frame]:
    frames: list[Frame] = []
    for n in order:
        seq, ts, payload = packet(n)
        frames += buffer.push(seq, ts, SSRC, 0, payload, PacketKind.AUDIO)
    if flush:
        frames += buffer.flush()
    return frames


def played(frames: list[Frame]) -> list[int | str]:
    """Which packet each frame carries, 'S<n>' for silence of n samples, 'R<k>' for a repeat."""
    out: list[int | str] = []
    for frame in frames:
        if frame.kind is FrameKind.SILENCE:
            out.append(f"S{frame.samples}")
        elif frame.kind is FrameKind.REPEAT:
            out.append(f"R{frame.payload[0]}")
        else:
            out.append(frame.payload[0])
    return out


def test_in_order_released_immediately_across_wraparound() -> None:
    buffer = ReorderBuffer()
    for n in range(40):
        seq, ts, payload = packet(n)
        frames = buffer.push(seq, ts, SSRC, 0, payload, PacketKind.AUDIO)
        assert played(frames) == [n]
    assert buffer.stats.lost == buffer.stats.reordered == 0


def test_reorder_within_depth_is_repaired() -> None:
    buffer = ReorderBuffer()
    frames = run_link([0, 1, 3, 2, 4, 7, 5, 6, 8], buffer, flush=False)
    assert played(frames) == list(range(9))
    assert buffer.stats.reordered == 3
    assert buffer.stats.lost == 0


def test_single_loss_repeats_previous_packet_after_depth() -> None:
    buffer = ReorderBuffer()
    frames = run_link([0, 1, 3, 4], buffer, flush=False)
    assert played(frames) == [0, 1]
    assert buffer.held == 2
    frames = run_link([5], buffer, flush=False)
    assert played(frames) == ["R1", 3, 4, 5]
    assert buffer.stats.lost == 1
    assert buffer.stats.concealed_samples == SAMPLES


def test_single_loss_silence_mode() -> None:
    buffer = ReorderBuffer(loss_fill=LossFill.SILENCE)
    assert played(run_link([0, 1, 3, 4, 5], buffer)) == [0, 1, f"S{SAMPLES}", 3, 4, 5]


def test_burst_loss_becomes_silence() -> None:
    buffer = ReorderBuffer()
    assert played(run_link([0, 1, 5, 6, 7, 8], buffer)) == [0, 1, f"S{3 * SAMPLES}", 5, 6, 7, 8]
    assert buffer.stats.lost == 3


def test_duplicates_and_late_packets_are_dropped() -> None:
    buffer = ReorderBuffer()
    frames = run_link([0, 1, 1, 3, 4, 5, 2, 3, 6], buffer)
    assert played(frames) == [0, 1, "R1", 3, 4, 5, 6]
    assert buffer.stats.duplicate == 2
    assert buffer.stats.late == 1
    assert buffer.stats.lost == 1


def test_duplicate_while_held() -> None:
    buffer = ReorderBuffer()
    run_link([0, 2, 2], buffer, flush=False)
    assert buffer.stats.duplicate == 1


def test_reorder_ms_sets_depth() -> None:
    immediate = ReorderBuffer(reorder_ms=0)
    assert played(run_link([0, 2], immediate, flush=False)) == [0, "R0", 2]
    deep = ReorderBuffer(reorder_ms=200)
    assert played(run_link([0, 2, 3, 4, 5, 6, 7, 8, 9, 10], deep, flush=False)) == [0]
    assert played(run_link([11], deep, flush=False)) == ["R0", *range(2, 12)]


def test_flush_releases_held_packets_with_gaps() -> None:
    buffer = ReorderBuffer()
    assert played(run_link([0, 2, 5], buffer)) == [0, "R0", 2, f"S{2 * SAMPLES}", 5]
    assert buffer.stats.lost == 3


def test_talkspurt_gap_is_filled_and_capped() -> None:
    buffer = ReorderBuffer(max_gap_fill_ms=1000)
    frames = buffer.push(1, 1000, SSRC, 0, b"\x01" * SAMPLES, PacketKind.AUDIO)
    frames += buffer.push(2, 1000 + SAMPLES + 800, SSRC, 0, b"\x02" * SAMPLES, PacketKind.AUDIO)
    frames += buffer.push(3, 1000 + 10 * 60 * 8000, SSRC, 0, b"\x03" * SAMPLES, PacketKind.AUDIO)
    frames += buffer.push(4, 1000, SSRC, 0, b"\x04" * SAMPLES, PacketKind.AUDIO)
    assert played(frames) == [1, "S800", 2, "S8000", 3, 4]


def test_comfort_noise_is_silence_until_next_packet() -> None:
    buffer = ReorderBuffer()
    frames = buffer.push(1, 0, SSRC, 0, b"\x01" * SAMPLES, PacketKind.AUDIO)
    frames += buffer.push(2, SAMPLES, SSRC, 13, b"\x40", PacketKind.COMFORT_NOISE)
    frames += buffer.push(3, SAMPLES + 4000, SSRC, 0, b"\x03" * SAMPLES, PacketKind.AUDIO)
    assert played(frames) == [1, "S4000", 3]


def test_telephone_events_take_sequence_numbers_without_output() -> None:
    buffer = ReorderBuffer()
    frames = buffer.push(1, 0, SSRC, 0, b"\x01" * SAMPLES, PacketKind.AUDIO)
    for seq in (2, 3, 4):
        frames += buffer.push(seq, SAMPLES, SSRC, 101, b"\x01\x0a\x00\xa0", PacketKind.SKIP)
    frames += buffer.push(5, 4 * SAMPLES, SSRC, 0, b"\x05" * SAMPLES, PacketKind.AUDIO)
    assert played(frames) == [1, f"S{3 * SAMPLES}", 5]
    assert buffer.stats.lost == 0


def test_ssrc_change_drains_and_resets() -> None:
    buffer = ReorderBuffer()
    frames = run_link([0, 2], buffer, flush=False)
    frames += buffer.push(40000, 7, 0x9999, 0, b"\x09" * SAMPLES, PacketKind.AUDIO)
    frames += buffer.push(40001, 7 + SAMPLES, 0x9999, 0, b"\x0a" * SAMPLES, PacketKind.AUDIO)
    assert played(frames) == [0, "R0", 2, 9, 10]
    assert buffer.stats.ssrc_changes == 1
    assert buffer.ssrc == 0x9999


def test_sequence_jump_resynchronizes() -> None:
    buffer = ReorderBuffer()
    frames = run_link([0, 1], buffer, flush=False)
    frames += buffer.push(30000, packet(2)[1], SSRC, 0, b"\x02" * SAMPLES, PacketKind.AUDIO)
    frames += buffer.push(30001, packet(3)[1], SSRC, 0, b"\x03" * SAMPLES, PacketKind.AUDIO)
    assert played(frames) == [0, 1, 2, 3]
    assert buffer.stats.sequence_resets == 1
    assert buffer.stats.lost == 0


def test_far_behind_needs_two_sequential_packets_to_resync() -> None:
    buffer = ReorderBuffer()
    frames = run_link([0, 1], buffer, flush=False)
    base = packet(0)[0]
    frames += buffer.push((base - 1000) & 0xFFFF, packet(2)[1], SSRC, 0, b"\x02" * SAMPLES, PacketKind.AUDIO)
    frames += buffer.push((base - 999) & 0xFFFF, packet(3)[1], SSRC, 0, b"\x03" * SAMPLES, PacketKind.AUDIO)
    frames += buffer.push((base - 998) & 0xFFFF, packet(4)[1], SSRC, 0, b"\x04" * SAMPLES, PacketKind.AUDIO)
    assert played(frames) == [0, 1, "S160", 3, 4]
    assert buffer.stats.late == 1
    assert buffer.stats.sequence_resets == 1


@pytest.mark.parametrize("seed", range(20))
def test_fake_link_conserves_audio(seed: int) -> None:
    """A link that loses ~5% and swaps neighbours ~10% of the time: every packet plays once,
    in order, or is counted late (a swap next to a loss burst delays it past the depth), and
    the output spans the whole stream."""
    rng = random.Random(seed)
    count = 500
    sent = [n for n in range(count) if n in (0, count - 1) or rng.random() > 0.05]
    order = list(sent)
    i = 2
    while i < len(order) - 1:
        if rng.random() < 0.1:
            order[i], order[i + 1] = order[i + 1], order[i]
            i += 1
        i += 1
    buffer = ReorderBuffer(loss_fill=LossFill.SILENCE)
    frames = run_link(order, buffer)
    audio = [f.payload[0] for f in frames if f.kind is FrameKind.AUDIO]
    in_time = [n for position, n in enumerate(order) if all(m - n < 3 for m in order[:position])]
    assert audio == [n % 256 for n in sorted(in_time)]
    stats = buffer.stats
    assert stats.late == len(sent) - len(in_time)
    assert stats.lost == count - len(in_time)
    assert stats.duplicate == 0
    assert sum(f.samples for f in frames) == count * SAMPLES


def test_packets_count_in_ticks_not_bytes_when_the_codec_says_so() -> None:
    """Two bytes per tick (L16): timestamps advance by the ticks the caller gives, so in-order
    packets take the in-order path and a lost one is concealed with its length in ticks."""
    buffer = ReorderBuffer(clock_rate=16000)
    ticks, payload = 320, b"\x01\x02" * 320  # 20 ms at 16 kHz
    frames = buffer.push(1, 0, SSRC, 96, payload, PacketKind.AUDIO, ticks)
    assert buffer.push_in_order(2, ticks, SSRC, 96, payload, ticks)
    assert buffer.in_order_expectation() == (3, 2 * ticks, ticks, SSRC)
    frames += buffer.push(4, 3 * ticks, SSRC, 96, payload, PacketKind.AUDIO, ticks)
    frames += buffer.flush()
    assert [(f.kind, f.samples) for f in frames] == [
        (FrameKind.AUDIO, ticks),
        (FrameKind.REPEAT, ticks),
        (FrameKind.AUDIO, ticks),
    ]


def test_the_gap_fill_limit_follows_the_clock_rate() -> None:
    buffer = ReorderBuffer(max_gap_fill_ms=1000)
    assert buffer.max_gap_fill == 8000
    buffer.set_clock_rate(16000)
    assert buffer.max_gap_fill == 16000
