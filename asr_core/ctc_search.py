"""CTC decoding: batched greedy search and WeNet's prefix beam search.

Pure functions over CTC log-posteriors returning result records. The prefix beam search
reproduces ``wenet.transformer.search.ctc_prefix_beam_search`` (n-best tokens, their order,
scores and token times); it works on per-frame top-k posteriors so the engine can keep only
``(T, k)`` values and ids per stream and run the search once, at an endpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from asr_core.context_graph import ROOT, ContextGraph

try:  # the same search and scores in C, where the optional extension was built (setup.py)
    from asr_core._fastctc import ctc_forward as _native_ctc_forward
    from asr_core._fastctc import prefix_beam_search as _native_prefix_beam_search
except ImportError:  # pragma: no cover - depends on the build
    _native_prefix_beam_search = None
    _native_ctc_forward = None
if os.environ.get("ASR_NATIVE_CTC", "1") == "0":  # numpy search, torch scores even where C is built (A/B, debugging)
    _native_prefix_beam_search = None
    _native_ctc_forward = None

ArrayLike = np.ndarray | torch.Tensor

_NEG_INF = float("-inf")

# Kinds of the candidates a prefix spawns when one token of the frame's top-k is appended.
_BLANK = 0  # prefix + blank -> same prefix, blank-ending
_REPEAT_SAME = 1  # prefix ending in u, + u without a blank between -> same prefix
_REPEAT_NEW = 2  # prefix ending in u, + blank + u -> prefix + (u,)
_EXTEND = 3  # prefix + a token different from its last one -> prefix + (u,)
# Trie keys are parent_node * _TOKEN_STRIDE + token; vocabularies are far below 2**24 units.
_TOKEN_STRIDE = 1 << 24


@dataclass(frozen=True)
class Hypothesis:
    """One entry of a CTC n-best list.

    ``score`` is WeNet's prefix score: log(P_blank_end + P_nonblank_end), the total
    probability of all alignments of ``tokens``; with a context graph the search ranks by
    ``score + context_score``, and later stages add ``context_score`` to their own scores.
    ``times`` holds, per token, the encoder frame (0-based, 40 ms apart with 4x subsampling) where
    WeNet's Viterbi bookkeeping places it.
    """

    tokens: tuple[int, ...]
    score: float
    times: tuple[int, ...] = ()
    context_score: float = 0.0  # hotword bonus of ``tokens`` (finalized), not part of ``score``


def _as_tensor(x: ArrayLike) -> torch.Tensor:
    return x.detach().cpu() if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))


def ctc_topk(log_probs: ArrayLike, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame top-k of CTC log-posteriors, best first, as WeNet's search selects them.

    Args:
        log_probs: (..., T, V) log-posteriors.
        k: tokens kept per frame (clipped to V).
    Returns:
        values (..., T, k) float32 and ids (..., T, k) int64.
    """
    lp = _as_tensor(log_probs).float()
    values, ids = lp.topk(min(k, lp.shape[-1]), dim=-1)
    return values.numpy(), ids.numpy()


def ctc_greedy_batch(log_probs: ArrayLike, lengths: ArrayLike, blank: int = 0) -> list[list[int]]:
    """Best-path decoding of a batch: argmax per frame, collapse repeats, drop blanks.

    Args:
        log_probs: (B, T, V) log-posteriors; frames at or past ``lengths[b]`` are padding.
        lengths: (B,) valid frames per row.
        blank: id of the CTC blank.
    Returns:
        B token-id lists.
    """
    lp = _as_tensor(log_probs)
    batch, max_t = lp.shape[0], lp.shape[1]
    best = lp.topk(1, dim=-1)[1].squeeze(-1).numpy()  # (B, T)
    lens = _as_tensor(lengths).numpy().astype(np.int64).reshape(batch)
    valid = np.arange(max_t)[None, :] < lens[:, None]  # (B, T)
    best = np.where(valid, best, blank)
    previous = np.concatenate([np.full((batch, 1), -1, dtype=best.dtype), best[:, :-1]], axis=1)
    keep = (best != blank) & (best != previous)  # (B, T)
    return [row[mask].tolist() for row, mask in zip(best, keep, strict=True)]


def ctc_prefix_beam_search(
    log_probs: ArrayLike, beam: int = 10, blank: int = 0, context: ContextGraph | None = None
) -> list[Hypothesis]:
    """WeNet's CTC prefix beam search over one utterance.

    Each frame is pre-pruned to its ``beam`` best tokens, as WeNet does.

    Args:
        log_probs: (T, V) log-posteriors.
        beam: beam size (also the per-frame top-k).
        blank: id of the CTC blank.
        context: hotwords graph (see ``ctc_prefix_beam_search_topk``).
    Returns:
        Up to ``beam`` hypotheses, best first (WeNet's n-best order).
    """
    values, ids = ctc_topk(log_probs, beam)
    return ctc_prefix_beam_search_topk(values, ids, beam=beam, blank=blank, context=context)


