"""The batched chunk step as an ONNX graph: export, INT8 quantization, and an on-disk cache.

`export_chunk_step` writes ``forward_chunk_batch`` plus the CTC head with dynamic batch B,
cache length W and input length T_in (so any chunk size):

    inputs   xs (B, T_in, n_mels) float32 raw fbank, offsets (B,) int64,
             att_cache (L, B, H, W, 2*d_k) float32, cache_pos (B, W) int64,
             cache_mask (B, W) bool, cnn_cache (L, B, D, K-1) float32
    outputs  ys (B, C, D), log_probs (B, C, V), new_kv (L, B, H, C, 2*d_k), new_cnn (L, B, D, K-1)

`cached_chunk_graph` exports a loaded model once into ``<cache>/<fingerprint>/`` so that the
``onnxruntime`` and ``tensorrt`` backends can start from a model directory alone, offline. The
fingerprint hashes the weights the graph contains (not the files), so an in-memory change
(e.g. a benchmark's calibrated blank bias) gets its own graph.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from asr_core import cpu_isa
from asr_core.cpu_isa import CpuIsa
from asr_core.model.loader import LoadedModel
from asr_core.stream import chunk_input_frames

CHUNK_INPUTS = ("xs", "offsets", "att_cache", "cache_pos", "cache_mask", "cnn_cache")
CHUNK_OUTPUTS = ("ys", "log_probs", "new_kv", "new_cnn")
ENCODER_FILE = "encoder_chunk.onnx"
ENCODER_INT8_FILE = "encoder_chunk.int8.onnx"
DEFAULT_OPSET = 17
GRAPH_VERSION = 1
"""Bump when the exported graph changes, so cached graphs are rebuilt."""
CACHE_ENV = "ASR_ONNX_CACHE"
# The TorchScript exporter needs no extra package (the torch.export one needs onnxscript) and
# traces forward_chunk_batch as written; tests verify every exported graph numerically.
LEGACY_EXPORTER_WARNINGS = "You are using the legacy TorchScript-based ONNX export|The feature will be removed"


class ChunkStepGraph(nn.Module):
    """`forward_chunk_batch` followed by the CTC head: what one engine step runs."""

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__()
        self.model = loaded.model

    def forward(
        self,
        xs: Tensor,
        offsets: Tensor,
        att_cache: Tensor,
        cache_pos: Tensor,
        cache_mask: Tensor,
        cnn_cache: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        ys, new_kv, new_cnn = self.model.encoder.forward_chunk_batch(
            xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache
        )
        return ys, self.model.ctc_log_probs(ys), new_kv, new_cnn


def model_metadata(loaded: LoadedModel) -> dict[str, int]:
    """What a runner needs without asr_core: cache geometry and special token ids."""
    return {
        "num_blocks": loaded.num_blocks,
        "heads": loaded.heads,
        "d_k": loaded.d_k,
        "d_model": loaded.d_model,
        "cnn_cache_frames": loaded.cnn_cache_frames,
        "subsampling": loaded.subsampling,
        "right_context": loaded.right_context,
        "vocab_size": loaded.vocab_size,
        "blank_id": loaded.blank_id,
        "sos_id": loaded.sos_id,
        "eos_id": loaded.eos_id,
        "n_mels": loaded.config.input_dim,
    }


def chunk_example(loaded: LoadedModel, batch: int, chunk: int, window: int, seed: int) -> tuple[Tensor, ...]:
    """Random chunk-step inputs: streams at different offsets, caches shuffled and partly invalid."""
    generator = torch.Generator().manual_seed(seed)
    t_in = chunk_input_frames(chunk, loaded.subsampling, loaded.right_context)
    xs = torch.randn(batch, t_in, loaded.config.input_dim, generator=generator) * 3 + 8  # (B, T_in, n_mels)
    offsets = torch.randint(0, 400, (batch,), generator=generator) + window  # (B,)
    order = torch.stack([torch.randperm(window, generator=generator) for _ in range(batch)])  # (B, W)
    cache_pos = offsets.unsqueeze(1) - window + order  # (B, W)
    cache_mask = torch.rand(batch, window, generator=generator) > 0.3  # (B, W)
    cache_mask[0] = False  # a brand-new stream
    att_cache = torch.randn(loaded.num_blocks, batch, loaded.heads, window, 2 * loaded.d_k, generator=generator)
    cnn_cache = torch.randn(loaded.num_blocks, batch, loaded.d_model, loaded.cnn_cache_frames, generator=generator)
    return xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache


def add_metadata(path: Path, metadata: dict[str, int | str]) -> None:
    """Store ``metadata`` as the ONNX file's custom metadata (string key -> string value)."""
    import onnx

    graph = onnx.load(str(path))
    for key, value in metadata.items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.checker.check_model(graph)
    onnx.save(graph, str(path))


