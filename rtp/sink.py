"""What a leg's sink may take besides 16 kHz PCM (``asr_common.audio.PcmSink``): key presses."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from asr_common.audio import CountingPcmSink
from rtp.dtmf import KeyPress


@runtime_checkable
class DtmfSink(Protocol):
    """A sink that also wants the leg's RFC 4733 key presses (the leg checks with isinstance)."""

    def dtmf(self, press: KeyPress) -> None:
        """One key press, called on the event loop. Must not block."""


class CountingSink(CountingPcmSink):
    """Counts what arrives, key presses included; keeps the PCM only when ``keep`` is set (tests)."""

    def __init__(self, *, keep: bool = False) -> None:
        super().__init__(keep=keep)
        self.presses: list[KeyPress] = []

    def dtmf(self, press: KeyPress) -> None:
        self.presses.append(press)
