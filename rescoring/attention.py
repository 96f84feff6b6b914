"""Attention rescoring of CTC n-best lists with the bidirectional decoder, as WeNet scores it,
batched over the hypotheses of all streams (decoder calls grouped by length, see
``rescoring.packing.length_groups``).

Per hypothesis y of length L (WeNet's ``attention_rescoring``):

    l2r   = sum_j log P_l2r(y_j | sos, y_<j) + log P_l2r(eos | sos, y)
    r2l   = same with the right-to-left decoder on reversed(y)
    final = (1 - reverse_weight) * l2r + reverse_weight * r2l + ctc_weight * ctc_prefix_score

The winner is the first hypothesis (in n-best order) with the highest ``final``. The padded
and prefix-tree decoder calls score the same formula and are tested against each other; how
hypotheses are packed into those calls is ``rescoring.packing``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rescoring.packing import (
    MAX_CALL_POSITIONS,
    PADDING_SLACK,
    PrefixTree,
    build_decoder_batch,
    length_groups,
    padded_memory,
    size_groups,
    tree_batch,
)
from rescoring.protocols import DecoderFn, Hypothesis, TreeDecoder


@dataclass(frozen=True)
class HypothesisScore:
    """One rescored hypothesis; ``nbest_index`` is its position in the CTC n-best list."""

    tokens: tuple[int, ...]
    score: float
    ctc_score: float
    l2r_score: float
    r2l_score: float
    decoder_score: float
    confidence: float
    nbest_index: int


@dataclass(frozen=True)
class RescoreResult:
    """Rescoring of one stream's n-best; ``hypotheses`` are best first, as WeNet ranks them.

    ``confidence`` is WeNet's exp(decoder_score / (len + 1)) of the winner; ``times`` are the
    winner's CTC token frames.
    """

    tokens: tuple[int, ...]
    score: float
    confidence: float
    times: tuple[int, ...]
    hypotheses: tuple[HypothesisScore, ...]

    @property
    def best(self) -> HypothesisScore:
        return self.hypotheses[0]


def sequence_scores(log_probs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of target log-probs over valid positions, in float64.

    Args:
        log_probs: (M, L + 1, V); targets: (M, L + 1); mask: (M, L + 1) bool.
    Returns:
        (M,) float64.
    """
    index = targets.to(log_probs.device).unsqueeze(2)  # (M, L + 1, 1)
    picked = log_probs.detach().gather(2, index).squeeze(2).cpu().double()  # (M, L + 1)
    return picked.masked_fill(~mask.cpu(), 0.0).sum(1)


def tree_scores(
    log_probs: torch.Tensor, trees: Sequence[PrefixTree], hyps: Sequence[Sequence[Sequence[int]]], eos: int
) -> list[float]:
    """Per hypothesis (stream-major order): sum of log P(token | prefix) over its tokens and eos.

    log_probs: (S, N, V) from ``forward_tree``; ``hyps[s]`` are the token lists ``trees[s]``
    was built from.
    """
    rows, nodes, targets, owners = [], [], [], []
    owner = 0
    for s, (tree, stream_hyps) in enumerate(zip(trees, hyps, strict=True)):
        for path, tokens in zip(tree.paths, stream_hyps, strict=True):
            rows += [s] * len(path)
            nodes += path
            targets += [*tokens, eos]
            owners += [owner] * len(path)
            owner += 1
    picked = log_probs.detach()[torch.tensor(rows), torch.tensor(nodes), torch.tensor(targets)].cpu().double()
    totals = torch.zeros(owner, dtype=torch.float64).index_add_(0, torch.tensor(owners), picked)
    return totals.tolist()


def attention_rescore(
    decoder_fn: DecoderFn,
    encoder_outs: Sequence[torch.Tensor],
    nbests: Sequence[Sequence[Hypothesis]],
    *,
    sos: int,
    eos: int,
    ctc_weight: float = 0.5,
    reverse_weight: float = 0.3,
    padding_slack: float = PADDING_SLACK,
    max_positions: float = MAX_CALL_POSITIONS,
    prefix_tree: bool = True,
    bonuses: Sequence[Sequence[float]] | None = None,
) -> list[RescoreResult]:
    """Rescore the n-best lists of S streams, batched into as few decoder calls as padding allows.

    Args:
        decoder_fn: the bidirectional decoder (see :class:`DecoderFn`).
        encoder_outs: S tensors (T_s, D), each stream's encoder output.
        nbests: S non-empty CTC n-best lists.
        sos, eos: decoder start/end ids (the same id in WeNet models).
        ctc_weight: weight of the CTC prefix score.
        reverse_weight: weight of the right-to-left decoder score.
        padding_slack, max_positions: see :func:`length_groups`; both ``math.inf`` put every
            stream in one call.
        prefix_tree: when the decoder has ``forward_tree`` (the model's decoders do), decode
            each utterance's n-best as one prefix tree (:class:`PrefixTree`): every distinct
            prefix once instead of every hypothesis position; same scores up to float rounding.
        bonuses: per stream, per hypothesis, a log-domain bonus added to ``final`` unweighted
            (the hotword bonus the CTC search ranked by, so that rescoring does not undo it).
    Returns:
        S results, in stream order.
    """
    if len(encoder_outs) != len(nbests):
        raise ValueError(f"{len(encoder_outs)} encoder outputs but {len(nbests)} n-best lists")
    if not nbests:
        return []
    for s, nbest in enumerate(nbests):
        if not nbest:
            raise ValueError(f"stream {s} has an empty n-best list")
        if bonuses is not None and len(bonuses[s]) != len(nbest):
            raise ValueError(f"stream {s}: {len(bonuses[s])} bonuses for {len(nbest)} hypotheses")
    l2r: list[float] = [0.0] * sum(len(nbest) for nbest in nbests)
    r2l: list[float] = [0.0] * len(l2r)
    first_row = [0]
    for nbest in nbests:
        first_row.append(first_row[-1] + len(nbest))
    use_r2l = reverse_weight > 0.0
    if prefix_tree and isinstance(decoder_fn, TreeDecoder):
        use_r2l = _rescore_trees(
            decoder_fn.forward_tree, encoder_outs, nbests, sos, eos, use_r2l, padding_slack, max_positions,
            first_row, l2r, r2l,
        )  # fmt: skip
    else:
        use_r2l = _rescore_padded(
            decoder_fn, encoder_outs, nbests, sos, eos, reverse_weight, padding_slack, max_positions,
            first_row, l2r, r2l,
        )  # fmt: skip

    results = []
    row = 0
    for s, nbest in enumerate(nbests):
        scored = []
        for index, hyp in enumerate(nbest):
            decoder = (1.0 - reverse_weight) * l2r[row] + reverse_weight * r2l[row] if use_r2l else l2r[row]
            final = decoder + ctc_weight * hyp.score
            if bonuses is not None:
                final += bonuses[s][index]
            scored.append(
                HypothesisScore(
                    tokens=hyp.tokens,
                    score=final,
                    ctc_score=hyp.score,
                    l2r_score=l2r[row],
                    r2l_score=r2l[row],
                    decoder_score=decoder,
                    confidence=math.exp(decoder / (len(hyp.tokens) + 1)),
                    nbest_index=index,
                )
            )
            row += 1
        ranked = tuple(sorted(scored, key=lambda h: -h.score))  # stable: first of equals wins, as WeNet
        winner = ranked[0]
        results.append(
            RescoreResult(
                tokens=winner.tokens,
                score=winner.score,
                confidence=winner.confidence,
                times=nbest[winner.nbest_index].times,
                hypotheses=ranked,
            )
        )
    return results


