"""ONNX Runtime runners for the exported graphs, independent of `asr_core`.

`OrtChunkRunner` is a drop-in for `encoder.forward_chunk_batch` (same arguments, torch
tensors out), so the engine can select `backend: onnxruntime`; `step` also returns the CTC
log-probs the graph computes. The geometry a `KvPool` needs (blocks, heads, d_k, ...) is
read from the model's metadata, written by `deploy.export.onnx_export`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnxruntime as ort
import torch

CHUNK_INPUTS = ("xs", "offsets", "att_cache", "cache_pos", "cache_mask", "cnn_cache")
CHUNK_OUTPUTS = ("ys", "log_probs", "new_kv", "new_cnn")
DECODER_INPUTS = ("memory", "memory_mask", "ys_in_pad", "ys_in_lens", "r_ys_in_pad")


class ChunkStep(NamedTuple):
    """Outputs of one batched chunk step (B streams, C new encoder frames)."""

    ys: torch.Tensor  # (B, C, D)
    log_probs: torch.Tensor  # (B, C, V) CTC log-softmax
    new_kv: torch.Tensor  # (L, B, H, C, 2*d_k)
    new_cnn: torch.Tensor  # (L, B, D, K-1)


def _session(path: str | Path, threads: int, providers: list[str] | None) -> ort.InferenceSession:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such ONNX model; create it with `python -m deploy.export.onnx_export`")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu").contiguous().numpy()


class OrtChunkRunner:
    """The exported batched chunk step (`encoder_chunk.onnx` or its INT8 version).

    Inputs and outputs are torch tensors; outputs come back on the device of `xs`.
    Tensors travel through host memory (numpy), so this suits the CPU provider.
    """

    def __init__(self, path: str | Path, threads: int = 1, providers: list[str] | None = None) -> None:
        self.path = Path(path)
        self.session = _session(path, threads, providers)
        names = [i.name for i in self.session.get_inputs()]
        if tuple(names) != CHUNK_INPUTS:
            raise ValueError(f"{path}: not a chunk-step graph (inputs {names}, expected {list(CHUNK_INPUTS)})")
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.meta = {key: int(value) for key, value in metadata.items() if value.lstrip("-").isdigit()}

    def step(
        self,
        xs: torch.Tensor,
        offsets: torch.Tensor,
        att_cache: torch.Tensor,
        cache_pos: torch.Tensor,
        cache_mask: torch.Tensor,
        cnn_cache: torch.Tensor,
    ) -> ChunkStep:
        """Shapes as `forward_chunk_batch`: xs (B, T_in, n_mels) raw fbank, offsets (B,) int64,
        att_cache (L, B, H, W, 2*d_k), cache_pos (B, W) int64, cache_mask (B, W) bool,
        cnn_cache (L, B, D, K-1)."""
        feeds = {
            "xs": _numpy(xs.float()),
            "offsets": _numpy(offsets.long()),
            "att_cache": _numpy(att_cache.float()),
            "cache_pos": _numpy(cache_pos.long()),
            "cache_mask": _numpy(cache_mask.bool()),
            "cnn_cache": _numpy(cnn_cache.float()),
        }
        outputs = self.session.run(list(CHUNK_OUTPUTS), feeds)
        ys, log_probs, new_kv, new_cnn = (torch.from_numpy(o).to(xs.device) for o in outputs)
        return ChunkStep(ys, log_probs, new_kv, new_cnn)

    def __call__(
        self,
        xs: torch.Tensor,
        offsets: torch.Tensor,
        att_cache: torch.Tensor,
        cache_pos: torch.Tensor,
        cache_mask: torch.Tensor,
        cnn_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ys (B, C, D), new_kv (L, B, H, C, 2*d_k), new_cnn (L, B, D, K-1)), as forward_chunk_batch."""
        step = self.step(xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache)
        return step.ys, step.new_kv, step.new_cnn


class OrtDecoderRunner:
    """The exported attention decoder (`decoder.onnx`) for rescoring n-best lists."""

    def __init__(self, path: str | Path, threads: int = 1, providers: list[str] | None = None) -> None:
        self.path = Path(path)
        self.session = _session(path, threads, providers)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        ys_in_pad: torch.Tensor,
        ys_in_lens: torch.Tensor,
        r_ys_in_pad: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """memory (N, T', D), memory_mask (N, 1, T') bool, ys_in_pad / r_ys_in_pad (N, L) int64
        (sos first, eos padding), ys_in_lens (N,) -> (l2r (N, L, V), r2l (N, L, V) log-probs;
        r2l is empty for a left-to-right-only decoder)."""
        feeds = {
            "memory": _numpy(memory.float()),
            "memory_mask": _numpy(memory_mask.bool()),
            "ys_in_pad": _numpy(ys_in_pad.long()),
            "ys_in_lens": _numpy(ys_in_lens.long()),
            "r_ys_in_pad": _numpy(r_ys_in_pad.long()),
        }
        feeds = {name: value for name, value in feeds.items() if name in self._input_names}
        outputs = [torch.from_numpy(o).to(memory.device) for o in self.session.run(self.output_names, feeds)]
        l2r = outputs[0]
        r2l = outputs[1] if len(outputs) > 1 else l2r.new_zeros(0)
        return l2r, r2l

    @property
    def _input_names(self) -> set[str]:
        return {i.name for i in self.session.get_inputs()}
