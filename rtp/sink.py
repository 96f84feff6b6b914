"""Where a leg's audio goes: 16 kHz mono int16 PCM pieces of any length."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from rtp.dtmf import KeyPress


class PcmSink(Protocol):
    def accept_waveform(self, samples: np.ndarray) -> None:
        """Take int16 samples at 16 kHz, mono, shape (N,), N >= 0. Must not block."""

    def input_finished(self) -> None:
        """No more audio will come; called exactly once per leg."""


@runtime_checkable
class DtmfSink(Protocol):
    """A sink that also wants the leg's RFC 4733 key presses (the leg checks with isinstance)."""

    def dtmf(self, press: KeyPress) -> None:
        """One key press, called on the event loop. Must not block."""


class CountingSink:
    """Counts what arrives; keeps the PCM itself only when `keep` is set (tests)."""

    def __init__(self, *, keep: bool = False) -> None:
        self.samples = 0
        self.pieces = 0
        self.finished = 0
        self.presses: list[KeyPress] = []
        self._keep = keep
        self._kept: list[np.ndarray] = []

    def accept_waveform(self, samples: np.ndarray) -> None:
        self.samples += len(samples)
        self.pieces += 1
        if self._keep:
            self._kept.append(samples.copy())

    def input_finished(self) -> None:
        self.finished += 1

    def dtmf(self, press: KeyPress) -> None:
        self.presses.append(press)

    @property
    def pcm(self) -> np.ndarray:
        """All kept samples, shape (samples,), int16."""
        if not self._kept:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(self._kept)
