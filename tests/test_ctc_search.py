"""CTC greedy and prefix beam search against WeNet's outputs in the golden fixture, and the
vectorized prefix search against a line-by-line port of WeNet's loop on random posteriors."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asr_core.ctc_search import (
    ctc_greedy_batch,
    ctc_prefix_beam_search,
    ctc_prefix_beam_search_topk,
    ctc_topk,
)

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
needs_fixture = pytest.mark.skipif(
    not (FIXTURE / "decoding.json").exists(), reason=f"golden fixture not found at {FIXTURE}"
)
MODES = ["full", "stream_c8_l-1"]
UTTS = ["utt1", "utt2"]


def score_ok(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-3, 1e-5 * abs(b))


@pytest.fixture(scope="module")
def decoding() -> dict[str, Any]:
    with open(FIXTURE / "decoding.json", encoding="utf-8") as f:
        result: dict[str, Any] = json.load(f)
    return result


@pytest.fixture(scope="module")
def ctc_log_probs() -> dict[tuple[str, str], np.ndarray]:
    """Stored CTC log-probs; for streaming (8,-1), the fixture's CTC head on the stored encoder output."""
    torch.set_num_threads(1)
    arrays = np.load(FIXTURE / "expected.npz")
    state = torch.load(FIXTURE / "model" / "final.pt", map_location="cpu", weights_only=True)
    result = {}
    for utt in UTTS:
        result[(utt, "full")] = arrays[f"{utt}__ctc_logprobs_full"]
        enc = torch.from_numpy(arrays[f"{utt}__encoder_out_stream_c8_l-1"])  # (T, D)
        logits = torch.nn.functional.linear(enc, state["ctc.ctc_lo.weight"], state["ctc.ctc_lo.bias"])
        result[(utt, "stream_c8_l-1")] = logits.log_softmax(-1).numpy()
    return result


@needs_fixture
@pytest.mark.parametrize("utt", UTTS)
@pytest.mark.parametrize("mode", MODES)
def test_prefix_beam_search_matches_wenet(
    utt: str, mode: str, decoding: dict[str, Any], ctc_log_probs: dict[tuple[str, str], np.ndarray]
) -> None:
    expected = decoding[utt][mode]["ctc_prefix_beam_search"]
    nbest = ctc_prefix_beam_search(ctc_log_probs[(utt, mode)], beam=10)
    assert [list(h.tokens) for h in nbest] == expected["nbest"]
    assert [list(h.times) for h in nbest] == expected["nbest_times"]
    for hyp, score in zip(nbest, expected["nbest_scores"], strict=True):
        assert score_ok(hyp.score, score)


@needs_fixture
@pytest.mark.parametrize("mode", MODES)
def test_greedy_batch_matches_wenet(
    mode: str, decoding: dict[str, Any], ctc_log_probs: dict[tuple[str, str], np.ndarray]
) -> None:
    rows = [ctc_log_probs[(utt, mode)] for utt in UTTS]
    lengths = np.array([r.shape[0] for r in rows])
    padded = np.full((len(rows), lengths.max(), rows[0].shape[1]), -1e4, dtype=np.float32)
    padded[:, :, 1] = 0.0  # padding frames argmax to a non-blank token: must be masked out
    for i, r in enumerate(rows):
        padded[i, : r.shape[0]] = r
    hyps = ctc_greedy_batch(torch.from_numpy(padded), torch.from_numpy(lengths))
    assert hyps == [decoding[utt][mode]["ctc_greedy_search"]["tokens"] for utt in UTTS]


@needs_fixture
def test_topk_input_equals_full_posteriors(ctc_log_probs: dict[tuple[str, str], np.ndarray]) -> None:
    log_probs = ctc_log_probs[("utt2", "full")]
    values, ids = ctc_topk(log_probs, 16)
    assert values.shape == ids.shape == (log_probs.shape[0], 16)
    assert ctc_prefix_beam_search_topk(values, ids, beam=10) == ctc_prefix_beam_search(log_probs, beam=10)


