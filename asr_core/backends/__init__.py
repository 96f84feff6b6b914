"""Backends that run the batched chunk step: the encoder forward plus the CTC head.

The engine talks to every backend through ``ChunkRunner``: B streams' chunk features and
gathered caches in, encoder output, CTC log-probs and the chunk's new caches out. The torch
backend lives here; others (ONNX Runtime, TensorRT) are imported lazily by ``make_runner`` so
that their packages stay optional.
"""

from __future__ import annotations

import copy
import functools
import itertools
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

import torch
from torch import nn

from asr_core.backends.traced import TorchStep, TracedSteps
from asr_core.model.attention import MultiHeadedAttention
from asr_core.model.convolution import ConvolutionModule, pointwise_as_linear
from asr_core.model.ctc import CTC
from asr_core.model.encoder import U2Encoder
from asr_core.model.loader import LoadedModel
from asr_core.model.subsampling import Conv2dSubsampling


class ChunkStep(NamedTuple):
    """Outputs of one batched chunk step (B streams, C new encoder frames)."""

    ys: torch.Tensor  # (B, C, D) encoder output
    log_probs: torch.Tensor  # (B, C, V) CTC log-softmax
    new_kv: torch.Tensor  # (L, B, H, C, 2*d_k) keys|values of the chunk's frames
    new_cnn: torch.Tensor  # (L, B, D, K-1)


class ChunkRunner(Protocol):
    """One batched chunk step; see ``U2Encoder.forward_chunk_batch`` for the argument shapes."""

    def step(
        self,
        xs: torch.Tensor,
        offsets: torch.Tensor,
        att_cache: torch.Tensor,
        cache_pos: torch.Tensor,
        cache_mask: torch.Tensor,
        cnn_cache: torch.Tensor,
    ) -> ChunkStep: ...


