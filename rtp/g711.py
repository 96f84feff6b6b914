"""G.711 mu-law (PCMU) and A-law (PCMA) codecs as numpy lookup tables.

Decoding is one fancy-indexing call, `table[np.frombuffer(payload, np.uint8)]`, so several
packets decode together by joining their payloads first. Values follow ITU-T G.711 scaled to
16 bits (the same numbers as CPython's former `audioop`): mu-law spans +-32124, A-law +-32256.
The encoders are 65536-entry tables indexed by the int16 sample viewed as uint16.
"""

from __future__ import annotations

import numpy as np

_ULAW_BIAS = 0x84
_ULAW_CLIP_14BIT = 8159
_ULAW_SEGMENT_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEGMENT_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _ulaw_decode_table() -> np.ndarray:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    magnitude = (((code & 0x0F) << 3) + _ULAW_BIAS) << ((code & 0x70) >> 4)
    return np.where(code & 0x80, _ULAW_BIAS - magnitude, magnitude - _ULAW_BIAS).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    segment = (code & 0x70) >> 4
    mantissa = (code & 0x0F) << 4
    magnitude = np.where(segment == 0, mantissa + 8, (mantissa + 0x108) << np.maximum(segment - 1, 0))
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


def _all_int16() -> np.ndarray:
    """Every int16 value, ordered by its uint16 bit pattern (the encoder tables' index)."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.int16).astype(np.int32)


def _ulaw_encode_table() -> np.ndarray:
    value = _all_int16() >> 2
    mask = np.where(value < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(value), _ULAW_CLIP_14BIT) + (_ULAW_BIAS >> 2)
    segment = np.searchsorted(_ULAW_SEGMENT_END, magnitude)
    code = (segment << 4) | ((magnitude >> (segment + 1)) & 0x0F)
    return (np.where(segment >= 8, 0x7F, code) ^ mask).astype(np.uint8)


def _alaw_encode_table() -> np.ndarray:
    value = _all_int16() >> 3
    negative = value < 0
    mask = np.where(negative, 0x55, 0xD5)
    magnitude = np.where(negative, -value - 1, value)
    segment = np.searchsorted(_ALAW_SEGMENT_END, magnitude)
    shift = np.where(segment < 2, 1, segment)
    code = (segment << 4) | ((magnitude >> shift) & 0x0F)
    return (np.where(segment >= 8, 0x7F, code) ^ mask).astype(np.uint8)


ULAW_DECODE = _ulaw_decode_table()
ALAW_DECODE = _alaw_decode_table()
ULAW_ENCODE = _ulaw_encode_table()
ALAW_ENCODE = _alaw_encode_table()

DECODE_TABLES: dict[str, np.ndarray] = {"PCMU": ULAW_DECODE, "PCMA": ALAW_DECODE}
ENCODE_TABLES: dict[str, np.ndarray] = {"PCMU": ULAW_ENCODE, "PCMA": ALAW_ENCODE}

ULAW_SILENCE = 0xFF
ALAW_SILENCE = 0xD5


def decode(codec: str, payload: bytes) -> np.ndarray:
    """G.711 bytes -> int16 samples, shape (len(payload),). codec is "PCMU" or "PCMA"."""
    return DECODE_TABLES[codec][np.frombuffer(payload, dtype=np.uint8)]


def encode(codec: str, samples: np.ndarray) -> bytes:
    """int16 samples, shape (N,) -> N bytes of G.711. codec is "PCMU" or "PCMA"."""
    index = np.ascontiguousarray(samples, dtype=np.int16).view(np.uint16)
    return ENCODE_TABLES[codec][index].tobytes()


def decode_ulaw(payload: bytes) -> np.ndarray:
    return ULAW_DECODE[np.frombuffer(payload, dtype=np.uint8)]


def decode_alaw(payload: bytes) -> np.ndarray:
    return ALAW_DECODE[np.frombuffer(payload, dtype=np.uint8)]


def encode_ulaw(samples: np.ndarray) -> bytes:
    return encode("PCMU", samples)


def encode_alaw(samples: np.ndarray) -> bytes:
    return encode("PCMA", samples)