def _rescore_padded(
    decoder_fn: DecoderFn, encoder_outs: Sequence[torch.Tensor], nbests: Sequence[Sequence[Hypothesis]],
    sos: int, eos: int, reverse_weight: float, padding_slack: float, max_positions: float,
    first_row: list[int], l2r: list[float], r2l: list[float],
) -> bool:  # fmt: skip
    """Every hypothesis padded to its call's longest; fills l2r/r2l; returns whether r2l was used."""
    use_r2l = reverse_weight > 0.0
    for group in length_groups(nbests, padding_slack, max_positions=max_positions):
        batch = build_decoder_batch([encoder_outs[s] for s in group], [nbests[s] for s in group], sos, eos)
        with torch.inference_mode():
            l2r_logp, r2l_logp = decoder_fn(
                batch.memory, batch.memory_mask, batch.ys_in_pad, batch.ys_in_lens, batch.r_ys_in_pad,
                reverse_weight, memory_rows=batch.memory_rows,
            )  # fmt: skip
        group_rows = [row for s in group for row in range(first_row[s], first_row[s + 1])]
        use_r2l = use_r2l and r2l_logp.numel() > 0
        scores = sequence_scores(l2r_logp, batch.targets, batch.target_mask).tolist()
        for row, score in zip(group_rows, scores, strict=True):
            l2r[row] = score
        if use_r2l:
            scores = sequence_scores(r2l_logp, batch.r_targets, batch.target_mask).tolist()
            for row, score in zip(group_rows, scores, strict=True):
                r2l[row] = score
    return use_r2l


def _rescore_trees(
    forward_tree: Callable[..., tuple[torch.Tensor, torch.Tensor]], encoder_outs: Sequence[torch.Tensor],
    nbests: Sequence[Sequence[Hypothesis]], sos: int, eos: int, use_r2l: bool, padding_slack: float,
    max_positions: float, first_row: list[int], l2r: list[float], r2l: list[float],
) -> bool:  # fmt: skip
    """One prefix tree per utterance and direction; fills l2r/r2l; returns whether r2l was used."""
    hyps = [[list(h.tokens) for h in nbest] for nbest in nbests]
    r_hyps = [[tokens[::-1] for tokens in stream] for stream in hyps]
    trees = [PrefixTree.of(stream, sos) for stream in hyps]
    r_trees = [PrefixTree.of(stream, sos) for stream in r_hyps] if use_r2l else []
    sizes = [max(len(trees[s]), len(r_trees[s]) if use_r2l else 0) for s in range(len(trees))]
    for group in size_groups(sizes, padding_slack, max_positions=max_positions):
        memory, memory_mask = padded_memory([encoder_outs[s] for s in group])
        device = memory.device
        batch = tuple(t.to(device) for t in tree_batch([trees[s] for s in group], eos))
        r_batch = tuple(t.to(device) for t in tree_batch([r_trees[s] for s in group], eos)) if use_r2l else None
        with torch.inference_mode():
            l2r_logp, r2l_logp = forward_tree(memory, memory_mask, batch, r_batch)
        rows = [row for s in group for row in range(first_row[s], first_row[s + 1])]
        for row, score in zip(rows, tree_scores(l2r_logp, [trees[s] for s in group], [hyps[s] for s in group], eos),
                              strict=True):  # fmt: skip
            l2r[row] = score
        use_r2l = use_r2l and r2l_logp.numel() > 0
        if use_r2l:
            scores = tree_scores(r2l_logp, [r_trees[s] for s in group], [r_hyps[s] for s in group], eos)
            for row, score in zip(rows, scores, strict=True):
                r2l[row] = score
    return use_r2l