def ctc_prefix_beam_search_topk(
    topk_values: ArrayLike,
    topk_ids: ArrayLike,
    beam: int = 10,
    blank: int = 0,
    context: ContextGraph | None = None,
) -> list[Hypothesis]:
    """Prefix beam search on stored per-frame top-k posteriors.

    Equals :func:`ctc_prefix_beam_search` on the full posteriors when k >= ``beam``
    (extra columns are ignored); with k < ``beam`` each frame offers only its k tokens.

    Runs in C where ``asr_core._fastctc`` was built (about 30x faster; the same results bit for
    bit, tested against :class:`_PrefixBeam`, the numpy version that runs elsewhere).

    Args:
        topk_values: (T, k) log-posteriors, best first within each frame.
        topk_ids: (T, k) their token ids.
        beam: beam size.
        blank: id of the CTC blank.
        context: hotwords graph; each prefix carries its graph state and bonus, and the beam
            keeps the prefixes best by prefix score + bonus (in C too, from the graph's flat
            arrays). None: WeNet's search, unchanged.
    Returns:
        Up to ``beam`` hypotheses, best first (by ``score + context_score`` with a graph).
    """
    values = _as_tensor(topk_values).numpy().astype(np.float64)[:, :beam]  # (T, K)
    ids = _as_tensor(topk_ids).numpy().astype(np.int64)[:, :beam]  # (T, K)
    if context is not None and len(context) <= 1:
        context = None  # an empty phrase list is no list
    if _native_prefix_beam_search is not None:
        values, ids = np.ascontiguousarray(values), np.ascontiguousarray(ids)
        if context is None:
            found = _native_prefix_beam_search(values, ids, beam, blank)
            return [Hypothesis(tokens, score, times) for tokens, score, times in found]
        found = _native_prefix_beam_search(values, ids, beam, blank, context.flat)
        hyps = [Hypothesis(tokens, score, times) for tokens, score, times, _, _ in found]
        return _finalized(hyps, [entry[3] for entry in found], [entry[4] for entry in found], context)
    search = _PrefixBeam(beam, blank, context)
    for t in range(values.shape[0]):
        search.step(t, values[t], ids[t])
    return search.nbest()


