"""Position-wise feed-forward block and the activation table."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from asr_core.model.inference import exporting

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "swish": nn.SiLU,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
}


class PositionwiseFeedForward(nn.Module):
    """w_2(dropout(act(w_1(x)))): (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, hidden: int, dropout_rate: float, activation: str) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, hidden)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout_rate)
        self.w_2 = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.w_1(x)
        if not (self.training or torch.is_grad_enabled() or exporting()) and type(self.activation) in _IN_PLACE:
            # In inference the activation overwrites w_1's output, which nothing else holds:
            # the same values without writing a second (positions x hidden) tensor.
            return self.w_2(_IN_PLACE[type(self.activation)](hidden))
        return self.w_2(self.dropout(self.activation(hidden)))


def _silu_(x: Tensor) -> Tensor:
    return nn.functional.silu(x, inplace=True)


_IN_PLACE: dict[type[nn.Module], Callable[[Tensor], Tensor]] = {nn.ReLU: torch.relu_, nn.SiLU: _silu_}
"""The activations of ``ACTIVATIONS`` that have an in-place form."""
