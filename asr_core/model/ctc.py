"""CTC head: ``ctc_lo`` projection, log-posteriors and the CTC loss (WeNet's ``CTC``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class CTC(nn.Module):
    """Linear(D, V) + log_softmax; loss summed over the batch and divided by B, as WeNet."""

    def __init__(self, vocab_size: int, d_model: int, blank_id: int = 0) -> None:
        super().__init__()
        self.ctc_lo = nn.Linear(d_model, vocab_size)
        self.ctc_loss = nn.CTCLoss(blank=blank_id, reduction="sum", zero_infinity=True)

    def log_softmax(self, hs: Tensor) -> Tensor:
        """hs: (B, T', D) -> (B, T', V) log-posteriors."""
        return torch.log_softmax(self.ctc_lo(hs), dim=-1)

    def forward(self, hs: Tensor, hlens: Tensor, ys_pad: Tensor, ys_lens: Tensor) -> Tensor:
        """hs: (B, T', D); hlens: (B,); ys_pad: (B, S) padded with -1; ys_lens: (B,) -> scalar."""
        logp = self.log_softmax(hs).transpose(0, 1)  # (T', B, V)
        loss = self.ctc_loss(logp, ys_pad.clamp(min=0), hlens, ys_lens)
        return loss / hs.size(0)
