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
from asr_core.context_graph import ContextGraph
from asr_core.ctc_search import Hypothesis, ctc_prefix_beam_search_topk, ctc_topk

NATIVE = ctc_search._native_prefix_beam_search
pytestmark = pytest.mark.skipif(NATIVE is None, reason="asr_core._fastctc (the C prefix search) is not built")


def numpy_search(
    values: np.ndarray, ids: np.ndarray, beam: int, blank: int, context: ContextGraph | None = None
) -> list[Hypothesis]:
    """The numpy search, as it runs where the extension is missing."""
    saved = ctc_search._native_prefix_beam_search
    ctc_search._native_prefix_beam_search = None
    try:
        return ctc_prefix_beam_search_topk(values, ids, beam, blank, context)
    finally:
        ctc_search._native_prefix_beam_search = saved


def posteriors(rng: np.random.Generator, frames: int, vocab: int, spread: float, blank_bias: float) -> np.ndarray:
    logits = rng.normal(0.0, spread, (frames, vocab))
    logits[:, 0] += blank_bias
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


def assert_same(
    values: np.ndarray, ids: np.ndarray, beam: int, blank: int = 0, context: ContextGraph | None = None
) -> list[Hypothesis]:
    native = ctc_prefix_beam_search_topk(values, ids, beam, blank, context)
    reference = numpy_search(values, ids, beam, blank, context)
    assert [h.tokens for h in native] == [h.tokens for h in reference]
    assert [h.times for h in native] == [h.times for h in reference]
    assert [h.score for h in native] == [h.score for h in reference]  # exactly, not approximately
    assert [h.context_score for h in native] == [h.context_score for h in reference]
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


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    frames=st.integers(0, 40),
    vocab=st.integers(2, 7),
    beam=st.integers(1, 8),
    spread=st.sampled_from([0.3, 2.0, 8.0]),
    phrases=st.lists(
        st.tuples(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.sampled_from([0.0, 0.5, 1.5, 4.0])),
        max_size=6,
    ),
)
def test_native_search_with_a_context_graph_equals_the_numpy_search(
    seed: int, frames: int, vocab: int, beam: int, spread: float, phrases: list[tuple[list[int], float]]
) -> None:
    """Hotword phrases over the same small vocabulary: overlapping phrases, phrases that are
    prefixes of others, take-backs; C and numpy keep the same beam and bonuses, bit for bit."""
    lp = posteriors(np.random.default_rng(seed), frames, vocab, spread, 0.0)
    values, ids = ctc_topk(lp, vocab)
    assert_same(values, ids, beam, context=ContextGraph(phrases))


def test_context_graph_on_a_long_utterance() -> None:
    """Many phrases over a large vocabulary, built from the search's own n-best so they match."""
    rng = np.random.default_rng(3)
    values, ids = ctc_topk(posteriors(rng, 1500, 3000, 4.0, 0.0), 10)
    plain = ctc_prefix_beam_search_topk(values, ids, 10)
    tokens = plain[0].tokens
    phrases = [(tokens[i : i + n], 1.0) for i in range(0, len(tokens) - 6, 3) for n in (2, 5)]
    phrases += [(tuple(rng.integers(1, 3000, size=4).tolist()), 2.0) for _ in range(1000)]
    nbest = assert_same(values, ids, beam=10, context=ContextGraph(phrases))
    assert nbest[0].context_score > 0


def test_bad_graph_arrays() -> None:
    values, ids = np.zeros((3, 2)), np.zeros((3, 2), dtype=np.int64)
    flat = ContextGraph([((1, 2), 1.0)]).arrays()
    assert NATIVE(values, ids, 2, 0, flat)
    with pytest.raises(ValueError, match="6-tuple"):
        NATIVE(values, ids, 2, 0, flat[:5])
    with pytest.raises(ValueError, match="graph fail"):
        NATIVE(values, ids, 2, 0, (*flat[:3], flat[3][:-1], *flat[4:]))
    broken = flat[2].copy()
    broken[0] = 99
    with pytest.raises(ValueError, match="not a trie"):
        NATIVE(values, ids, 2, 0, (flat[0], flat[1], broken, *flat[3:]))


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


FORWARD = ctc_search._native_ctc_forward


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    frames=st.integers(1, 40),
    classes=st.integers(1, 8),
    count=st.integers(0, 6),
    longest=st.integers(0, 25),
    spread=st.sampled_from([0.3, 3.0, 30.0]),
)
def test_native_ctc_forward_equals_torch_ctc_loss(
    seed: int, frames: int, classes: int, count: int, longest: int, spread: float
) -> None:
    """The C forward against torch's ctc_loss: repeats (which need a blank between them), empty
    label sequences, sequences too long for the frames (-inf), a blank that is not class 0."""
    rng = np.random.default_rng(seed)
    emissions = posteriors(rng, frames, classes, spread, 0.0)
    blank = int(rng.integers(0, classes))
    tokens = [c for c in range(classes) if c != blank] or [blank]
    labels = np.zeros((count, max(longest, 1)), dtype=np.int64)
    lengths = rng.integers(0, longest + 1, size=count).astype(np.int64)
    for n in range(count):
        pool = tokens[: int(rng.integers(1, len(tokens) + 1))]  # few classes: many repeats
        labels[n, : lengths[n]] = rng.choice(pool, size=int(lengths[n]))
    if tokens == [blank]:
        lengths[:] = 0  # a blank-only model can only say nothing
    native = FORWARD(emissions, labels, lengths, blank)
    reference = ctc_search.ctc_forward_reference(emissions, labels, lengths, blank)
    assert len(native) == count
    for got, want in zip(native, reference, strict=True):
        if want == float("-inf"):
            assert got == want
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_native_ctc_forward_bad_arrays() -> None:
    em = np.log(np.full((4, 3), 1 / 3))
    labels, lengths = np.array([[1, 2]], dtype=np.int64), np.array([2], dtype=np.int64)
    (score,) = FORWARD(em, labels, lengths, 0)
    assert score == pytest.approx(ctc_search.ctc_forward_reference(em, labels, lengths, 0)[0])
    with pytest.raises(ValueError, match="emissions must be"):
        FORWARD(em.astype(np.float32), labels, lengths, 0)
    with pytest.raises(ValueError, match="lengths must be"):
        FORWARD(em, labels, np.array([2, 2], dtype=np.int64), 0)
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        FORWARD(em, labels, np.array([3], dtype=np.int64), 0)
    with pytest.raises(ValueError, match="class outside"):
        FORWARD(em, np.array([[1, 7]], dtype=np.int64), lengths, 0)
    with pytest.raises(ValueError, match="blank class"):
        FORWARD(em, labels, lengths, 3)
    with pytest.raises(ValueError, match="at least one frame"):
        FORWARD(np.zeros((0, 3)), labels, lengths, 0)
