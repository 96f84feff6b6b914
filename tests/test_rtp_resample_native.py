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


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 4), n=st.integers(0, 200))
def test_asymmetric_taps_take_the_general_loop_and_stay_exact(seed: int, rows: int, n: int) -> None:
    """The loop folds symmetric taps; other taps (not the module's, but accepted) must still
    give the int64 dot products, rounded and clipped as the numpy path does."""
    assert NATIVE is not None
    rng = np.random.default_rng(seed)
    taps = rng.integers(-(2**20), 2**20, size=2 * resample.TAPS_PER_SIDE).astype(np.int64)
    samples = rng.integers(-32768, 32768, size=(rows, HISTORY + n)).astype(np.int64)
    out = np.empty((rows, 2 * n), dtype=np.int16)
    NATIVE(samples.astype(np.float64), rows, n, taps.astype(np.float64), resample._OUTPUT_SCALE, out)
    sums = np.stack([np.correlate(row, taps, mode="valid")[:n] for row in samples]).reshape(rows, n)
    odd = np.clip(np.rint(sums.astype(np.float64) * resample._OUTPUT_SCALE), -32768, 32767)
    np.testing.assert_array_equal(out[:, 1::2], odd)
    np.testing.assert_array_equal(out[:, 0::2], samples[:, resample.TAPS_PER_SIDE - 1 : resample.TAPS_PER_SIDE - 1 + n])
