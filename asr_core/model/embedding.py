"""Sinusoidal position embeddings, computed for any position (no max_len table limit).

Values equal WeNet's ``pe`` buffer row by row: ``pe[p, 2i] = sin(p * div_i)``,
``pe[p, 2i+1] = cos(p * div_i)``, ``div_i = exp(-ln(10000) * 2i / d_model)``, in float32.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoid(positions: Tensor, d_model: int) -> Tensor:
    """positions: (...) int64 -> (..., d_model) float32 embedding rows."""
    div_term = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device) * -(math.log(10000.0) / d_model)
    )  # (d_model/2,)
    angle = positions.to(torch.float32).unsqueeze(-1) * div_term  # (..., d_model/2)
    return torch.stack((torch.sin(angle), torch.cos(angle)), dim=-1).flatten(-2)


class PositionalEncoding(nn.Module):
    """Absolute position encoding: x * sqrt(d) + pe[positions]."""

    def __init__(self, d_model: int, dropout_rate: float) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout_rate)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, T, D); positions: (B, T) or (T,) int64 -> (B, T, D).

        WeNet also returns the embedding rows; no caller here uses them (rel_selfattn layers
        project each key's position themselves), so they are not computed."""
        return self.dropout(x * self.xscale + sinusoid(positions, self.d_model).to(x.dtype))


class RelPositionalEncoding(PositionalEncoding):
    """WeNet's ``RelPositionalEncoding``: x * sqrt(d), nothing added; the rel_selfattn layers
    take the sinusoid of each key's absolute position instead."""

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.dropout(x * self.xscale)
