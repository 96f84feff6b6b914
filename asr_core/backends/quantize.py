"""Reduced-precision copies of model parts for the CPU: dynamic int8 Linears (the int8 chunk
runner and the finals' rescoring decoder), and the int8 runner's subsampling convs in int8 where
the CPU has int8 dot products, else in bfloat16 where it computes bf16 natively;
``rescoring_decoder`` also hands the finals' decoder to its traced graphs (``traced_decoder``)."""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn
from torch.ao.nn.intrinsic import LinearReLU

from asr_core import cpu_isa
from asr_core.backends.traced_decoder import TracedTreeDecoder
from asr_core.model.attention import MultiHeadedAttention
from asr_core.model.convolution import ConvolutionModule, pointwise_as_linear
from asr_core.model.decoder import BiTransformerDecoder, TransformerDecoder
from asr_core.model.feed_forward import PositionwiseFeedForward
from asr_core.model.subsampling import Conv2dSubsampling

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def int8_engine(isa: cpu_isa.CpuIsa | None = None) -> str:
    """The torch quantized engine the int8 Linears are packed for on this CPU (default: `cpu_isa.detect()`).

    oneDNN on CPUs with AMX, where it runs the dynamic int8 Linears on the AMX tiles: the
    AISHELL-size torch-int8 chunk step of 32 streams took 77 instead of 86 ms on an AMX Xeon (eager).
    torch's default ``x86`` engine (fbgemm for these Linears) elsewhere: on the same Xeon capped
    to AVX512-VNNI (``ONEDNN_MAX_CPU_ISA``) oneDNN's Linears were a little slower than fbgemm's,
    and capped to AVX2 much slower. Both engines quantize the activations to 7 bits here.
    """
    isa = cpu_isa.detect() if isa is None else isa
    supported = torch.backends.quantized.supported_engines
    if isa.amx and "onednn" in supported:
        return "onednn"
    return "x86" if "x86" in supported else torch.backends.quantized.engine


def quantize_linears(module: ModuleT, which: Iterable[str] | Iterable[type[nn.Module]]) -> ModuleT:
    """``module`` (changed in place) with the chosen Linears dynamically quantized to int8.

    The weights are prepacked for `int8_engine()`, which this sets as the process's quantized
    engine first (it is process-global, and stays set: a packed weight copied or unpickled later
    is packed again for the engine set then, so every int8 module of the process, the chunk
    runner's and the finals' rescoring decoder's, in this process or the finals' child, uses
    the same one).

    torch 2.13 still ships eager dynamic quantization but marks ``torch.ao.quantization``
    deprecated, and every call warns twice; those two warnings are silenced here so that each
    service start does not print them. (If a later torch removes the API, the bfloat16 dtype is
    the CPU fallback: about as fast on AVX512-BF16/AMX CPUs, see deploy/README.md.)
    """
    torch.backends.quantized.engine = int8_engine()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message="torch.ao.quantization is deprecated")
        warnings.filterwarnings("ignore", category=UserWarning, message="torch.quantize_per_tensor")
        quantized: ModuleT = torch.ao.quantization.quantize_dynamic(module, which, dtype=torch.qint8)
    return quantized


def rescoring_decoder(backend: str, decoder: nn.Module, traced: bool = True) -> nn.Module:
    """The attention decoder the finals are rescored with, on the CPU: int8 Linears (a copy)
    with an int8 backend, where rescoring is the other large cost besides the encoder; and with
    ``traced`` (``EngineOptions.traced_rescoring``) its prefix-tree forward run as frozen
    TorchScript graphs (``traced_decoder.TracedTreeDecoder``). Elsewhere ``decoder`` itself."""
    if next(decoder.parameters()).device.type != "cpu":
        return decoder
    if backend.endswith("int8"):
        decoder = quantize_linears(fuse_linear_relus(copy.deepcopy(decoder)), {nn.Linear, LinearReLU})
    if traced and isinstance(decoder, TransformerDecoder | BiTransformerDecoder):
        return TracedTreeDecoder(decoder)
    return decoder