def test_empty_input_gives_the_empty_hypothesis() -> None:
    nbest = ctc_prefix_beam_search(np.zeros((0, 5), dtype=np.float32), beam=4)
    assert [(h.tokens, h.score) for h in nbest] == [((), 0.0)]
    assert ctc_greedy_batch(np.zeros((1, 0, 5), dtype=np.float32), np.array([0])) == [[]]


# --- reference: WeNet's loop (wenet/transformer/search.py), transcribed for comparison ---


def _log_add(*args: float) -> float:
    if all(a == -math.inf for a in args):
        return -math.inf
    a_max = max(args)
    return a_max + math.log(sum(math.exp(a - a_max) for a in args))


@dataclass
class _Score:
    s: float = -math.inf
    ns: float = -math.inf
    v_s: float = -math.inf
    v_ns: float = -math.inf
    cur_token_prob: float = -math.inf
    times_s: list[int] = field(default_factory=list)
    times_ns: list[int] = field(default_factory=list)

    def score(self) -> float:
        return _log_add(self.s, self.ns)

    def viterbi_score(self) -> float:
        return self.v_s if self.v_s > self.v_ns else self.v_ns

    def times(self) -> list[int]:
        return self.times_s if self.v_s > self.v_ns else self.times_ns


def _reference_search(logp: torch.Tensor, beam: int) -> list[tuple[tuple[int, ...], float, list[int]]]:
    cur: list[tuple[tuple[int, ...], _Score]] = [((), _Score(s=0.0, v_s=0.0, v_ns=0.0))]
    for t in range(logp.shape[0]):
        nxt: defaultdict[tuple[int, ...], _Score] = defaultdict(_Score)
        _, top = logp[t].topk(min(beam, logp.shape[1]))
        for u in top.tolist():
            prob = logp[t][u].item()
            for prefix, ps in cur:
                last = prefix[-1] if prefix else None
                if u == 0:
                    n = nxt[prefix]
                    n.s = _log_add(n.s, ps.score() + prob)
                    n.v_s = ps.viterbi_score() + prob
                    n.times_s = ps.times().copy()
                elif u == last:
                    n1 = nxt[prefix]
                    n1.ns = _log_add(n1.ns, ps.ns + prob)
                    if n1.v_ns < ps.v_ns + prob:
                        n1.v_ns = ps.v_ns + prob
                        if n1.cur_token_prob < prob:
                            n1.cur_token_prob = prob
                            n1.times_ns = ps.times_ns.copy()
                            n1.times_ns[-1] = t
                    n2 = nxt[(*prefix, u)]
                    n2.ns = _log_add(n2.ns, ps.s + prob)
                    if n2.v_ns < ps.v_s + prob:
                        n2.v_ns = ps.v_s + prob
                        n2.cur_token_prob = prob
                        n2.times_ns = [*ps.times_s, t]
                else:
                    n = nxt[(*prefix, u)]
                    n.ns = _log_add(n.ns, ps.score() + prob)
                    if n.v_ns < ps.viterbi_score() + prob:
                        n.v_ns = ps.viterbi_score() + prob
                        n.cur_token_prob = prob
                        n.times_ns = [*ps.times(), t]
        cur = sorted(nxt.items(), key=lambda x: x[1].score(), reverse=True)[:beam]
    return [(prefix, ps.score(), ps.times()) for prefix, ps in cur]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    frames=st.integers(1, 40),
    vocab=st.integers(2, 7),
    beam=st.integers(1, 6),
    peaky=st.floats(0.5, 8.0),
)
def test_vectorized_search_equals_wenet_loop(seed: int, frames: int, vocab: int, beam: int, peaky: float) -> None:
    """Small vocabularies force repeats, merges and re-entering prefixes."""
    gen = torch.Generator().manual_seed(seed)
    logp = (torch.randn(frames, vocab, generator=gen) * peaky).log_softmax(-1)
    expected = _reference_search(logp, beam)
    got = ctc_prefix_beam_search(logp, beam=beam)
    assert [h.tokens for h in got] == [e[0] for e in expected]
    assert [list(h.times) for h in got] == [e[2] for e in expected]
    for hyp, (_, score, _) in zip(got, expected, strict=True):
        assert hyp.score == pytest.approx(score, rel=1e-9, abs=1e-9)
