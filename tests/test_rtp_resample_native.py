"""The upsampler's C loop (`rtp._fastrtp.upsample_rows`) against the numpy matrix product it
replaces where built: the same int16 samples, bit for bit, for any rows, piece length and
sample values (full scale included, where the odd outputs clip).

tests/test_rtp_resample.py runs every resampler test on both paths as well."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rtp.resample as resample
from rtp.resample import HISTORY, upsample_rows

NATIVE = resample._native_upsample_rows
pytestmark = pytest.mark.skipif(NATIVE is None, reason="rtp._fastrtp (the C upsampler loop) is not built")


def both_paths(samples: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(C output, numpy output) of `upsample_rows` for the same float64 rows."""
    saved = resample._native_upsample_rows
    try:
        resample._native_upsample_rows = NATIVE
        native = upsample_rows(samples.copy(), n)
        resample._native_upsample_rows = None
        reference = upsample_rows(samples.copy(), n)
    finally:
        resample._native_upsample_rows = saved
    return native, reference


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 40),
    n=st.integers(0, 700),
    scale=st.sampled_from(["quiet", "speech", "full", "extremes"]),
)
def test_native_rows_equal_the_numpy_product(seed: int, rows: int, n: int, scale: str) -> None:
    """Piece lengths below, at and across BLOCK multiples; "extremes" (only -32768 / 32767)
    drives the sums to their largest magnitudes and the odd outputs into clipping."""
    rng = np.random.default_rng(seed)
    shape = (rows, HISTORY + n)
    if scale == "extremes":
        values = rng.choice(np.array([-32768, 32767]), size=shape)
    else:
        spread = {"quiet": 3.0, "speech": 4000.0, "full": 40000.0}[scale]
        values = np.clip(np.rint(rng.standard_normal(shape) * spread), -32768, 32767)
    native, reference = both_paths(values.astype(np.float64), n)
    assert native.dtype == reference.dtype == np.int16
    assert native.shape == reference.shape == (rows, 2 * n)
    np.testing.assert_array_equal(native, reference)


def test_non_contiguous_rows_are_accepted() -> None:
    """A strided view (every second row) gives the same samples as its contiguous copy."""
    rng = np.random.default_rng(7)
    n = 160
    samples = np.rint(rng.standard_normal((8, HISTORY + n)) * 3000)
    native, reference = both_paths(samples[::2], n)
    np.testing.assert_array_equal(native, reference)


def test_mismatched_buffers_are_refused() -> None:
    """The C entry point checks the buffer sizes instead of reading past them."""
    assert NATIVE is not None
    taps = resample._TAPS_FLOAT
    out = np.empty((2, 20), dtype=np.int16)
    with pytest.raises(ValueError):
        NATIVE(np.zeros((2, HISTORY + 9)), 2, 10, taps, resample._OUTPUT_SCALE, out)
    with pytest.raises(ValueError):
        NATIVE(np.zeros((2, HISTORY + 10)), 2, 10, taps[:-1], resample._OUTPUT_SCALE, out)
