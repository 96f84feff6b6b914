"""RFC 4733 telephone-events (DTMF keys sent as RTP packets, not tones), read into key presses.

A key press is one event: every packet of it carries the RTP timestamp of its start, the
duration so far grows, and the last packet (End bit set) is usually sent three times. A press
is reported once, when its first End packet arrives, or when a packet of a newer event shows
that the old one's End packets were all lost, or when the stream closes (`flush`).
Telephone-event packets are never audio: the leg counts them and hands them here only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_PAYLOAD = struct.Struct("!BBH")
_END_BIT = 0x80
KEYS = "0123456789*#ABCD"
"""The DTMF keys by event code 0-15 (RFC 4733 section 3.2); code 16 is a hook flash."""


def key_name(code: int) -> str:
    """``"0"``-``"9"``, ``"*"``, ``"#"``, ``"A"``-``"D"``, ``"flash"``, or ``"event-N"`` for other codes."""
    if code < len(KEYS):
        return KEYS[code]
    return "flash" if code == 16 else f"event-{code}"


@dataclass(frozen=True, slots=True)
class KeyPress:
    """One telephone-event: the key, its duration (ms, from the event's RTP clock) and RTP timestamp."""

    key: str
    duration_ms: int
    timestamp: int


class TelephoneEvents:
    """Turns one leg's telephone-event payloads into `KeyPress`es (sans-IO)."""

    __slots__ = ("_current", "_reported", "bad_payloads", "clock_rate", "presses")

    def __init__(self, clock_rate: int = 8000) -> None:
        self.clock_rate = clock_rate
        """Hz of the RTP clock that durations count in (the stream's telephone-event rtpmap)."""
        # (ssrc, timestamp, code, duration) of the event not yet reported
        self._current: tuple[int, int, int, int] | None = None
        self._reported: tuple[int, int] | None = None  # (ssrc, timestamp) of the last one reported
        self.presses = 0
        self.bad_payloads = 0

    def feed(self, ssrc: int, timestamp: int, payload: bytes) -> list[KeyPress]:
        """One packet's payload; returns the presses it completes (usually none or one)."""
        if len(payload) < _PAYLOAD.size:
            self.bad_payloads += 1
            return []
        code, flags, duration = _PAYLOAD.unpack_from(payload)
        if (ssrc, timestamp) == self._reported:
            return []  # a repeated End packet, or a late one, of a press already reported
        done: list[KeyPress] = []
        current = self._current
        if current is not None and current[:2] != (ssrc, timestamp):
            done.append(self._report(current))  # the old event's End packets never came
            current = None
        longest = max(duration, current[3]) if current is not None else duration
        self._current = (ssrc, timestamp, code, longest)
        if flags & _END_BIT:
            done.append(self._report(self._current))
        return done

    def flush(self) -> KeyPress | None:
        """The press still open when the stream ends (its End packets lost), if any."""
        return self._report(self._current) if self._current is not None else None

    def _report(self, event: tuple[int, int, int, int]) -> KeyPress:
        ssrc, timestamp, code, duration = event
        self._current = None
        self._reported = (ssrc, timestamp)
        self.presses += 1
        return KeyPress(key_name(code), duration * 1000 // self.clock_rate, timestamp)
