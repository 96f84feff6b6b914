"""Attention rescoring of CTC n-best lists with the bidirectional decoder, as WeNet scores it,
batched over the hypotheses of all streams (decoder calls grouped by length, see
:func:`length_groups`).

Per hypothesis y of length L (WeNet's ``attention_rescoring``):

    l2r   = sum_j log P_l2r(y_j | sos, y_<j) + log P_l2r(eos | sos, y)
    r2l   = same with the right-to-left decoder on reversed(y)
    final = (1 - reverse_weight) * l2r + reverse_weight * r2l + ctc_weight * ctc_prefix_score

The winner is the first hypothesis (in n-best order) with the highest ``final``.
Kept whole (about 500 lines): the padded and prefix-tree decoder calls score the same formula
and are tested against each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch


class Hypothesis(Protocol):
    """What rescoring needs of an n-best entry; ``asr_core.ctc_search.Hypothesis`` is one.

    ``tokens``: the token ids without blanks; ``score``: its CTC prefix score (log-probability
    of all its alignments), weighted by ``ctc_weight`` in the final score; ``times``: the
    encoder frame of each token, handed on as the winner's times.
    """

    @property
    def tokens(self) -> tuple[int, ...]: ...

    @property
    def score(self) -> float: ...

    @property
    def times(self) -> tuple[int, ...]: ...


class DecoderFn(Protocol):
    """The bidirectional attention decoder, returning log-probabilities.

    Args:
        memory: (S, T, D) encoder output of each of the S utterances in the batch.
        memory_mask: (S, 1, T) bool, True on valid encoder frames.
        ys_in_pad: (M, L + 1) long, [sos] + tokens, padded with eos.
        ys_in_lens: (M,) long, token count + 1.
        r_ys_in_pad: (M, L + 1) long, [sos] + reversed tokens, padded with eos.
        reverse_weight: weight of the right-to-left decoder (0 may skip it).
        memory_rows: (M,) long, the utterance (row of ``memory``) of each hypothesis. The
            hypotheses of one utterance share its memory, so a decoder projects the source
            keys and values once per utterance instead of once per hypothesis.
    Returns:
        l2r (M, L + 1, V) and r2l (M, L + 1, V) log-softmax outputs; r2l may be empty
        when ``reverse_weight`` is 0.
    """

    def __call__(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        ys_in_pad: torch.Tensor,
        ys_in_lens: torch.Tensor,
        r_ys_in_pad: torch.Tensor,
        reverse_weight: float,
        *,
        memory_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class TreeDecoder(Protocol):
    """A decoder that scores each utterance's n-best as one prefix tree (``forward_tree`` of
    ``asr_core.model.decoder``'s decoders; exported graphs lack it and take the padded path)."""

    def forward_tree(
        self,
        memory: torch.Tensor,
        mask: torch.Tensor,
        tree: tuple[torch.Tensor, ...],
        r_tree: tuple[torch.Tensor, ...] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


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


@dataclass(frozen=True)
class DecoderBatch:
    """Padded decoder inputs for M hypotheses drawn from S streams (see :class:`DecoderFn`)."""

    memory: torch.Tensor  # (S, T_max, D)
    memory_mask: torch.Tensor  # (S, 1, T_max) bool
    memory_rows: torch.Tensor  # (M,) long: stream of each hypothesis
    ys_in_pad: torch.Tensor  # (M, L + 1) long
    ys_in_lens: torch.Tensor  # (M,) long
    r_ys_in_pad: torch.Tensor  # (M, L + 1) long
    targets: torch.Tensor  # (M, L + 1) long: tokens then eos (l2r)
    r_targets: torch.Tensor  # (M, L + 1) long: reversed tokens then eos (r2l)
    target_mask: torch.Tensor  # (M, L + 1) bool: positions 0..len


def padded_memory(encoder_outs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """S encoder outputs (T_s, D) as one padded memory (S, T_max, D) and its mask (S, 1, T_max)."""
    device = encoder_outs[0].device
    frames = torch.tensor([e.shape[0] for e in encoder_outs], device=device)  # (S,)
    memory = torch.nn.utils.rnn.pad_sequence(list(encoder_outs), batch_first=True)
    return memory, (torch.arange(memory.shape[1], device=device)[None, :] < frames[:, None]).unsqueeze(1)


def build_decoder_batch(
    encoder_outs: Sequence[torch.Tensor], nbests: Sequence[Sequence[Hypothesis]], sos: int, eos: int
) -> DecoderBatch:
    """Stack every hypothesis of every stream into one padded decoder batch."""
    device = encoder_outs[0].device
    stream_of_row = [s for s, nbest in enumerate(nbests) for _ in nbest]
    hyps = [h.tokens for nbest in nbests for h in nbest]
    num_rows = len(hyps)
    max_len = max(len(h) for h in hyps)
    encoders, memory_mask = padded_memory(encoder_outs)
    rows = torch.tensor(stream_of_row, device=device, dtype=torch.long)  # (M,)

    ys_in = torch.full((num_rows, max_len + 1), eos, dtype=torch.long)
    r_ys_in = torch.full((num_rows, max_len + 1), eos, dtype=torch.long)
    targets = torch.full((num_rows, max_len + 1), eos, dtype=torch.long)
    r_targets = torch.full((num_rows, max_len + 1), eos, dtype=torch.long)
    ys_in[:, 0] = sos
    r_ys_in[:, 0] = sos
    for i, tokens in enumerate(hyps):
        n = len(tokens)
        if n:
            forward = torch.tensor(tokens, dtype=torch.long)
            backward = forward.flip(0)
            ys_in[i, 1 : n + 1] = forward
            r_ys_in[i, 1 : n + 1] = backward
            targets[i, :n] = forward
            r_targets[i, :n] = backward
    lens = torch.tensor([len(h) for h in hyps], dtype=torch.long)  # (M,)
    target_mask = torch.arange(max_len + 1)[None, :] <= lens[:, None]  # (M, L + 1)
    return DecoderBatch(
        memory=encoders,
        memory_mask=memory_mask,
        memory_rows=rows,
        ys_in_pad=ys_in.to(device),
        ys_in_lens=(lens + 1).to(device),
        r_ys_in_pad=r_ys_in.to(device),
        targets=targets,
        r_targets=r_targets,
        target_mask=target_mask,
    )


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


@dataclass(frozen=True)
class PrefixTree:
    """The distinct prefixes of one utterance's hypotheses, each [sos] + tokens, as a tree.

    Nodes are numbered parents first; node 0 is the root (sos). ``paths[h][j]`` is the node of
    hypothesis h's first j tokens (j = 0..len). A decoder output depends only on the prefix
    before it, so decoding each node once (``forward_tree``) gives every hypothesis' outputs
    while hypotheses that share a prefix (most of an n-best list) share that work.
    """

    tokens: list[int]
    depths: list[int]
    parents: list[int]
    paths: list[list[int]]

    @classmethod
    def of(cls, hyps: Sequence[Sequence[int]], sos: int) -> PrefixTree:
        tokens, depths, parents = [sos], [0], [-1]
        children: dict[tuple[int, int], int] = {}
        paths = []
        for hyp in hyps:
            node, path = 0, [0]
            for token in hyp:
                child = children.get((node, token))
                if child is None:
                    child = len(tokens)
                    children[(node, token)] = child
                    tokens.append(token)
                    depths.append(depths[node] + 1)
                    parents.append(node)
                node = child
                path.append(node)
            paths.append(path)
        return cls(tokens, depths, parents, paths)

    def __len__(self) -> int:
        return len(self.tokens)

    def mask(self, size: int) -> np.ndarray:
        """(size, size) bool: node i attends node j iff j is i or an ancestor (padding: itself)."""
        mask = np.zeros((size, size), dtype=bool)
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                mask[node] = mask[parent]
            mask[node, node] = True
        idle = np.arange(len(self.tokens), size)
        mask[idle, idle] = True
        return mask


def tree_batch(trees: Sequence[PrefixTree], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, positions, mask) of S trees padded to the largest: (S, N), (S, N), (S, N, N)."""
    size = max(len(tree) for tree in trees)
    tokens = torch.full((len(trees), size), pad, dtype=torch.long)
    positions = torch.zeros((len(trees), size), dtype=torch.long)
    masks = np.stack([tree.mask(size) for tree in trees])
    for s, tree in enumerate(trees):
        tokens[s, : len(tree)] = torch.tensor(tree.tokens)
        positions[s, : len(tree)] = torch.tensor(tree.depths)
    return tokens, positions, torch.from_numpy(masks)


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


PADDING_SLACK = 1.25
"""A decoder call may spend this much more than its hypotheses' own lengths on padding ..."""
PADDING_ALLOWANCE = 64
"""... or this many padded token positions (about what one more call's overhead costs)."""
MAX_CALL_POSITIONS = 1024
"""Padded token positions (hypotheses x length) per decoder call. A call's activations grow
with its positions: its log-softmax output alone is positions x vocabulary floats (17 MB at
1024 positions of a 4,233-unit vocabulary). Past a few thousand positions they no longer fit
in the caches, the allocator hands out fresh pages for every call, and the page faults cost
more than the extra calls (measured: see docs/BENCHMARKS.md, rescore micro-benchmark)."""


def length_groups(
    nbests: Sequence[Sequence[Hypothesis]],
    slack: float = PADDING_SLACK,
    allowance: int = PADDING_ALLOWANCE,
    max_positions: float = MAX_CALL_POSITIONS,
) -> list[list[int]]:
    """Streams split into decoder calls of similar hypothesis length.

    Every hypothesis of a call is padded to the call's longest, and the decoder's cost grows
    with the padded length, so a short utterance rescored beside a long one costs as much as
    the long one. Streams are taken shortest first and a new call starts when padding would
    exceed both ``slack`` times the work the hypotheses need and ``allowance`` positions; a
    few more, smaller calls cost far less than the padding they save. A call also ends before
    its padded positions would exceed ``max_positions`` (a stream bigger than that gets a call
    of its own). Returns stream indices per call.
    """
    return _pack_calls(
        rows=[len(nbest) for nbest in nbests],
        longest=[max(len(h.tokens) for h in nbest) + 1 for nbest in nbests],
        needed=[sum(len(h.tokens) + 1 for h in nbest) for nbest in nbests],
        slack=slack,
        allowance=allowance,
        max_positions=max_positions,
    )


def _pack_calls(
    rows: Sequence[int], longest: Sequence[int], needed: Sequence[int], slack: float, allowance: int,
    max_positions: float,
) -> list[list[int]]:  # fmt: skip
    """Streams (``rows[s]`` decoder rows, the longest ``longest[s]`` positions, ``needed[s]``
    positions of real work) packed shortest first into calls by the rules of :func:`length_groups`."""
    groups: list[list[int]] = []
    current: list[int] = []
    call_rows = call_needed = 0
    for s in sorted(range(len(rows)), key=lambda s: longest[s]):
        padded = (call_rows + rows[s]) * longest[s]
        wasteful = padded > slack * (call_needed + needed[s]) and padded - call_needed - needed[s] > allowance
        if current and (wasteful or padded > max_positions):
            groups.append(current)
            current, call_rows, call_needed = [], 0, 0
        current.append(s)
        call_rows += rows[s]
        call_needed += needed[s]
    if current:
        groups.append(current)
    return groups


def size_groups(
    sizes: Sequence[int],
    slack: float = PADDING_SLACK,
    allowance: int = PADDING_ALLOWANCE,
    max_positions: float = MAX_CALL_POSITIONS,
) -> list[list[int]]:
    """Streams with one decoder row each (a prefix tree of ``sizes[s]`` nodes) split into calls,
    by the rules of :func:`length_groups`."""
    return _pack_calls([1] * len(sizes), sizes, sizes, slack, allowance, max_positions)


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
