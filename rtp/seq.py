"""Modular arithmetic for RTP's 16-bit sequence numbers and 32-bit timestamps (RFC 3550 A.1).

An *extended* sequence number counts wraparounds: it keeps increasing past 65535, so
buffers can key and compare packets with plain integers.
"""

from __future__ import annotations

SEQ_MODULO = 1 << 16
TIMESTAMP_MODULO = 1 << 32


def seq_diff(a: int, b: int) -> int:
    """Signed distance a - b of two 16-bit sequence numbers, in [-32768, 32767]."""
    return (a - b + 0x8000) % SEQ_MODULO - 0x8000


def seq_gt(a: int, b: int) -> bool:
    """True when sequence number a comes after b (wraparound aware)."""
    return seq_diff(a, b) > 0


def timestamp_diff(a: int, b: int) -> int:
    """Signed distance a - b of two 32-bit RTP timestamps, in clock ticks (samples for G.711)."""
    return (a - b + 0x80000000) % TIMESTAMP_MODULO - 0x80000000


class SequenceUnwrapper:
    """Maps 16-bit sequence numbers to extended ones, relative to the highest seen so far.

    The first number maps to itself plus one cycle (65536), so packets that arrive slightly
    before it in sequence still get non-negative extended numbers.
    """

    __slots__ = ("highest",)

    def __init__(self) -> None:
        self.highest: int | None = None

    def extend(self, seq: int) -> int:
        if self.highest is None:
            self.highest = SEQ_MODULO + seq
            return self.highest
        extended = self.highest + seq_diff(seq, self.highest & 0xFFFF)
        if extended > self.highest:
            self.highest = extended
        return extended

    def reset(self) -> None:
        self.highest = None
