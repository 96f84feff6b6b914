"""CTC decoding: batched greedy search and WeNet's prefix beam search.

Pure functions over CTC log-posteriors returning result records. The prefix beam search
reproduces ``wenet.transformer.search.ctc_prefix_beam_search`` (n-best tokens, their order,
scores and token times); it works on per-frame top-k posteriors so the engine can keep only
``(T, k)`` values and ids per stream and run the search once, at an endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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
    probability of all alignments of ``tokens``. ``times`` holds, per token, the encoder
    frame (0-based, 40 ms apart with 4x subsampling) where WeNet's Viterbi bookkeeping
    places it.
    """

    tokens: tuple[int, ...]
    score: float
    times: tuple[int, ...] = ()


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


def ctc_prefix_beam_search(log_probs: ArrayLike, beam: int = 10, blank: int = 0) -> list[Hypothesis]:
    """WeNet's CTC prefix beam search over one utterance.

    Each frame is pre-pruned to its ``beam`` best tokens, as WeNet does.

    Args:
        log_probs: (T, V) log-posteriors.
        beam: beam size (also the per-frame top-k).
        blank: id of the CTC blank.
    Returns:
        Up to ``beam`` hypotheses, best first (WeNet's n-best order).
    """
    values, ids = ctc_topk(log_probs, beam)
    return ctc_prefix_beam_search_topk(values, ids, beam=beam, blank=blank)


def ctc_prefix_beam_search_topk(
    topk_values: ArrayLike, topk_ids: ArrayLike, beam: int = 10, blank: int = 0
) -> list[Hypothesis]:
    """Prefix beam search on stored per-frame top-k posteriors.

    Equals :func:`ctc_prefix_beam_search` on the full posteriors when k >= ``beam``
    (extra columns are ignored); with k < ``beam`` each frame offers only its k tokens.

    Args:
        topk_values: (T, k) log-posteriors, best first within each frame.
        topk_ids: (T, k) their token ids.
        beam: beam size.
        blank: id of the CTC blank.
    Returns:
        Up to ``beam`` hypotheses, best first.
    """
    values = _as_tensor(topk_values).numpy().astype(np.float64)[:, :beam]  # (T, K)
    ids = _as_tensor(topk_ids).numpy().astype(np.int64)[:, :beam]  # (T, K)
    search = _PrefixBeam(beam, blank)
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

    def __init__(self, beam: int, blank: int) -> None:
        self.beam = beam
        self.blank = blank
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
        order = np.lexsort((first, -total))[: self.beam]  # stable: ties keep first appearance

        self._replay(t, order, inverse, first, kind, hyp, u, prob, target, keys)
        self.s, self.ns = new_s[order], new_ns[order]

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
        return result
