import numpy as np
import pytest

from rtp.resample import Upsampler


def tone(hz: float, samples: int, rate: int = 8000) -> np.ndarray:
    return (np.sin(2 * np.pi * hz * np.arange(samples) / rate) * 12000).astype(np.int16)


def upsample_in_pieces(x: np.ndarray, sizes: list[int], *, low_latency: bool = False) -> np.ndarray:
    upsampler = Upsampler(low_latency=low_latency)
    pieces = []
    start = 0
    for size in sizes:
        out = upsampler.process(x[start : start + size])
        assert out.dtype == np.int16
        pieces.append(out)
        start += size
    pieces.append(upsampler.process(x[start:]))
    pieces.append(upsampler.flush())
    return np.concatenate(pieces)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("low_latency", [False, True])
def test_pieces_of_any_size_match_one_call(seed: int, low_latency: bool) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(8000) * 4000).astype(np.int16)
    whole = upsample_in_pieces(x, [], low_latency=low_latency)
    sizes = [int(s) for s in rng.integers(0, 400, size=40)]
    pieced = upsample_in_pieces(x, sizes, low_latency=low_latency)
    assert len(whole) == len(pieced) == 16000
    # soxr rounds its float internals to int16 per output block; block edges move with the
    # piece sizes, so samples may differ by a couple of LSB, never more.
    assert np.abs(whole.astype(np.int32) - pieced).max() <= 2


def test_tone_keeps_frequency_and_level() -> None:
    y = upsample_in_pieces(tone(440, 8000), [160] * 49)
    assert len(y) == 16000
    spectrum = np.abs(np.fft.rfft(y.astype(np.float64)))
    assert np.argmax(spectrum) == 440  # 1 s at 16 kHz: bin width 1 Hz
    body = y[1000:-1000].astype(np.float64)
    assert abs(np.sqrt(np.mean(body**2)) - 12000 / np.sqrt(2)) < 100


def test_telephone_band_edge_passes() -> None:
    y = upsample_in_pieces(tone(3400, 8000), [160] * 49)
    body = y[1000:-1000].astype(np.float64)
    assert np.sqrt(np.mean(body**2)) > 0.97 * 12000 / np.sqrt(2)


def test_process_after_flush_is_an_error() -> None:
    upsampler = Upsampler()
    upsampler.flush()
    assert len(upsampler.flush()) == 0
    with pytest.raises(RuntimeError, match="after flush"):
        upsampler.process(np.zeros(160, dtype=np.int16))