class _PrefixBeam:
    """State of one prefix beam search: parallel arrays over the (at most ``beam``) prefixes.

    Prefixes are identified by node ids of a trie (key ``parent_id * stride + token``) so that
    candidates reaching the same prefix from different parents merge without hashing tuples.
    Scores are computed for all candidates with numpy; the Viterbi/time bookkeeping, which
    WeNet defines by update order, is replayed in Python for the survivors only.
    """

    def __init__(self, beam: int, blank: int, context: ContextGraph | None = None) -> None:
        self.beam = beam
        self.blank = blank
        self.context = context
        self.ctx_state = np.full(1, ROOT, dtype=np.int64)  # (H,) context-graph state of each prefix
        self.ctx_score = np.zeros(1)  # (H,) bonus so far (unfinalized)
        self._ctx_steps: dict[tuple[int, int], tuple[float, int]] = {}  # (state, token) -> step
        self.trie: dict[int, int] = {}
        self.next_node = 1  # node 0 is the empty prefix
        self.node = np.zeros(1, dtype=np.int64)  # (H,)
        self.tokens: list[tuple[int, ...]] = [()]
        self.s = np.array([0.0])  # (H,) log P(prefix, ends in blank)
        self.ns = np.array([_NEG_INF])  # (H,) log P(prefix, ends in a token)
        self.v_s = [0.0]
        self.v_ns = [0.0]
        self.times_s: list[tuple[int, ...]] = [()]
        self.times_ns: list[tuple[int, ...]] = [()]

    def step(self, t: int, frame_values: np.ndarray, frame_ids: np.ndarray) -> None:
        """Advance by encoder frame ``t`` given its top-k (K,) values and ids."""
        num_hyps, num_k = len(self.tokens), frame_ids.shape[0]
        last = np.array([tok[-1] if tok else -1 for tok in self.tokens], dtype=np.int64)  # (H,)
        # Candidates in WeNet's update order: top-k tokens outer, prefixes inner; a repeated
        # token spawns "same prefix" then "prefix + token".
        token_k = np.repeat(np.arange(num_k), num_hyps)  # (K*H,)
        hyp = np.tile(np.arange(num_hyps), num_k)  # (K*H,)
        u = frame_ids[token_k]
        is_repeat = (u == last[hyp]) & (u != self.blank)
        kind = np.where(u == self.blank, _BLANK, np.where(is_repeat, _REPEAT_SAME, _EXTEND))
        expand = np.repeat(np.arange(kind.shape[0]), 1 + is_repeat)  # (C,)
        second = np.zeros(expand.shape[0], dtype=bool)
        second[1:] = expand[1:] == expand[:-1]
        token_k, hyp, u, kind = token_k[expand], hyp[expand], u[expand], kind[expand]
        kind = np.where(second, _REPEAT_NEW, kind)
        prob = frame_values[token_k]  # (C,)

        score = np.logaddexp(self.s, self.ns)  # (H,)
        grows = (kind == _REPEAT_NEW) | (kind == _EXTEND)
        keys = self.node[hyp] * _TOKEN_STRIDE + u
        target = self.node[hyp].copy()
        grow_idx = np.nonzero(grows)[0]
        found = [self.trie.get(key, -1) for key in keys[grow_idx].tolist()]
        found_arr = np.array(found, dtype=np.int64)
        target[grow_idx] = np.where(found_arr >= 0, found_arr, -1 - grow_idx)

        contrib = (
            np.where(
                kind == _REPEAT_SAME,
                self.ns[hyp],
                np.where(kind == _REPEAT_NEW, self.s[hyp], score[hyp]),
            )
            + prob
        )
        uniq, first, inverse = np.unique(target, return_index=True, return_inverse=True)
        new_s = np.full(uniq.shape[0], _NEG_INF)
        new_ns = np.full(uniq.shape[0], _NEG_INF)
        is_blank = kind == _BLANK
        np.logaddexp.at(new_s, inverse[is_blank], contrib[is_blank])
        np.logaddexp.at(new_ns, inverse[~is_blank], contrib[~is_blank])
        total = np.logaddexp(new_s, new_ns)
        if self.context is None:
            order = np.lexsort((first, -total))[: self.beam]  # stable: ties keep first appearance
        else:
            bonus, states = self._context_steps(grows, hyp, u)
            order = np.lexsort((first, -(total + bonus[first])))[: self.beam]
            self.ctx_score, self.ctx_state = bonus[first[order]], states[first[order]]

        self._replay(t, order, inverse, first, kind, hyp, u, prob, target, keys)
        self.s, self.ns = new_s[order], new_ns[order]

    def _context_steps(self, grows: np.ndarray, hyp: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(C,) bonus and (C,) graph state of each candidate: its parent's, advanced by the token
        where the candidate appends one. Steps are cached per (state, token) for the utterance."""
        assert self.context is not None
        bonus = self.ctx_score[hyp].copy()
        states = self.ctx_state[hyp].copy()
        cache, step = self._ctx_steps, self.context.step
        for c in np.nonzero(grows)[0].tolist():
            key = (int(states[c]), int(u[c]))
            found = cache.get(key)
            if found is None:
                found = cache[key] = step(*key)
            bonus[c] += found[0]
            states[c] = found[1]
        return bonus, states

    def _replay(
        self,
        t: int,
        order: np.ndarray,
        inverse: np.ndarray,
        first: np.ndarray,
        kind: np.ndarray,
        hyp: np.ndarray,
        u: np.ndarray,
        prob: np.ndarray,
        target: np.ndarray,
        keys: np.ndarray,
    ) -> None:
        """Viterbi scores and token times of the surviving prefixes, in WeNet's update order."""
        slot = np.full(first.shape[0], -1, dtype=np.int64)
        slot[order] = np.arange(order.shape[0])
        n = order.shape[0]
        v_s, v_ns, cur_prob = [_NEG_INF] * n, [_NEG_INF] * n, [_NEG_INF] * n
        times_s: list[tuple[int, ...]] = [()] * n
        times_ns: list[tuple[int, ...]] = [()] * n
        cand_slot = slot[inverse]
        for c in np.nonzero(cand_slot >= 0)[0].tolist():
            i, h, p, k = int(cand_slot[c]), int(hyp[c]), float(prob[c]), int(kind[c])
            h_vs, h_vns = self.v_s[h], self.v_ns[h]
            if k == _REPEAT_SAME:
                if v_ns[i] < h_vns + p:
                    v_ns[i] = h_vns + p
                    if cur_prob[i] < p:
                        cur_prob[i] = p
                        times_ns[i] = (*self.times_ns[h][:-1], t)
                continue
            viterbi, times = (h_vs, self.times_s[h]) if h_vs > h_vns else (h_vns, self.times_ns[h])
            if k == _BLANK:
                v_s[i] = viterbi + p
                times_s[i] = times
            elif k == _REPEAT_NEW:
                if v_ns[i] < h_vs + p:
                    v_ns[i] = h_vs + p
                    cur_prob[i] = p
                    times_ns[i] = (*self.times_s[h], t)
            elif v_ns[i] < viterbi + p:
                v_ns[i] = viterbi + p
                cur_prob[i] = p
                times_ns[i] = (*times, t)

        tokens: list[tuple[int, ...]] = []
        nodes = np.empty(n, dtype=np.int64)
        for i, cand in enumerate(first[order].tolist()):
            h, node = int(hyp[cand]), int(target[cand])
            if kind[cand] in (_BLANK, _REPEAT_SAME):
                tokens.append(self.tokens[h])
            else:
                tokens.append((*self.tokens[h], int(u[cand])))
                if node < 0:
                    node = self.next_node
                    self.next_node += 1
                    self.trie[int(keys[cand])] = node
            nodes[i] = node
        self.node, self.tokens = nodes, tokens
        self.v_s, self.v_ns, self.times_s, self.times_ns = v_s, v_ns, times_s, times_ns

    def nbest(self) -> list[Hypothesis]:
        """Current prefixes, best first, as WeNet reports them after the last frame."""
        result = []
        for i, tokens in enumerate(self.tokens):
            score = float(np.logaddexp(self.s[i], self.ns[i]))
            times = self.times_s[i] if self.v_s[i] > self.v_ns[i] else self.times_ns[i]
            result.append(Hypothesis(tokens=tokens, score=score, times=times))
        if self.context is None:
            return result
        return _finalized(result, self.ctx_score.tolist(), self.ctx_state.tolist(), self.context)


def _finalized(
    hyps: list[Hypothesis], bonus: list[float], states: list[int], context: ContextGraph
) -> list[Hypothesis]:
    """The n-best with each bonus finalized (the unfinished part of a match taken back at the
    end), best first by ``score + context_score`` (stable)."""
    done = [
        Hypothesis(h.tokens, h.score, h.times, b + context.finalize(s))
        for h, b, s in zip(hyps, bonus, states, strict=True)
    ]
    return sorted(done, key=lambda h: -(h.score + h.context_score))


def _columns_topk(topk_values: ArrayLike, topk_ids: ArrayLike, tokens: list[int], vocab_size: int) -> np.ndarray:
    """(T, len(tokens)) float64 log-posteriors of ``tokens`` (distinct) from stored top-k posteriors.

    A token outside a frame's top k gets an equal share of the probability the top k leave:
    log((1 - sum(exp(top k))) / (V - k)), floored at 1e-30 of mass.
    """
    values = _as_tensor(topk_values).numpy().astype(np.float64)  # (T, k)
    ids = _as_tensor(topk_ids).numpy().astype(np.int64)  # (T, k)
    k = values.shape[1]
    rest = np.maximum(1.0 - np.exp(values).sum(axis=1), 1e-30) / max(vocab_size - k, 1)  # (T,)
    out = np.repeat(np.log(rest)[:, None], len(tokens), axis=1)  # (T, U)
    column = np.full(max(vocab_size, int(ids.max(initial=0)) + 1, max(tokens) + 1), -1, dtype=np.int64)
    column[np.asarray(tokens, dtype=np.int64)] = np.arange(len(tokens))
    cols = column[ids]  # (T, k)
    rows, slots = np.nonzero(cols >= 0)
    out[rows, cols[rows, slots]] = values[rows, slots]
    return out


def _token_classes(
    topk_values: ArrayLike, topk_ids: ArrayLike, tokens: Iterable[int], vocab_size: int, blank: int
) -> tuple[dict[int, int], np.ndarray]:
    """The blank and the distinct ``tokens`` as classes: ({token: column}, (T, classes) log-posteriors)."""
    distinct = sorted({blank, *tokens})
    return {token: i for i, token in enumerate(distinct)}, _columns_topk(topk_values, topk_ids, distinct, vocab_size)


def ctc_scores_topk(
    topk_values: ArrayLike,
    topk_ids: ArrayLike,
    hyps: list[tuple[int, ...]] | list[list[int]],
    vocab_size: int,
    blank: int = 0,
) -> list[float]:
    """log P_ctc(y | x) of each hypothesis y: the sum over all its alignments (CTC's forward).

    For hypotheses that did not come from the CTC prefix beam search (e.g. the attention
    decoder's own proposals), scored on the same stored posteriors. A token outside a frame's
    top k gets an equal share of what the top k leave (see ``_columns_topk``). An impossible
    hypothesis (more frames needed than there are) scores -inf.

    Args:
        topk_values: (T, k) log-posteriors; topk_ids: (T, k) their token ids.
        hyps: token sequences (no blanks).
        vocab_size: V, the size of the CTC output layer.
        blank: id of the CTC blank.
    """
    if not hyps:
        return []
    if len(topk_values) == 0:  # no frames: only the empty hypothesis is possible, with certainty
        return [0.0 if len(h) == 0 else _NEG_INF for h in hyps]
    class_of, matrix = _token_classes(topk_values, topk_ids, (t for h in hyps for t in h), vocab_size, blank)
    longest = max(1, max(len(h) for h in hyps))
    labels = np.zeros((len(hyps), longest), dtype=np.int64)
    for i, h in enumerate(hyps):
        labels[i, : len(h)] = [class_of[t] for t in h]
    lengths = np.array([len(h) for h in hyps], dtype=np.int64)
    if _native_ctc_forward is not None:
        return [float(v) for v in _native_ctc_forward(np.ascontiguousarray(matrix), labels, lengths, class_of[blank])]
    return ctc_forward_reference(matrix, labels, lengths, class_of[blank])


def ctc_forward_reference(emissions: np.ndarray, labels: np.ndarray, lengths: np.ndarray, blank: int) -> list[float]:
    """log P(labels[n][:lengths[n]] | emissions) by torch's ``ctc_loss``: the reference the C
    ``ctc_forward`` is tested against and the fallback where it was not built.

    emissions: (T, C) float64 log-posteriors of C classes; labels: (N, L) int64 class indices;
    lengths: (N,) int64; blank: the blank's class. -inf where no alignment fits."""
    columns = torch.from_numpy(emissions)  # (T, C)
    frames, distinct = columns.shape
    count = labels.shape[0]
    if count == 0:
        return []
    nll = torch.nn.functional.ctc_loss(
        columns.unsqueeze(1).expand(frames, count, distinct),
        torch.from_numpy(labels),
        input_lengths=torch.full((count,), frames, dtype=torch.long),
        target_lengths=torch.from_numpy(lengths),
        blank=blank,
        reduction="none",
    )
    return [-float(v) if np.isfinite(float(v)) else _NEG_INF for v in nll]


def ctc_token_frames_topk(
    topk_values: ArrayLike, topk_ids: ArrayLike, tokens: tuple[int, ...] | list[int], vocab_size: int, blank: int = 0
) -> tuple[int, ...]:
    """The frame of each token on the best CTC alignment of ``tokens`` (Viterbi): among the
    frames the alignment gives a token, the one where its posterior peaks, as the prefix beam
    search places a token where its emission scored best. Empty if no alignment exists."""
    tokens = list(tokens)
    if not tokens:
        return ()
    column, matrix = _token_classes(topk_values, topk_ids, tokens, vocab_size, blank)
    em = matrix[:, [column[t] for t in (blank, *tokens)]]
    frames, count = em.shape[0], len(tokens)
    states = 2 * count + 1  # blank, token 0, blank, token 1, ..., blank
    emit = np.where(np.arange(states) % 2 == 0, 0, (np.arange(states) + 1) // 2)  # column of each state
    skip = np.zeros(states, dtype=bool)  # a token state reachable from the token two states back
    skip[3::2] = np.asarray(tokens[1:]) != np.asarray(tokens[:-1])
    score = np.full(states, -np.inf)
    score[0] = em[0, 0]
    if states > 1:
        score[1] = em[0, 1]
    back = np.zeros((frames, states), dtype=np.int8)  # 0 stay, 1 from s-1, 2 from s-2
    for t in range(1, frames):
        stay = score
        step = np.concatenate(([-np.inf], score[:-1]))
        jump = np.where(skip, np.concatenate(([-np.inf, -np.inf], score[:-2])), -np.inf)
        choice = np.argmax(np.stack([stay, step, jump]), axis=0)
        score = np.choose(choice, [stay, step, jump]) + em[t, emit]
        back[t] = choice
    last = states - 1 if score[-1] >= score[-2] else states - 2
    if not np.isfinite(score[last]):
        return ()
    path = np.empty(frames, dtype=np.int64)
    for t in range(frames - 1, -1, -1):
        path[t] = last
        last -= back[t, last]
    times = []
    for j in range(count):
        where = np.flatnonzero(path == 2 * j + 1)
        times.append(int(where[np.argmax(em[where, j + 1])]))
    return tuple(times)
