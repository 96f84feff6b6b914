"""ONNX Runtime runners for the exported graphs (``backend: onnxruntime`` / ``onnxruntime-int8``).

`OrtChunkRunner` implements ``ChunkRunner`` (and is a drop-in for ``forward_chunk_batch`` via
``__call__``). The geometry a ``KvPool`` needs (blocks, heads, d_k, ...) is read from the
graph's metadata, written by ``asr_core.backends.onnx_graph``. This module imports
``onnxruntime``; ``make_runner`` imports it only when an ONNX backend is chosen.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from asr_core import cpu_isa
from asr_core.backends.onnx_graph import CHUNK_INPUTS, CHUNK_OUTPUTS, INT8_MODE_KEY, cached_chunk_graph, int8_mode_for
from asr_core.backends.runner import ChunkStep, ChunkStepInputs
from asr_core.model.loader import LoadedModel

DECODER_INPUTS = ("memory", "memory_mask", "ys_in_pad", "ys_in_lens", "r_ys_in_pad")

log = logging.getLogger(__name__)


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


def providers_for(device: str | torch.device) -> list[str]:
    """CUDA execution provider first on a CUDA device when this onnxruntime build has it."""
    if torch.device(device).type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OrtChunkRunner:
    """The exported batched chunk step (`encoder_chunk.onnx` or its INT8 version).

    Inputs and outputs are torch tensors; outputs come back on the device and in the dtype of
    `xs`. Tensors travel through host memory (numpy), so this suits the CPU provider best.
    """

    reads_pool = False  # takes the batch's caches gathered (``ChunkRunner.reads_pool``)
    pads_short_chunks = False  # its graphs take no padding mask: a short chunk runs at its own shape

    def __init__(self, path: str | Path, threads: int = 1, providers: list[str] | None = None) -> None:
        self.path = Path(path)
        self.session = _session(path, threads, providers)
        names = [i.name for i in self.session.get_inputs()]
        if tuple(names) != CHUNK_INPUTS:
            raise ValueError(f"{path}: not a chunk-step graph (inputs {names}, expected {list(CHUNK_INPUTS)})")
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.meta = {key: int(value) for key, value in metadata.items() if value.lstrip("-").isdigit()}
        self.int8_mode: str | None = metadata.get(INT8_MODE_KEY)
        """The graph's INT8 mode (`onnx_graph.INT8_MODES`); None for fp32 graphs and older exports."""
        isa = cpu_isa.detect()
        if self.int8_mode == "u8s8" and int8_mode_for(isa) != "u8s8":
            log.warning(
                "%s: full-range INT8 weights (u8s8) on a CPU without VNNI (%s): its int8 kernels can "
                "saturate and lose accuracy; re-export with `asr-export onnx --int8-mode %s`",
                path,
                isa.level,
                int8_mode_for(isa),
            )

    @classmethod
    def for_model(
        cls,
        loaded: LoadedModel,
        int8: bool = False,
        path: str | Path | None = None,
        cache_dir: Path | None = None,
        threads: int | None = None,
    ) -> OrtChunkRunner:
        """A runner for ``loaded``: the graph at ``path``, else the cached export (made on first use).

        ``threads`` defaults to torch's intra-op thread count, so both backends get the same cores.
        """
        graph = Path(path) if path is not None else cached_chunk_graph(loaded, int8, cache_dir)
        device = next(loaded.model.parameters()).device
        runner = cls(graph, threads or torch.get_num_threads(), providers_for(device))
        if runner.meta.get("num_blocks") != loaded.num_blocks or runner.meta.get("d_model") != loaded.d_model:
            raise ValueError(
                f"{graph}: exported from another model (num_blocks {runner.meta.get('num_blocks')}, "
                f"d_model {runner.meta.get('d_model')}; the loaded model has {loaded.num_blocks}, {loaded.d_model})"
            )
        return runner

    def expect(self, input_frames: int, window: int) -> None:
        """Nothing to prepare: the graph takes any chunk shape."""

    def close(self) -> None:
        """Nothing to release: the session lives as long as the runner."""

    def step(self, inputs: ChunkStepInputs) -> ChunkStep:
        """Shapes in ``ChunkStepInputs``; the graph takes the batch's caches gathered."""
        return self._run(*inputs.graph_inputs())

    def _run(
        self,
        xs: torch.Tensor,
        offsets: torch.Tensor,
        att_cache: torch.Tensor,
        cache_pos: torch.Tensor,
        cache_mask: torch.Tensor,
        cnn_cache: torch.Tensor,
    ) -> ChunkStep:
        feeds = {
            "xs": _numpy(xs.float()),
            "offsets": _numpy(offsets.long()),
            "att_cache": _numpy(att_cache.float()),
            "cache_pos": _numpy(cache_pos.long()),
            "cache_mask": _numpy(cache_mask.bool()),
            "cnn_cache": _numpy(cnn_cache.float()),
        }
        outputs = self.session.run(list(CHUNK_OUTPUTS), feeds)
        ys, new_kv, new_cnn = (torch.from_numpy(outputs[i]).to(xs.device, xs.dtype) for i in (0, 2, 3))
        log_probs = torch.from_numpy(outputs[1]).to(xs.device)
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
        step = self._run(xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache)
        return step.ys, step.new_kv, step.new_cnn


class OrtDecoderRunner:
    """The exported attention decoder (`decoder.onnx`) for rescoring n-best lists."""

    def __init__(self, path: str | Path, threads: int = 1, providers: list[str] | None = None) -> None:
        self.path = Path(path)
        self.session = _session(path, threads, providers)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.input_names = {i.name for i in self.session.get_inputs()}

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
        feeds = {name: value for name, value in feeds.items() if name in self.input_names}
        outputs = [torch.from_numpy(o).to(memory.device) for o in self.session.run(self.output_names, feeds)]
        l2r = outputs[0]
        r2l = outputs[1] if len(outputs) > 1 else l2r.new_zeros(0)
        return l2r, r2l