class TorchChunkRunner:
    """Eager PyTorch: the model's own ``forward_chunk_batch`` and CTC head.

    ``int8`` (backend ``torch-int8``, CPU): runs a copy of the encoder and CTC head whose matmuls
    are dynamically quantized (int8 weights, activations quantized per call; see
    ``_int8_linears``); the loaded float model (and its decoder, for rescoring) stays as it is.
    On CPUs with native bf16 (AVX512-BF16/AMX) the copy's conv2d subsampling, which int8 does
    not cover, runs in bfloat16 (``Bf16Convs``).

    The step is ``traced.TorchStep``: its conv caches hold the conv modules' GLU outputs, not
    WeNet's conv inputs, so a pool filled by this runner is not for another backend's runner.
    ``traced``: full chunks of the shapes declared with ``expect`` run as frozen TorchScript
    graphs on a CPU (``asr_core.backends.traced``).

    ``step_threads`` > 1 (traced graphs only): a batch of at least ``SPLIT_MIN_STREAMS`` streams
    per part is cut into that many parts along the batch, run at once in this thread and helper
    threads. A frozen graph runs without the GIL, so the parts use that many cores; with one
    intra-op thread per part this scales nearly linearly, where intra-op threads inside each
    small matmul do not (AISHELL-size, B=40 on 2 cores: 178 -> 94 ms; docs/BENCHMARKS.md).
    """

    def __init__(self, loaded: LoadedModel, int8: bool = False, traced: bool = False, step_threads: int = 1) -> None:
        if step_threads < 1:
            raise ValueError(f"step_threads must be at least 1, got {step_threads}")
        self.model = loaded.model
        self.encoder: U2Encoder = loaded.model.encoder
        self.ctc: CTC = loaded.model.ctc
        if int8:
            self.encoder = _int8_linears(self.encoder)
            self.ctc = _int8_linears(self.ctc)
            if native_bf16_cpu() and isinstance(self.encoder.embed, Conv2dSubsampling):
                self.encoder.embed.conv = Bf16Convs(self.encoder.embed.conv)  # type: ignore[assignment]
        self.eager = TorchStep(self.encoder, self.ctc).eval()
        self.traced: TracedSteps | None = None
        on_cpu = next(self.encoder.parameters()).device.type == "cpu"
        if traced and on_cpu:
            self.traced = TracedSteps(self.encoder, self.ctc)
        self.step_threads = step_threads if self.traced is not None else 1
        self._helpers: ThreadPoolExecutor | None = None

    def expect(self, input_frames: int, window: int) -> None:
        """Declare a chunk shape the caller will run often (the traced graphs are built for these)."""
        if self.traced is not None:
            self.traced.expect(input_frames, window)

    @torch.inference_mode()
    def step(
        self,
        xs: torch.Tensor,
        offsets: torch.Tensor,
        att_cache: torch.Tensor,
        cache_pos: torch.Tensor,
        cache_mask: torch.Tensor,
        cnn_cache: torch.Tensor,
    ) -> ChunkStep:
        out = None
        if self.traced is not None:
            inputs = (xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache)
            out = self._split_step(inputs) if self.step_threads > 1 else None
            if out is None:
                out = self.traced(*inputs)
        if out is None:
            out = self.eager(xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache)
        return ChunkStep(*out)

    def _split_step(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        """The traced step on parts of the batch at once; None where it does not apply (a batch
        too small to split, a shape without a graph yet, or a part the graphs decline)."""
        traced = self.traced
        assert traced is not None
        xs, _, att_cache = inputs[:3]
        batch = xs.size(0)
        parts = min(self.step_threads, batch // SPLIT_MIN_STREAMS)
        if parts < 2 or not traced.has_graph(xs.size(1), att_cache.size(3), xs.dtype):
            return None
        if self._helpers is None:
            self._helpers = ThreadPoolExecutor(self.step_threads - 1, thread_name_prefix="asr-step")
        bounds = [batch * i // parts for i in range(parts + 1)]
        pieces = [_batch_slice(inputs, start, end) for start, end in itertools.pairwise(bounds)]
        futures = [self._helpers.submit(_run_inference, traced, piece) for piece in pieces[1:]]
        outs = [traced(*pieces[0]), *(future.result() for future in futures)]
        if any(out is None for out in outs):
            return None
        ys, log_probs, new_kv, new_cnn = zip(*outs, strict=True)
        return torch.cat(ys), torch.cat(log_probs), torch.cat(new_kv, dim=1), torch.cat(new_cnn, dim=1)

    def close(self) -> None:
        """Stop the helper threads (a later split step starts them again)."""
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)
            self._helpers = None


SPLIT_MIN_STREAMS = 8
"""Fewest streams per part of a split step: smaller parts lose more in matmul efficiency than
a second core gains."""


def _batch_slice(inputs: tuple[torch.Tensor, ...], start: int, end: int) -> tuple[torch.Tensor, ...]:
    """Streams start..end of a step's inputs (the caches are batched along dim 1, the rest dim 0)."""
    xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache = inputs
    return (
        xs[start:end], offsets[start:end], att_cache[:, start:end], cache_pos[start:end], cache_mask[start:end],
        cnn_cache[:, start:end],
    )  # fmt: skip


def _run_inference(traced: TracedSteps, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
    with torch.inference_mode():  # per thread
        return traced(*inputs)


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def quantize_linears(module: ModuleT, which: Iterable[str] | Iterable[type[nn.Module]]) -> ModuleT:
    """``module`` (changed in place) with the chosen Linears dynamically quantized to int8.

    torch 2.13 still ships eager dynamic quantization but marks ``torch.ao.quantization``
    deprecated, and every call warns twice; those two warnings are silenced here so that each
    service start does not print them. (If a later torch removes the API, the bfloat16 dtype is
    the CPU fallback: about as fast on AVX512-BF16/AMX CPUs, see deploy/README.md.)
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message="torch.ao.quantization is deprecated")
        warnings.filterwarnings("ignore", category=UserWarning, message="torch.quantize_per_tensor")
        quantized: ModuleT = torch.ao.quantization.quantize_dynamic(module, which, dtype=torch.qint8)
    return quantized


def rescoring_decoder(backend: str, decoder: ModuleT) -> ModuleT:
    """The attention decoder the finals are rescored with: int8 Linears (a copy) with an
    int8 backend on the CPU, where rescoring is the other large cost besides the encoder."""
    if not backend.endswith("int8") or next(decoder.parameters()).device.type != "cpu":
        return decoder
    return quantize_linears(copy.deepcopy(decoder), {nn.Linear})


@functools.cache
def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX-BF16).

    oneDNN also runs bfloat16 on plain AVX512 (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``
    is true there), but by emulation, slower than float32: on an AVX512-VNNI Xeon without
    AVX512-BF16 the subsampling convs took 3.5x as long in bf16 as in float32 and a training step
    twice as long (docs/BENCHMARKS.md). Reads the flags of ``/proc/cpuinfo``; where that file is
    missing (not Linux) oneDNN's answer is taken."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


class Bf16Convs(nn.Module):
    """A float conv stack run in bfloat16: float in, float out.

    For the int8 backend's conv2d subsampling, about a fifth of its chunk step in float32
    (a 256->256 3x3 conv per encoder frame). oneDNN's bf16 convs run it ~2x faster
    (AISHELL-size, 20 streams' chunks: 20.4 -> 10.4 ms) at ~0.4 % relative error of the
    output, below the int8 Linears' own error that follows it.
    """

    def __init__(self, convs: nn.Module) -> None:
        super().__init__()
        self.convs = copy.deepcopy(convs).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.convs(x.to(torch.bfloat16))
        return out.float()


def _int8_linears(module: ModuleT) -> ModuleT:
    """A copy of ``module`` whose matmuls run dynamically quantized to int8: every
    ``nn.Linear``, the pointwise convs of the conv modules (as Linears) and one fused q/k|v
    Linear per self-attention; the position projections (``linear_pos``, which only build a
    float table once) and the conv2d subsampling stay float."""
    float_copy = copy.deepcopy(module)
    for child in float_copy.modules():
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


BACKENDS = (
    "torch",
    "torch-int8",
    "torch-cudagraph",
    "onnxruntime",
    "onnxruntime-int8",
    "tensorrt",
    "tensorrt-fp16",
    "tensorrt-int8",
)
"""Names ``make_runner`` accepts; ``tensorrt`` means ``tensorrt-fp16``."""

EXTRA_FOR_MODULE = {"onnx": "onnx", "onnxruntime": "onnx", "tensorrt": "gpu", "cuda": "gpu"}
"""Optional top-level package -> the hotline-asr extra that installs it."""


def make_runner(
    backend: str,
    loaded: LoadedModel,
    *,
    onnx_path: str | Path | None = None,
    cache_dir: Path | None = None,
    threads: int | None = None,
    calibration_dir: Path | None = None,
    traced: bool = False,
    step_threads: int = 1,
) -> ChunkRunner:
    """The chunk runner for ``backend`` (one of ``BACKENDS``) on the device ``loaded`` is on.

    ONNX and TensorRT backends run the graph at ``onnx_path``, or export ``loaded`` on first use
    into ``cache_dir`` (default ``$ASR_ONNX_CACHE`` or ``$XDG_CACHE_HOME/hotline-asr/onnx``).
    ``threads``: ONNX Runtime intra-op threads (default: torch's). ``calibration_dir``: WAVs
    for the TensorRT INT8 calibrator. ``traced``: the torch backends on a CPU run the shapes
    declared with ``expect`` as frozen TorchScript graphs (``asr_core.backends.traced``), with
    large batches split over ``step_threads`` threads (``TorchChunkRunner``).
    Optional packages are imported only here, when chosen.
    """
    if backend in ("torch", "torch-int8"):
        return TorchChunkRunner(loaded, int8=backend == "torch-int8", traced=traced, step_threads=step_threads)
    if backend not in BACKENDS:
        raise ValueError(f"engine backend {backend!r} is not available; choose one of: {', '.join(BACKENDS)}")
    try:
        if backend == "torch-cudagraph":
            from asr_core.backends.cudagraph import CudaGraphChunkRunner

            return CudaGraphChunkRunner(loaded)
        if backend.startswith("onnxruntime"):
            from asr_core.backends.onnxruntime import OrtChunkRunner

            return OrtChunkRunner.for_model(
                loaded, int8=backend.endswith("int8"), path=onnx_path, cache_dir=cache_dir, threads=threads
            )
        from asr_core.backends.tensorrt import TensorRTChunkRunner

        return TensorRTChunkRunner.for_model(
            loaded,
            int8=backend.endswith("int8"),
            onnx_path=onnx_path,
            cache_dir=cache_dir,
            calibration_dir=calibration_dir,
        )
    except ModuleNotFoundError as exc:
        package = (exc.name or "").split(".")[0]
        if package not in EXTRA_FOR_MODULE:
            raise
        raise RuntimeError(
            f"engine backend {backend!r} needs the Python package {package!r}, which is not installed; "
            f"install the extra: pip install 'hotline-asr[{EXTRA_FOR_MODULE[package]}]'"
        ) from exc
