"""What rescoring needs of its collaborators, as ``Protocol``s: an n-best entry
(``Hypothesis``), the bidirectional decoder (``DecoderFn``) and a decoder that scores prefix
trees (``TreeDecoder``). The model's decoders (``asr_core.model.decoder``) satisfy the last two.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

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
