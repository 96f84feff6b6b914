"""Label-smoothing KL loss of the attention decoder (WeNet's ``LabelSmoothingLoss``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LabelSmoothingLoss(nn.Module):
    """KL(smoothed one-hot || softmax(x)) summed over valid positions, divided by the batch
    size (or by the number of tokens with ``normalize_length``)."""

    def __init__(self, size: int, padding_idx: int, smoothing: float, normalize_length: bool) -> None:
        super().__init__()
        self.size = size
        self.padding_idx = padding_idx
        self.smoothing = smoothing
        self.confidence = 1.0 - smoothing
        self.normalize_length = normalize_length

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        """x: (B, L, V) logits or log-probs; target: (B, L) int64 with ``padding_idx`` padding."""
        batch_size = x.size(0)
        x = x.reshape(-1, self.size)
        target = target.reshape(-1)
        ignore = target == self.padding_idx  # (B*L,)
        true_dist = torch.full_like(x, self.smoothing / (self.size - 1))
        true_dist.scatter_(1, target.masked_fill(ignore, 0).unsqueeze(1), self.confidence)
        kl = nn.functional.kl_div(torch.log_softmax(x, dim=1), true_dist, reduction="none")
        denom = (~ignore).sum() if self.normalize_length else batch_size
        return kl.masked_fill(ignore.unsqueeze(1), 0.0).sum() / denom
