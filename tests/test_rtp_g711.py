import warnings

import numpy as np
import pytest

from rtp import g711


def itu_ulaw(code: int) -> int:
    """G.711 table 2a, scaled to 16 bits: value = (2m + 33) * 2^e - 33, times 4, sign from bit 7."""
    inverted = ~code & 0xFF
    exponent, mantissa = (inverted >> 4) & 7, inverted & 0x0F
    magnitude = ((2 * mantissa + 33) * 2**exponent - 33) * 4
    return -magnitude if inverted & 0x80 else magnitude


def itu_alaw(code: int) -> int:
    """G.711 table 1a, scaled to 16 bits: (2m + 1) in segment 0, (2m + 33) * 2^(s-1) above, times 8."""
    toggled = code ^ 0x55
    segment, mantissa = (toggled >> 4) & 7, toggled & 0x0F
    magnitude = (2 * mantissa + 1) * 8 if segment == 0 else (2 * mantissa + 33) * 2 ** (segment - 1) * 8
    return magnitude if toggled & 0x80 else -magnitude


def test_decode_tables_match_itu_formula() -> None:
    assert g711.ULAW_DECODE.tolist() == [itu_ulaw(code) for code in range(256)]
    assert g711.ALAW_DECODE.tolist() == [itu_alaw(code) for code in range(256)]


def test_known_values() -> None:
    assert g711.decode_ulaw(bytes([0xFF, 0x7F, 0x00, 0x80, 0xEF])).tolist() == [0, 0, -32124, 32124, 132]
    assert g711.decode_alaw(bytes([0xD5, 0x55, 0xAA, 0x2A])).tolist() == [8, -8, 32256, -32256]
    assert g711.decode_ulaw(bytes([g711.ULAW_SILENCE]))[0] == 0
    assert g711.encode_ulaw(np.array([0, 32767, -32768], dtype=np.int16)) == bytes([0xFF, 0x80, 0x00])
    assert g711.encode_alaw(np.array([0, 32767, -32768], dtype=np.int16)) == bytes([0xD5, 0xAA, 0x2A])


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
def test_encode_decode_round_trip(codec: str) -> None:
    codes = bytes(range(256))
    decoded = g711.decode(codec, codes)
    reencoded = g711.encode(codec, decoded)
    # mu-law has two zeros (0x7F and 0xFF); both decode to 0, which encodes to 0xFF.
    assert g711.decode(codec, reencoded).tolist() == decoded.tolist()
    assert decoded.dtype == np.int16


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
def test_quantization_error_is_bounded(codec: str) -> None:
    samples = np.arange(-32768, 32768, 7, dtype=np.int32).astype(np.int16)
    error = np.abs(g711.decode(codec, g711.encode(codec, samples)).astype(np.int32) - samples)
    # step size of the top segment is 1024 (mu-law) / 1024 (A-law); half a step plus clipping
    assert error.max() <= 1024


def test_matches_audioop_where_available() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop", reason="audioop was removed in Python 3.13")
    codes = bytes(range(256))
    assert np.frombuffer(audioop.ulaw2lin(codes, 2), np.int16).tolist() == g711.decode_ulaw(codes).tolist()
    assert np.frombuffer(audioop.alaw2lin(codes, 2), np.int16).tolist() == g711.decode_alaw(codes).tolist()
    every = np.arange(1 << 16, dtype=np.uint16).view(np.int16)
    assert audioop.lin2ulaw(every.tobytes(), 2) == g711.encode_ulaw(every)
    assert audioop.lin2alaw(every.tobytes(), 2) == g711.encode_alaw(every)
