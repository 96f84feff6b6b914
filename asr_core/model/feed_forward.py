"""Position-wise feed-forward block and the activation table."""

from __future__ import annotations

from torch import Tensor, nn

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
        return self.w_2(self.dropout(self.activation(self.w_1(x))))