def cpu_float_copy(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` itself when its model is fp32 on the CPU, else a CPU fp32 copy (export traces on CPU)."""
    parameter = next(loaded.model.parameters())
    if parameter.device.type == "cpu" and parameter.dtype == torch.float32:
        return loaded
    model = copy.deepcopy(loaded.model).to(device="cpu", dtype=torch.float32).eval()
    return dataclasses.replace(loaded, model=model)


def export_chunk_step(loaded: LoadedModel, path: Path, opset: int = DEFAULT_OPSET) -> None:
    """Write the batched chunk step (encoder + CTC head) with dynamic B, W and T_in."""
    loaded = cpu_float_copy(loaded)
    example = chunk_example(loaded, batch=3, chunk=5, window=7, seed=0)
    axes = {
        "xs": {0: "B", 1: "T_in"},
        "offsets": {0: "B"},
        "att_cache": {1: "B", 3: "W"},
        "cache_pos": {0: "B", 1: "W"},
        "cache_mask": {0: "B", 1: "W"},
        "cnn_cache": {1: "B"},
        "ys": {0: "B", 1: "C"},
        "log_probs": {0: "B", 1: "C"},
        "new_kv": {1: "B", 3: "C"},
        "new_cnn": {1: "B"},
    }
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", LEGACY_EXPORTER_WARNINGS, DeprecationWarning)
        torch.onnx.export(
            ChunkStepGraph(loaded).eval(),
            example,
            str(path),
            input_names=list(CHUNK_INPUTS),
            output_names=list(CHUNK_OUTPUTS),
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )
    add_metadata(path, dict(model_metadata(loaded)))


# INT8 modes (uint8 activations, quantized per call, x weights):
# - "u8s8": int8 weights over their full range; exact accumulation where the CPU has VNNI
#   or AMX, the fast path there;
# - "u8s8-reduce-range": int8 weights in 7 bits (-64..63), so that AVX2's and plain AVX-512's
#   u8 x s8 kernels, which add product pairs in saturating int16, cannot clip
#   (255 * 64 * 2 < 32767); ONNX Runtime's advice for CPUs without VNNI;
# - "u8u8": uint8 weights, which ONNX Runtime multiplies without the int16 pair sums.
INT8_MODES = ("u8s8", "u8s8-reduce-range", "u8u8")
INT8_MODE_KEY = "int8_mode"
"""Metadata key of an INT8 graph that names its mode (absent in graphs from before modes)."""


def int8_mode_for(isa: CpuIsa) -> str:
    """The INT8 mode that is accurate on ``isa``: full-range weights only where VNNI/AMX exist."""
    return "u8s8" if isa.vnni or isa.amx else "u8s8-reduce-range"


def int8_file(mode: str) -> str:
    """The cached INT8 graph's file name for ``mode`` (the default mode keeps the plain name)."""
    return ENCODER_INT8_FILE if mode == "u8s8" else ENCODER_INT8_FILE.replace(".int8.", f".int8-{mode}.")


def quantize_int8(source: Path, target: Path, mode: str = "u8s8") -> None:
    """Dynamic INT8 quantization of the MatMuls with constant weights (the linear layers) in
    ``mode`` (one of `INT8_MODES`), recorded in the graph's metadata under `INT8_MODE_KEY`."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if mode not in INT8_MODES:
        raise ValueError(f"unknown INT8 mode {mode!r}; choose one of: {', '.join(INT8_MODES)}")
    root = logging.getLogger()
    advice = _DropMessage("Please consider to run pre-processing before quantization")
    root.addFilter(advice)
    try:
        quantize_dynamic(
            source,
            target,
            op_types_to_quantize=["MatMul"],
            weight_type=QuantType.QUInt8 if mode == "u8u8" else QuantType.QInt8,
            reduce_range=mode == "u8s8-reduce-range",
            extra_options={"MatMulConstBOnly": True},
        )
    finally:
        root.removeFilter(advice)
    graph = onnx.load(str(target))
    onnx.helper.set_model_props(graph, {**{p.key: p.value for p in graph.metadata_props}, INT8_MODE_KEY: mode})
    onnx.save(graph, str(target))


class _DropMessage(logging.Filter):
    """Drops onnxruntime's generic pre-processing advice (shape inference gains nothing here)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def model_fingerprint(loaded: LoadedModel, opset: int = DEFAULT_OPSET) -> str:
    """sha256 over the encoder and CTC weights, the model config and the graph version."""
    digest = hashlib.sha256()
    header = {"graph_version": GRAPH_VERSION, "opset": opset, "config": repr(loaded.config)}
    digest.update(json.dumps(header, sort_keys=True).encode())
    for name, tensor in sorted(loaded.model.state_dict().items()):
        if name.startswith(("encoder.", "ctc.")):
            digest.update(name.encode())
            digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def default_cache_dir() -> Path:
    """``$ASR_ONNX_CACHE``, else ``$XDG_CACHE_HOME/hotline-asr/onnx`` (``~/.cache`` by default)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hotline-asr" / "onnx"


def cached_chunk_graph(
    loaded: LoadedModel, int8: bool = False, cache_dir: Path | None = None, int8_mode: str | None = None
) -> Path:
    """The chunk-step ONNX file (INT8 if asked) for ``loaded``, exported on first use. The
    INT8 mode defaults to the one accurate on this CPU (`int8_mode_for`).

    Files are written under a temporary name and renamed, so concurrent processes never read a
    half-written graph.
    """
    folder = (cache_dir or default_cache_dir()) / model_fingerprint(loaded)
    fp32 = folder / ENCODER_FILE
    mode = int8_mode or int8_mode_for(cpu_isa.detect())
    target = folder / (int8_file(mode) if int8 else ENCODER_FILE)
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    if not fp32.is_file():
        _write_atomically(fp32, lambda tmp: export_chunk_step(loaded, tmp))
    if int8:
        _write_atomically(target, lambda tmp: quantize_int8(fp32, tmp, mode))
    return target


def _write_atomically(target: Path, write: Callable[[Path], None]) -> None:
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=target.stem, suffix=".onnx.tmp")
    os.close(handle)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
