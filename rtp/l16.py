"""L16 (RFC 3551 4.5.11): linear 16-bit PCM, big-endian (network order), at the rate its SDP
rtpmap names (``L16/8000``, ``L16/16000``; dynamic payload types). One sample is one RTP
timestamp tick and two payload bytes; mono only. Lossless and stateless, so decoding is a
byte swap; a payload of odd length has its last byte ignored.
"""

from __future__ import annotations

import numpy as np

_WIRE = np.dtype(">i2")


class L16Decoder:
    """Payload bytes -> int16 PCM at the stream's rate, shape (len(payload) // 2,)."""

    __slots__ = ()

    def decode(self, payload: bytes) -> np.ndarray:
        usable = len(payload) & ~1
        return np.frombuffer(payload, dtype=_WIRE, count=usable // 2).astype(np.int16)


class L16Encoder:
    """int16 PCM, shape (samples,) -> payload bytes (test senders, benchmarks)."""

    __slots__ = ()

    def encode(self, pcm: np.ndarray) -> bytes:
        return np.ascontiguousarray(pcm, dtype=np.int16).astype(_WIRE).tobytes()