def fuse_linear_relus(module: ModuleT) -> ModuleT:
    """``module`` (changed in place) with each feed-forward's first Linear and its ReLU fused
    into one ``LinearReLU``, which ``quantize_linears`` turns into one int8 op that applies the
    ReLU to its output (same values). The decoder's feed-forward output of a rescoring call is
    large (positions x 2,048 floats, 13 MB for a call of 1,600 tree nodes), and a separate ReLU
    made one more pass over it: fused, rescoring calls took 4 % less CPU (AISHELL size, onednn
    engine, one thread; docs/BENCHMARKS.md)."""
    for feed_forward in module.modules():
        if isinstance(feed_forward, PositionwiseFeedForward) and type(feed_forward.activation) is nn.ReLU:
            torch.ao.quantization.fuse_modules(feed_forward, [["w_1", "activation"]], inplace=True)
    return module


@functools.cache
def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX) and oneDNN may use it.

    oneDNN also runs bfloat16 on plain AVX512 (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``
    is true there), but by emulation, slower than float32: on an AVX512-VNNI Xeon without
    AVX512-BF16 the subsampling convs took 3.5x as long in bf16 as in float32 and a training step
    twice as long (docs/BENCHMARKS.md). Reads the flags of ``/proc/cpuinfo`` masked by
    ``ONEDNN_MAX_CPU_ISA`` (``cpu_isa.detect``: oneDNN capped below AVX512 has no bf16 convs,
    and the fused conv+ReLU of ``Bf16Convs`` then fails), and asks oneDNN too; where that file
    is missing (not Linux) oneDNN's answer alone is taken."""
    supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if not Path("/proc/cpuinfo").exists():
        return supported
    isa = cpu_isa.detect()
    return supported and (isa.bf16 or isa.amx)


