"""Conformer and transformer encoder blocks (WeNet module names and norm placement)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asr_core.model.attention import MultiHeadedAttention
from asr_core.model.convolution import ConvolutionModule
from asr_core.model.feed_forward import PositionwiseFeedForward


class ConformerEncoderLayer(nn.Module):
    """[macaron FFN x0.5] -> MHSA -> [conv] -> FFN (x0.5 if macaron) -> [norm_final].

    With ``normalize_before`` each sub-block is ``x + f(norm(x))``; otherwise ``norm(x + f(x))``.
    A transformer block is the same without macaron FFN and conv; WeNet names its norms
    ``norm1`` (attention) and ``norm2`` (FFN), hence ``norm_names``.
    """

    def __init__(
        self,
        size: int,
        self_attn: MultiHeadedAttention,
        feed_forward: PositionwiseFeedForward,
        feed_forward_macaron: PositionwiseFeedForward | None,
        conv_module: ConvolutionModule | None,
        dropout_rate: float,
        normalize_before: bool,
        norm_eps: float = 1e-5,
        norm_names: tuple[str, str] = ("norm_mha", "norm_ff"),
    ) -> None:
        super().__init__()
        self._norm_names = norm_names
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.feed_forward_macaron = feed_forward_macaron
        self.conv_module = conv_module
        self.add_module(norm_names[0], nn.LayerNorm(size, eps=norm_eps))
        self.add_module(norm_names[1], nn.LayerNorm(size, eps=norm_eps))
        if feed_forward_macaron is not None:
            self.norm_ff_macaron = nn.LayerNorm(size, eps=norm_eps)
            self.ff_scale = 0.5
        else:
            self.ff_scale = 1.0
        if conv_module is not None:
            self.norm_conv = nn.LayerNorm(size, eps=norm_eps)
            self.norm_final = nn.LayerNorm(size, eps=norm_eps)
        self.dropout = nn.Dropout(dropout_rate)
        self.normalize_before = normalize_before

    def _sub_block(self, x: Tensor, norm: nn.Module, f: nn.Module, scale: float = 1.0) -> Tensor:
        """``x + scale * f(norm(x))`` (or ``norm(x + scale * f(x))``), the scaling done by the
        addition (its ``alpha``) instead of a separate pass over the sub-block's output; the same
        numbers for WeNet's scales, 1 and 0.5, whose products are exact."""
        if self.normalize_before:
            return torch.add(x, self.dropout(f(norm(x))), alpha=scale)
        return norm(torch.add(x, self.dropout(f(x)), alpha=scale))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        key_positions: Tensor,
        table_rows: int,
        mask_pad: Tensor | None,
        kv_cache: Tensor,
        cnn_cache: Tensor | None,
        glu_start: Tensor | None = None,
        valid_frames: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One block over new frames with cached left context.

        x: (B, T, D); mask: (B, 1|T, W+T) attention mask over cache+new keys, bool or an additive
        float bias (``MultiHeadedAttention.attend``);
        key_positions: (B|1, W+T) int64; mask_pad: (B, 1, T) bool or None (padding in the
        full-utterance forward); kv_cache: (B, H, W, 2*d_k) keys|values; cnn_cache: (B, D, K-1)
        or None (zeros); glu_start: (B, K-1) bool, the conv cache in the GLU layout (see
        ``ConvolutionModule.forward``) or None (WeNet's); valid_frames: (B,) int64 real frames
        of each row (the rest padding, already masked out of ``mask``) or None (all).
        Returns (y (B, T, D), kv_new (B, H, T, 2*d_k), new_cnn (B, D, K-1)).
        """
        norm_mha: nn.Module = getattr(self, self._norm_names[0])
        norm_ff: nn.Module = getattr(self, self._norm_names[1])
        if self.feed_forward_macaron is not None:
            x = self._sub_block(x, self.norm_ff_macaron, self.feed_forward_macaron, self.ff_scale)
        residual = x
        h = norm_mha(x) if self.normalize_before else x
        att, kv_new = self.self_attn.forward_cached(h, kv_cache, mask, key_positions, table_rows)
        x = residual + self.dropout(att)
        if not self.normalize_before:
            x = norm_mha(x)
        new_cnn = x.new_zeros(x.size(0), x.size(2), 0)
        if self.conv_module is not None:
            residual = x
            h = self.norm_conv(x) if self.normalize_before else x
            conv, new_cnn = self.conv_module(h, mask_pad, cnn_cache, glu_start, valid_frames)
            x = residual + self.dropout(conv)
            if not self.normalize_before:
                x = self.norm_conv(x)
        x = self._sub_block(x, norm_ff, self.feed_forward, self.ff_scale)
        if self.conv_module is not None:
            x = self.norm_final(x)
        return x, kv_new, new_cnn
