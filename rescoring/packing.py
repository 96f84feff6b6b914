"""Hypotheses packed into decoder calls: which streams share a call (``length_groups``,
``size_groups``), and each call's inputs, padded (``build_decoder_batch``) or as one prefix tree
per utterance (``PrefixTree``, ``tree_batch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rescoring.protocols import Hypothesis


@dataclass(frozen=True)
class DecoderBatch:
    """Padded decoder inputs for M hypotheses drawn from S streams (see ``protocols.DecoderFn``)."""

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