class Bf16Convs(nn.Module):
    """A float conv stack (``nn.Conv2d`` layers, each optionally followed by an ``nn.ReLU``)
    run in bfloat16: float in, float out.

    For the int8 backend's conv2d subsampling, about a fifth of its chunk step in float32
    (a 256->256 3x3 conv per encoder frame). oneDNN's bf16 convs run it ~2x faster
    (AISHELL-size, 20 streams' chunks: 20.4 -> 10.4 ms) at ~0.4 % relative error of the
    output, below the int8 Linears' own error that follows it.

    Each ReLU runs inside its conv, as oneDNN's post-op (`conv_relu`), with the same results
    bit for bit: as a separate op on the first conv's large bf16 output (2.9 M values for 32
    streams) torch's bf16 ReLU took 1.2 ms, more than twice a float32 ReLU of the same size.
    """

    def __init__(self, convs: nn.Module) -> None:
        super().__init__()
        self.convs = copy.deepcopy(convs).to(torch.bfloat16)
        layers = list(self.convs.children())
        self._relu_after: list[bool] = []
        for i, layer in enumerate(layers):
            if isinstance(layer, nn.Conv2d) and not isinstance(layer.padding, str):
                self._relu_after.append(i + 1 < len(layers) and isinstance(layers[i + 1], nn.ReLU))
            elif not (isinstance(layer, nn.ReLU) and i > 0 and isinstance(layers[i - 1], nn.Conv2d)):
                raise TypeError(
                    f"Bf16Convs runs Conv2d layers with numeric padding, each optionally + ReLU; got {layer}"
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        convs = [layer for layer in self.convs.children() if isinstance(layer, nn.Conv2d)]
        for conv, relu in zip(convs, self._relu_after, strict=True):
            if relu:
                x = fused_conv_relu(conv, x)
            else:
                x = conv(x)
        return x.float()


_CONV_RELU_SOURCE = """
def conv_relu(x: Tensor, weight: Tensor, bias: Optional[Tensor], padding: List[int], stride: List[int],
              dilation: List[int], groups: int) -> Tensor:
    no_scalars: List[Optional[number]] = []
    return torch.ops.mkldnn._convolution_pointwise(
        x, weight, bias, padding, stride, dilation, groups, "relu", no_scalars, "")
"""


@functools.cache
def conv_relu() -> Callable[..., torch.Tensor]:
    """``relu(conv2d(x, weight, bias, padding, stride, dilation, groups))`` as one oneDNN conv
    with a ReLU post-op (``mkldnn._convolution_pointwise``, what inductor fuses such pairs
    into), compiled as TorchScript: the tracer cannot record the op's (empty) ``Scalar?[]``
    argument, while a scripted call to it traces into the chunk step's graph like any other op.
    Where TorchScript is gone (the chunk step then runs eagerly anyway), the op is called as is."""
    try:
        fn: Callable[..., torch.Tensor] = torch.jit.CompilationUnit(_CONV_RELU_SOURCE).conv_relu
    except (AttributeError, RuntimeError):
        return lambda *conv: torch.ops.mkldnn._convolution_pointwise(*conv, "relu", [], "")
    return fn


def fused_conv_relu(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``relu(conv(x))`` as one oneDNN op (``conv_relu``), with ``conv``'s own weights and geometry."""
    padding, stride, dilation = (list(v) for v in (conv.padding, conv.stride, conv.dilation))
    return conv_relu()(x, conv.weight, conv.bias, padding, stride, dilation, conv.groups)


class Int8Convs(nn.Module):
    """A conv2d subsampling's stack (``nn.Conv2d`` + ``nn.ReLU`` pairs) with every conv after
    the first as an int8 matrix product: float in, float out.

    The first conv (one input channel, a few MACs per output) stays in bfloat16 where the CPU
    computes it natively, else float32, with its ReLU as oneDNN's post-op (as ``Bf16Convs``).
    Each later conv, the 256->256 3x3 one that is most of the stack's work, runs as one int8
    matrix product (``torch._int_mm``, int32 sums) of its input's patches (im2col, taken of the
    int8 values, a quarter of a float copy) and its weights quantized per output channel (127
    levels a side); its input, the non-negative output of a ReLU, is quantized per call to 127
    levels with one scale for the batch, ``max / 127``, as the dynamic int8 Linears quantize
    theirs. AISHELL size, traced, one thread, jemalloc: 18.4-19.1 against 25.6-25.8 ms for
    ``Bf16Convs`` at 56 streams' 160 ms chunks, 5.0-5.4 against 7.4 at 16, and faster at every
    width tried from 144 to 512 channels; relative error of the output 1.3-1.6 % against float32
    (bf16 alone: 0.4 %; docs/BENCHMARKS.md). oneDNN's own int8 conv (``onednn::qconv_pointwise``)
    was as fast at 256 channels and 56 streams but about 5x slower than bf16 at 144 and 384
    channels and 16 streams.

    For CPUs with int8 dot products (VNNI or AMX; see ``subsampling_convs``).
    """

    def __init__(self, convs: nn.Module) -> None:
        super().__init__()
        layers = list(convs.children())
        stack = [layer for layer in layers[::2] if isinstance(layer, nn.Conv2d)]
        relus = [layer for layer in layers[1::2] if isinstance(layer, nn.ReLU)]
        if (
            len(layers) < 4
            or len(stack) != (len(layers) + 1) // 2
            or len(relus) != len(stack)
            or any(
                c.padding != (0, 0) or c.dilation != (1, 1) or c.groups != 1 or c.bias is None
                for c in stack
            )
        ):  # fmt: skip
            raise TypeError(
                f"Int8Convs runs two or more Conv2d (no padding or dilation, bias, one group) + ReLU pairs; got {convs}"
            )
        self.dtype = torch.bfloat16 if native_bf16_cpu() else torch.float32
        self.first: nn.Conv2d = copy.deepcopy(stack[0]).to(self.dtype)
        self.quantized = nn.ModuleList(_Int8Conv(conv) for conv in stack[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = fused_conv_relu(self.first, x.to(self.dtype))
        h = h.permute(0, 2, 3, 1)  # (B, T, F, C): channels-last in memory, so a view
        for conv in self.quantized:
            h = conv(h)
        return h.permute(0, 3, 1, 2)  # (B, C, T, F) laid out channels-last, as the float stack's


class _Int8Conv(nn.Module):
    """One conv of ``Int8Convs`` on (B, T, F, C) input that is >= 0, ReLU'd output alike (float32)."""

    weight: torch.Tensor  # (kt * kf * in, out) int8
    weight_scales: torch.Tensor  # (out,)
    bias: torch.Tensor  # (out,)

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        # (out, in, kt, kf) -> (kt, kf, in) per output channel: the order of the patches below.
        weight = conv.weight.detach().float().permute(0, 2, 3, 1).reshape(conv.out_channels, -1)
        scales = weight.abs().amax(1).clamp_min(1e-12) / 127
        quantized = torch.round(weight / scales[:, None]).to(torch.int8)
        self.register_buffer("weight", quantized.t().contiguous())  # (kt * kf * in, out)
        self.register_buffer("weight_scales", scales)
        assert conv.bias is not None  # Int8Convs checked
        self.register_buffer("bias", conv.bias.detach().float())
        self.kernel, self.stride = tuple(conv.kernel_size), tuple(conv.stride)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        scale = (h.amax().float() / 127).clamp_min(1e-12)
        q = h.mul(1 / scale).add_(0.5).to(torch.int8)  # round(h / scale), 0..127 (h >= 0)
        patches = q.unfold(1, self.kernel[0], self.stride[0]).unfold(2, self.kernel[1], self.stride[1])
        b, t, f = patches.shape[:3]  # patches: (B, T', F', C, kt, kf)
        patches = patches.permute(0, 1, 2, 4, 5, 3).reshape(b * t * f, -1)
        sums = torch._int_mm(patches, self.weight)  # (B * T' * F', out) int32
        out = torch.relu_(sums.float().mul_(self.weight_scales * scale).add_(self.bias))
        return out.view(b, t, f, -1)


def int8_convs_supported(isa: cpu_isa.CpuIsa | None = None) -> bool:
    """Whether ``Int8Convs`` may run here: oneDNN (the first conv's fused ReLU), torch's int8
    matrix product, and a CPU with int8 dot products (VNNI or AMX, as ``cpu_isa.detect``
    reports them, capped like oneDNN): without them int8 products are summed in saturating
    int16 pairs or emulated."""
    isa = cpu_isa.detect() if isa is None else isa
    return (isa.vnni or isa.amx) and torch.backends.mkldnn.is_available() and hasattr(torch, "_int_mm")


INT8_CONVS_MIN_CHANNELS = 144
"""Narrower stacks keep ``Bf16Convs``: at 64 and 128 channels the int8 stack was no faster
(16 streams' chunks: 0.94 / 2.04 ms against 0.73 / 1.95), from 144 on it was (2.10 against 2.43)."""


def subsampling_convs(convs: nn.Module) -> nn.Module:
    """The int8 runner's conv2d subsampling stack for this CPU: ``Int8Convs`` where
    ``int8_convs_supported`` and the convs have at least ``INT8_CONVS_MIN_CHANNELS`` channels,
    else ``Bf16Convs`` on native bf16, else ``convs`` itself (float32)."""
    channels = max((c.out_channels for c in convs.modules() if isinstance(c, nn.Conv2d)), default=0)
    if int8_convs_supported() and channels >= INT8_CONVS_MIN_CHANNELS:
        return Int8Convs(convs)
    if native_bf16_cpu():
        return Bf16Convs(convs)
    return convs


def int8_linears(module: ModuleT) -> ModuleT:
    """A copy of ``module`` whose matmuls run dynamically quantized to int8: every
    ``nn.Linear``, the pointwise convs of the conv modules (as Linears) and one fused q/k|v
    Linear per self-attention; the position projections (``linear_pos``, which only build a
    float table once) and the conv2d subsampling's convs stay float (its output Linear takes
    the conv features in their channels-last order, ``channels_last_features``)."""
    float_copy = copy.deepcopy(module)
    for child in float_copy.modules():
        if isinstance(child, Conv2dSubsampling):
            child.channels_last_features()
        if isinstance(child, ConvolutionModule):
            child.pointwise_conv1 = pointwise_as_linear(child.pointwise_conv1)
            child.pointwise_conv2 = pointwise_as_linear(child.pointwise_conv2)
        if isinstance(child, MultiHeadedAttention):
            child.qkv_projection = child.fused_qkv_linear()
    names = {
        name
        for name, child in float_copy.named_modules()
        if type(child) is nn.Linear and not name.endswith("linear_pos")
    }
    return quantize_linears(float_copy, names)
