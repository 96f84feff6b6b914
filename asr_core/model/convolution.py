"""Conformer convolution module with a causal depthwise convolution and its streaming cache."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asr_core.model.feed_forward import ACTIVATIONS


class ConvolutionModule(nn.Module):
    """pointwise_conv1 -> GLU -> depthwise conv -> norm -> activation -> pointwise_conv2.

    Causal: the depthwise conv sees ``kernel-1`` frames of left context, taken from the cache
    (the last kernel-1 frames of this module's INPUT, channels first) or zeros for a new
    stream, exactly like WeNet (the zeros are padded before pointwise_conv1).
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        activation: str,
        norm: str,
        causal: bool,
        bias: bool = True,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(channels, 2 * channels, 1, bias=bias)
        if causal:
            padding, self.lorder = 0, kernel_size - 1
        else:
            if (kernel_size - 1) % 2:
                raise ValueError(f"a non-causal conv needs an odd kernel, got {kernel_size}")
            padding, self.lorder = (kernel_size - 1) // 2, 0
        self.depthwise_conv = nn.Conv1d(channels, channels, kernel_size, padding=padding, groups=channels, bias=bias)
        self.use_layer_norm = norm == "layer_norm"
        self.norm: nn.Module = nn.LayerNorm(channels, eps=norm_eps) if self.use_layer_norm else nn.BatchNorm1d(channels)
        self.pointwise_conv2 = nn.Conv1d(channels, channels, 1, bias=bias)
        self.activation = ACTIVATIONS[activation]()

    def forward(self, x: Tensor, mask_pad: Tensor | None, cache: Tensor | None) -> tuple[Tensor, Tensor]:
        """x: (B, T, D); mask_pad: (B, 1, T) bool or None; cache: (B, D, kernel-1) or None (zeros).

        Returns (y (B, T, D), new_cache (B, D, kernel-1); (B, D, 0) when not causal).
        """
        x = x.transpose(1, 2)  # (B, D, T)
        if mask_pad is not None:
            x = x.masked_fill(~mask_pad, 0.0)
        if self.lorder > 0:
            if cache is None:
                x = nn.functional.pad(x, (self.lorder, 0), "constant", 0.0)
            else:
                x = torch.cat((cache, x), dim=2)  # (B, D, kernel-1 + T)
            new_cache = x[:, :, -self.lorder :]
        else:
            new_cache = x[:, :, :0]
        x = nn.functional.glu(self.pointwise_conv1(x), dim=1)  # (B, D, T')
        x = self.depthwise_conv(x)  # (B, D, T)
        if self.use_layer_norm:
            x = self.activation(self.norm(x.transpose(1, 2))).transpose(1, 2)
        else:
            x = self.activation(self.norm(x))
        x = self.pointwise_conv2(x)
        if mask_pad is not None:
            x = x.masked_fill(~mask_pad, 0.0)
        return x.transpose(1, 2), new_cache
