"""``backend: torch-cudagraph``: the eager chunk step on CUDA, replayed from captured CUDA graphs.

At 1000+ streams per GPU one chunk step launches hundreds of small kernels; replaying a
captured graph removes the per-kernel launch overhead. A graph has fixed shapes, so one is
captured per (batch bucket, input frames, cache window): a batch of B streams runs in the
smallest bucket >= B with the extra rows left over from earlier steps (rows are independent
and their outputs are dropped). Batches above the largest bucket run eagerly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from asr_core.backends.runner import ChunkStep, ChunkStepInputs
from asr_core.model.encoder import U2Encoder
from asr_core.model.loader import LoadedModel

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
WARMUP_STEPS = 3


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache
    outputs: tuple[torch.Tensor, ...]  # ys, log_probs, new_kv, new_cnn


class CudaGraphChunkRunner:
    """ChunkRunner for a model already on a CUDA device (the engine moves it there, fp16)."""

    reads_pool = False  # takes the batch's caches gathered (``ChunkRunner.reads_pool``)
    pads_short_chunks = False  # its graphs take no padding mask: a short chunk runs at its own shape

    def __init__(self, loaded: LoadedModel, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        parameter = next(loaded.model.parameters())
        if parameter.device.type != "cuda":
            raise ValueError("backend torch-cudagraph needs a CUDA device: set engine device to 'cuda'")
        self.model = loaded.model
        self.device = parameter.device
        self.buckets = tuple(sorted(buckets))
        self.encoder = self._capturable_encoder(loaded.model.encoder)
        self.memory_pool = torch.cuda.graph_pool_handle()
        self.captured: dict[tuple[int, int, int], _Captured] = {}

    @staticmethod
    def _capturable_encoder(encoder: U2Encoder) -> U2Encoder:
        """A view of ``encoder`` (same weights) that projects positions on the fly.

        The cached position tables are sized from ``offsets.max()`` on the host, a device sync
        that graph capture forbids; the on-the-fly projection is shape-static.
        """
        view = copy.copy(encoder)
        view._uses_position_table = lambda: False  # type: ignore[method-assign]
        return view

    def _eager(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ys, new_kv, new_cnn = self.encoder.forward_chunk_batch(*inputs)
        return ys, self.model.ctc_log_probs(ys).float(), new_kv, new_cnn

    def _capture(self, bucket: int, like: tuple[torch.Tensor, ...]) -> _Captured:
        """Static input buffers of batch ``bucket`` shaped like ``like``; warm up, then capture."""
        inputs = []
        for index, tensor in enumerate(like):
            batch_dim = 1 if index in (2, 5) else 0  # att_cache and cnn_cache are layer-major
            shape = list(tensor.shape)
            shape[batch_dim] = bucket
            inputs.append(torch.zeros(shape, dtype=tensor.dtype, device=self.device))
        static = tuple(inputs)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(WARMUP_STEPS):
                self._eager(*static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self.memory_pool):
            outputs = self._eager(*static)
        return _Captured(graph, static, outputs)

    @torch.inference_mode()
    def expect(self, input_frames: int, window: int) -> None:
        """Nothing to prepare: graphs are captured for each shape on its first step."""

    def close(self) -> None:
        """Nothing to release: the captured graphs live as long as the runner."""

    def step(self, inputs: ChunkStepInputs) -> ChunkStep:
        """Shapes in ``ChunkStepInputs``. The outputs are views of the graph's static buffers:
        valid until the next ``step`` (the engine consumes them before that)."""
        xs = inputs.xs
        graph_inputs = inputs.graph_inputs()
        batch = xs.size(0)
        bucket = next((b for b in self.buckets if b >= batch), 0)
        if not bucket:
            return ChunkStep(*self._eager(*graph_inputs))
        key = (bucket, xs.size(1), inputs.att_cache.size(3))
        captured = self.captured.get(key)
        if captured is None:
            captured = self.captured[key] = self._capture(bucket, graph_inputs)
        for index, (static, value) in enumerate(zip(captured.inputs, graph_inputs, strict=True)):
            if index in (2, 5):
                static[:, :batch].copy_(value)
            else:
                static[:batch].copy_(value)
        captured.graph.replay()
        ys, log_probs, new_kv, new_cnn = captured.outputs
        return ChunkStep(ys[:batch], log_probs[:batch], new_kv[:, :batch], new_cnn[:, :batch])
