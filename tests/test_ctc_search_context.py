"""The prefix beam search with a hotwords context graph: no graph (or an all-zero one) leaves
WeNet's results untouched on the golden fixture, and a phrase the acoustics half-support wins."""

from __future__ import annotations

import numpy as np
import pytest

import asr_core.ctc_search as ctc_search
from asr_core.context_graph import ContextGraph
from asr_core.ctc_search import Hypothesis, ctc_prefix_beam_search_topk, ctc_topk
from tests.test_ctc_search import FIXTURE, MODES, UTTS, ctc_log_probs, needs_fixture

__all__ = ["ctc_log_probs"]  # the fixture, re-used


def numpy_search(values: np.ndarray, ids: np.ndarray, beam: int, context: ContextGraph | None) -> list[Hypothesis]:
    saved = ctc_search._native_prefix_beam_search
    ctc_search._native_prefix_beam_search = None
    try:
        return ctc_prefix_beam_search_topk(values, ids, beam, 0, context)
    finally:
        ctc_search._native_prefix_beam_search = saved


@needs_fixture
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("utt", UTTS)
def test_zero_bonus_graph_is_bit_identical_on_the_fixture(
    ctc_log_probs: dict[tuple[str, str], np.ndarray], utt: str, mode: str
) -> None:
    """A graph whose bonuses are all 0 must not change tokens, order, scores or times."""
    values, ids = ctc_topk(ctc_log_probs[(utt, mode)], 10)
    plain = ctc_prefix_beam_search_topk(values, ids, 10)
    best = plain[0].tokens
    graph = ContextGraph([(best[:3], 0.0), (best[2:6], 0.0), ((1, 2, 3), 0.0)])
    assert numpy_search(values, ids, 10, graph) == plain
    assert numpy_search(values, ids, 10, None) == plain
    assert ctc_prefix_beam_search_topk(values, ids, 10, context=ContextGraph([])) == plain
    assert FIXTURE.exists()


def frames(rows: list[dict[int, float]], vocab: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """(T, V) posteriors from per-frame {token: probability}; the rest shared evenly."""
    lp = np.empty((len(rows), vocab))
    for t, row in enumerate(rows):
        rest = (1.0 - sum(row.values())) / (vocab - len(row))
        lp[t] = np.log([row.get(v, rest) for v in range(vocab)])
    return ctc_topk(lp, vocab)


def test_a_hotword_overturns_a_close_call() -> None:
    # Token 2 vs 3 at the middle frame, 3 slightly ahead; the phrase (1, 2, 4) tips it.
    values, ids = frames([{1: 0.9}, {0: 0.9}, {3: 0.5, 2: 0.4}, {0: 0.9}, {4: 0.9}])
    plain = numpy_search(values, ids, 4, None)
    assert plain[0].tokens == (1, 3, 4)
    graph = ContextGraph([((1, 2, 4), 1.0)])
    biased = numpy_search(values, ids, 4, graph)
    assert biased[0].tokens == (1, 2, 4)
    assert biased[0].context_score == 3.0
    assert {h.tokens: h.score for h in biased}[(1, 3, 4)] == {h.tokens: h.score for h in plain}[(1, 3, 4)]
    assert {h.tokens: h.context_score for h in biased}[(1, 3, 4)] == 0.0  # taken back


def test_an_unfinished_phrase_gets_nothing_at_the_end() -> None:
    values, ids = frames([{1: 0.9}, {0: 0.9}, {3: 0.5, 2: 0.4}])
    biased = numpy_search(values, ids, 4, ContextGraph([((1, 2, 4), 1.0)]))
    assert biased[0].tokens == (1, 3)  # (1, 2) led the beam, but its bonus is taken back
    assert all(h.context_score == 0.0 for h in biased)
