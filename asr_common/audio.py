"""The two audio rates of the service, in Hz, defined once.

Calls arrive as G.711 at ``TELEPHONE_RATE``; ``rtp`` upsamples them to ``SAMPLE_RATE``, the
rate of the fbank front end and of every WeNet model the engine serves. One sample at
``SAMPLE_RATE`` is 1/16 ms, so a 10 ms fbank shift is 160 samples. ``PcmSink`` is where a
call leg's audio goes at that rate, whichever front door received it.
"""

from typing import Protocol

import numpy as np

SAMPLE_RATE = 16_000
"""Hz: the engine's input, the fbank's ``sample_frequency`` (WeNet's models are trained at it)."""

TELEPHONE_RATE = 8_000
"""Hz: narrowband telephone audio (G.711 PCMU/PCMA), as calls and 8 kHz recordings deliver it."""


class PcmSink(Protocol):
    """Where a call leg's audio goes: ``SAMPLE_RATE`` mono int16 PCM pieces of any length.

    The application hands one back per leg (``calls.handler.CallHandler.open_leg``) and the
    front door that receives the leg's media (``rtp.leg.RtpLeg``) writes into it.
    """

    def accept_waveform(self, samples: np.ndarray) -> None:
        """Take int16 samples at 16 kHz, mono, shape (N,), N >= 0. Must not block."""

    def input_finished(self) -> None:
        """No more audio will come; called exactly once per leg."""


class CountingPcmSink:
    """A ``PcmSink`` that counts what arrives; keeps the PCM itself only when ``keep`` is set (tests)."""

    def __init__(self, *, keep: bool = False) -> None:
        self.samples = 0
        self.pieces = 0
        self.finished = 0
        self._keep = keep
        self._kept: list[np.ndarray] = []

    def accept_waveform(self, samples: np.ndarray) -> None:
        self.samples += len(samples)
        self.pieces += 1
        if self._keep:
            self._kept.append(samples.copy())

    def input_finished(self) -> None:
        self.finished += 1

    @property
    def pcm(self) -> np.ndarray:
        """All kept samples, shape (samples,), int16."""
        if not self._kept:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(self._kept)
