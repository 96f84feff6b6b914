"""Conformer convolution module with a causal depthwise convolution and its streaming cache."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asr_core.model.feed_forward import ACTIVATIONS
from asr_core.model.inference import may_cache_derived, weights_key


def pointwise(conv: nn.Module, x: Tensor) -> Tensor:
    """A kernel-1 ``nn.Conv1d`` applied to channels-last frames as one matmul (its weight viewed
    as (out, in)): x (B, T, C_in) -> (B, T, C_out). A module that replaced the conv (the Linear
    from ``pointwise_as_linear``, possibly quantized by a backend) is called as is."""
    if isinstance(conv, nn.Conv1d):
        return nn.functional.linear(x, conv.weight.squeeze(2), conv.bias)
    return conv(x)


def pointwise_as_linear(conv: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` equal to a kernel-1 ``nn.Conv1d`` on channels-last frames (weights copied)."""
    if not isinstance(conv, nn.Conv1d) or conv.kernel_size != (1,) or conv.groups != 1:
        raise TypeError(f"expected a kernel-1 Conv1d, got {conv}")
    linear = nn.Linear(conv.in_channels, conv.out_channels, bias=conv.bias is not None)
    linear.to(conv.weight.device, conv.weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.squeeze(2))
        if conv.bias is not None and linear.bias is not None:
            linear.bias.copy_(conv.bias)
    return linear


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
        self.pointwise_conv1: nn.Module = nn.Conv1d(channels, 2 * channels, 1, bias=bias)
        if causal:
            padding, self.lorder = 0, kernel_size - 1
        else:
            if (kernel_size - 1) % 2:
                raise ValueError(f"a non-causal conv needs an odd kernel, got {kernel_size}")
            padding, self.lorder = (kernel_size - 1) // 2, 0
        self.depthwise_conv = nn.Conv1d(channels, channels, kernel_size, padding=padding, groups=channels, bias=bias)
        self.use_layer_norm = norm == "layer_norm"
        self.norm: nn.Module = nn.LayerNorm(channels, eps=norm_eps) if self.use_layer_norm else nn.BatchNorm1d(channels)
        self.pointwise_conv2: nn.Module = nn.Conv1d(channels, channels, 1, bias=bias)
        self.activation = ACTIVATIONS[activation]()
        self._zero_glu: Tensor | None = None
        self._zero_glu_key: tuple[object, ...] = ()

    def forward(
        self,
        x: Tensor,
        mask_pad: Tensor | None,
        cache: Tensor | None,
        glu_start: Tensor | None = None,
        valid_frames: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """x: (B, T, D); mask_pad: (B, 1, T) bool or None; cache: (B, D, kernel-1) or None (zeros).

        Frames stay channels-last: the pointwise convs run as matmuls on (B, T, D) (see
        ``pointwise``); only the depthwise conv sees (B, D, T).

        ``cache`` holds the module's last kernel-1 inputs (WeNet's layout), or with ``glu_start``
        ((B, kernel-1) bool, True for cache frames before the stream's start; causal, chunked
        only) the last kernel-1 outputs of the GLU, i.e. the depthwise conv's inputs. WeNet's
        layout makes every chunk run the first pointwise conv over the kernel-1 cached frames
        again (14 old frames for 4 new ones at 160 ms); the GLU layout runs it on the new frames
        only. Frames before the start are zero inputs in either layout (WeNet pads with zeros).
        ``valid_frames`` ((B,) int64, causal only): each row's frames that are real, the rest
        padding (a short last chunk run at its full shape); the new cache ends at the last real
        frame, as if the row had only those; the real frames' outputs never see the padding (causal).
        Returns (y (B, T, D), new_cache (B, D, kernel-1) in the same layout; (B, D, 0) when not
        causal).
        """
        if glu_start is not None:
            if cache is None or self.lorder == 0 or mask_pad is not None:
                raise ValueError("the GLU cache layout needs a causal conv, a cache and no padding mask")
            zero_input = self._zero_frame_glu(x)
            x = nn.functional.glu(pointwise(self.pointwise_conv1, x), dim=2)  # (B, T, D)
            x = torch.cat((cache.transpose(1, 2), x), dim=1)  # (B, kernel-1 + T, D)
            # Cache frames before the stream's start get the zero input's GLU output, blended into
            # the concatenated copy in place (exact for the finite values a conv cache holds): a
            # torch.where building the history first took 60 % longer. (A boolean-mask write was
            # faster still on a CPU, but would wait for the device in every layer on a GPU.)
            start = glu_start.unsqueeze(2).to(x.dtype)  # (B, kernel-1, 1), 1.0 before the start
            x[:, : self.lorder].mul_(1.0 - start).addcmul_(start, zero_input)
            new_cache = self._last_frames(x, valid_frames)
            return self._depthwise_on(x), new_cache
        if mask_pad is not None:
            x = x.masked_fill(~mask_pad.transpose(1, 2), 0.0)  # padding frames -> 0
        if self.lorder > 0:
            if cache is None:
                x = nn.functional.pad(x, (0, 0, self.lorder, 0), "constant", 0.0)
            else:
                x = torch.cat((cache.transpose(1, 2), x), dim=1)  # (B, kernel-1 + T, D)
            new_cache = self._last_frames(x, valid_frames)
        else:
            new_cache = x[:, :0].transpose(1, 2)
        x = pointwise(self.pointwise_conv1, x)  # (B, T', 2D)
        x = nn.functional.glu(x, dim=2)  # (B, T', D)
        x = self._depthwise_on(x)
        if mask_pad is not None:
            x = x.masked_fill(~mask_pad.transpose(1, 2), 0.0)
        return x, new_cache

    def _last_frames(self, x: Tensor, valid_frames: Tensor | None) -> Tensor:
        """x: (B, kernel-1 + T, D) cache + new frames -> the next cache (B, D, kernel-1): the
        kernel-1 frames up to the last one, or up to each row's last real one (``valid_frames``)."""
        if valid_frames is None:
            return x[:, -self.lorder :].transpose(1, 2)
        # Whole frames picked as rows of the flattened (B * (kernel-1 + T), D) frames: one
        # memory copy per frame, where a gather along dim 1 read an index per value (AISHELL
        # size, 48 streams: 290 -> 40-60 us per layer).
        b, frames, d = x.shape
        first = valid_frames + frames * torch.arange(b, device=x.device)  # (B,) row of each cache's first frame
        rows = first.unsqueeze(1) + torch.arange(self.lorder, device=x.device)  # (B, kernel-1)
        return x.reshape(b * frames, d).index_select(0, rows.reshape(-1)).view(b, self.lorder, d).transpose(1, 2)

    def _zero_frame_glu(self, like: Tensor) -> Tensor:
        """The GLU output of a zero input frame, (1, 1, D): what the GLU cache layout holds for
        frames before a stream's start.

        Cached while ``may_cache_derived``, until ``pointwise_conv1`` is replaced or its
        parameters change (a dynamically quantized Linear has none to watch: a backend's copy
        replaces it rather than editing it). Otherwise each chunk step computed it again in
        every layer, an int8 matmul call of its own (0.7 ms of a 32-stream torch-int8 step)."""
        conv = self.pointwise_conv1
        cache = may_cache_derived(self)
        key = (id(conv), *weights_key(*conv.parameters())) if cache else ()
        if cache and self._zero_glu is not None and self._zero_glu_key == key:
            return self._zero_glu
        zero_glu = nn.functional.glu(pointwise(conv, like.new_zeros(1, 1, like.size(2))), dim=2)
        if cache:
            self._zero_glu, self._zero_glu_key = zero_glu, key
        return zero_glu

    def _depthwise_on(self, x: Tensor) -> Tensor:
        """GLU outputs (B, T', D) -> (B, T, D): depthwise conv, norm, activation, second pointwise.

        The depthwise conv runs as a 2-D conv over a (B, D, 1, T') view of the channels-last
        frames, which is a channels-last image: oneDNN then runs its channels-last depthwise
        kernel and returns channels-last output, a view of (B, T, D) frames again. As a 1-D conv
        of the transposed frames it ran a slower planar kernel between two transposing copies
        (AISHELL size, 32 streams of a 4-frame chunk: 218 -> 68 us per layer with the norm).
        """
        conv = self.depthwise_conv
        y = nn.functional.conv2d(
            x.transpose(1, 2).unsqueeze(2), conv.weight.unsqueeze(2), conv.bias,
            padding=(0, int(conv.padding[0])), groups=conv.groups,
        ).squeeze(2)  # (B, D, T) over channels-last memory  # fmt: skip
        x = self.norm(y.transpose(1, 2)) if self.use_layer_norm else self.norm(y).transpose(1, 2)  # (B, T, D)
        return pointwise(self.pointwise_conv2, self.activation(x))
