"""The C prefix beam search (`asr_core._fastctc`) against the numpy one it replaces where built:
the same hypotheses, in the same order, with the same scores and token times, bit for bit.

tests/test_ctc_search.py checks whichever search runs against WeNet's own loop; with the
extension built that is the C one, so both are held to WeNet's results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asr_core.ctc_search as ctc_search
from asr_core.ctc_search import Hypothesis, ctc_prefix_beam_search_topk, ctc_topk

NATIVE = ctc_search._native_prefix_beam_search
pytestmark = pytest.mark.skipif(NATIVE is None, reason="asr_core._fastctc (the C prefix search) is not built")


def numpy_search(values: np.ndarray, ids: np.ndarray, beam: int, blank: int) -> list[Hypothesis]:
    """The numpy search, as it runs where the extension is missing."""
    saved = ctc_search._native_prefix_beam_search
    ctc_search._native_prefix_beam_search = None
    try:
        return ctc_prefix_beam_search_topk(values, ids, beam, blank)
    finally:
        ctc_search._native_prefix_beam_search = saved


def posteriors(rng: np.random.Generator, frames: int, vocab: int, spread: float, blank_bias: float) -> np.ndarray:
    logits = rng.normal(0.0, spread, (frames, vocab))
    logits[:, 0] += blank_bias
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


def assert_same(values: np.ndarray, ids: np.ndarray, beam: int, blank: int = 0) -> list[Hypothesis]:
    native = ctc_prefix_beam_search_topk(values, ids, beam, blank)
    reference = numpy_search(values, ids, beam, blank)
    assert [h.tokens for h in native] == [h.tokens for h in reference]
    assert [h.times for h in native] == [h.times for h in reference]
    assert [h.score for h in native] == [h.score for h in reference]  # exactly, not approximately
    return native


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    frames=st.integers(0, 60),
    vocab=st.integers(2, 9),
    k=st.integers(1, 10),
    beam=st.integers(1, 10),
    spread=st.sampled_from([0.3, 2.0, 8.0]),
    blank_bias=st.sampled_from([0.0, 3.0]),
)
def test_native_search_equals_the_numpy_search(
    seed: int, frames: int, vocab: int, k: int, beam: int, spread: float, blank_bias: float
) -> None:
    """Small vocabularies force repeats, merges and prefixes that leave the beam and come back;
    k below and above the beam size."""
    lp = posteriors(np.random.default_rng(seed), frames, vocab, spread, blank_bias)
    values, ids = ctc_topk(lp, min(k, vocab))
    assert_same(values, ids, beam)


def test_long_utterance_with_a_large_vocabulary() -> None:
    """Thousands of frames and a 4,000-token vocabulary: the trie and the token-time cells grow
    far past their first allocation; a blank id other than 0."""
    rng = np.random.default_rng(7)
    lp = posteriors(rng, 3000, 4000, 4.0, 0.0)
    lp[:, [0, 5]] = lp[:, [5, 0]]  # blank is 5
    values, ids = ctc_topk(lp, 10)
    nbest = assert_same(values, ids, beam=10, blank=5)
    assert len(nbest) == 10 and len(nbest[0].tokens) > 100


def test_empty_input_and_bad_arrays() -> None:
    nbest = assert_same(np.zeros((0, 4), dtype=np.float32), np.zeros((0, 4), dtype=np.int64), beam=4)
    assert nbest == [Hypothesis((), 0.0, ())]
    values = np.zeros((3, 2))
    with pytest.raises(ValueError, match="values must be"):
        NATIVE(values.astype(np.float32), np.zeros((3, 2), dtype=np.int64), 2, 0)
    with pytest.raises(ValueError, match="ids must be"):
        NATIVE(values, np.zeros((3, 2), dtype=np.int32), 2, 0)
    with pytest.raises(ValueError, match="same shape"):
        NATIVE(values, np.zeros((3, 3), dtype=np.int64), 2, 0)
    with pytest.raises(ValueError, match="C-contiguous"):
        NATIVE(np.zeros((2, 3)).T, np.zeros((3, 2), dtype=np.int64), 2, 0)
    with pytest.raises(ValueError, match="beam"):
        NATIVE(values, np.zeros((3, 2), dtype=np.int64), 0, 0)
