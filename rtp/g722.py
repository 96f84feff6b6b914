"""G.722 (ITU-T, 64 kbit/s) through the ``G722`` library: wideband audio straight at 16 kHz.

RFC 3551 keeps a quirk for G.722: the SDP says ``G722/8000`` and RTP timestamps advance 8000
per second, although the audio is sampled at 16 kHz. At 64 kbit/s one payload byte is one
timestamp tick and two 16 kHz samples, so the reorder buffer's "samples" (ticks, payload
length) stay right for G.722 as for G.711. The decoder keeps state (ADPCM predictors), so a
leg keeps one decoder and feeds it the stream in order.
"""

from __future__ import annotations

import numpy as np
from G722 import G722

SAMPLE_RATE = 16000
BITRATE = 64000
SAMPLES_PER_TICK = 2
"""16 kHz samples per RTP timestamp tick (and per payload byte at 64 kbit/s)."""


class G722Decoder:
    """One stream's decoder: payload bytes in order -> int16 PCM at 16 kHz."""

    __slots__ = ("_codec",)

    def __init__(self) -> None:
        self._codec = G722(SAMPLE_RATE, BITRATE)

    def decode(self, payload: bytes) -> np.ndarray:
        if not payload:
            return np.zeros(0, dtype=np.int16)
        return np.frombuffer(self._codec.decode(payload), dtype=np.int16).copy()


class G722Encoder:
    """One stream's encoder (test senders, benchmarks): int16 PCM at 16 kHz -> payload bytes."""

    __slots__ = ("_codec",)

    def __init__(self) -> None:
        self._codec = G722(SAMPLE_RATE, BITRATE)

    def encode(self, pcm16k: np.ndarray) -> bytes:
        data: bytes = self._codec.encode(np.ascontiguousarray(pcm16k, dtype=np.int16))
        return data
