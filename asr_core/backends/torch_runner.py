"""``backend: torch`` and ``torch-int8``: the model's own PyTorch code as the chunk runner,
optionally as frozen TorchScript graphs (``traced``) split over several threads."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from asr_core.backends.quantize import int8_linears, subsampling_convs
from asr_core.backends.runner import ChunkStep, ChunkStepInputs
from asr_core.backends.traced import TorchStep, TracedSteps
from asr_core.model.ctc import CTC
from asr_core.model.encoder import U2Encoder
from asr_core.model.loader import LoadedModel
from asr_core.model.subsampling import Conv2dSubsampling


class TorchChunkRunner:
    """Eager PyTorch: the model's own ``forward_chunk_batch`` and CTC head.

    ``int8`` (backend ``torch-int8``, CPU): runs a copy of the encoder and CTC head whose matmuls
    are dynamically quantized (int8 weights, activations quantized per call; see
    ``quantize.int8_linears``), packed for oneDNN on AMX CPUs and for fbgemm elsewhere
    (``quantize.int8_engine``); the loaded float model (and its decoder, for rescoring) stays as it is.
    The copy's conv2d subsampling, which the int8 Linears do not cover, runs its later convs in
    int8 on CPUs with VNNI or AMX (``Int8Convs``), else in bfloat16 on CPUs with native bf16
    (``Bf16Convs``), else in float32 (``quantize.subsampling_convs``).

    The step is ``traced.TorchStep``: its conv caches hold the conv modules' GLU outputs, not
    WeNet's conv inputs, so a pool filled by this runner is not for another backend's runner.
    ``traced``: full chunks of the shapes declared with ``expect`` run as frozen TorchScript
    graphs on a CPU (``asr_core.backends.traced``).

    It reads the pool where it lies (``reads_pool``): ``step`` takes the whole pool's caches and
    the batch's ``rows`` of them, and each layer copies its rows just before it runs.

    With traced graphs it takes short last chunks padded to their full chunk's shape
    (``pads_short_chunks``), so that they run in that shape's graph rather than eagerly; without
    them a short chunk runs eagerly at its own, smaller shape. ``eager_steps`` counts the steps
    that ran eagerly (all of them without graphs; with graphs, those no graph took).

    ``step_threads`` > 1 (traced graphs only): a batch of at least ``SPLIT_MIN_STREAMS`` streams
    per part is cut into that many parts along the batch, run at once in this thread and helper
    threads. A frozen graph runs without the GIL, so the parts use that many cores; with one
    intra-op thread per part this scales nearly linearly, where intra-op threads inside each
    small matmul do not (AISHELL-size, B=40 on 2 cores: 178 -> 94 ms; docs/BENCHMARKS.md).
    """

    reads_pool = True  # reads each layer's rows of the pool where they lie

    def __init__(self, loaded: LoadedModel, int8: bool = False, traced: bool = False, step_threads: int = 1) -> None:
        if step_threads < 1:
            raise ValueError(f"step_threads must be at least 1, got {step_threads}")
        self.model = loaded.model
        self.encoder: U2Encoder = loaded.model.encoder
        self.ctc: CTC = loaded.model.ctc
        if int8:
            self.encoder = int8_linears(self.encoder)
            self.ctc = int8_linears(self.ctc)
            if isinstance(self.encoder.embed, Conv2dSubsampling):
                self.encoder.embed.conv = subsampling_convs(self.encoder.embed.conv)  # type: ignore[assignment]
        self.eager = TorchStep(self.encoder, self.ctc).eval()
        self.traced: TracedSteps | None = None
        on_cpu = next(self.encoder.parameters()).device.type == "cpu"
        if traced and on_cpu:
            self.traced = TracedSteps(self.encoder, self.ctc)
        self.step_threads = step_threads if self.traced is not None else 1
        self.pads_short_chunks = self.traced is not None
        self.eager_steps = 0
        self._count_lock = threading.Lock()  # several engine threads may share the runner
        self._helpers: ThreadPoolExecutor | None = None

    def expect(self, input_frames: int, window: int) -> None:
        """Declare a chunk shape the caller will run often (the traced graphs are built for these)."""
        if self.traced is not None:
            self.traced.expect(input_frames, window)

    @torch.inference_mode()
    def step(self, inputs: ChunkStepInputs) -> ChunkStep:
        xs = inputs.xs
        if inputs.rows is None:
            inputs = inputs._replace(rows=torch.arange(xs.size(0), device=xs.device))
        if inputs.valid_frames is None:
            chunk = self.encoder.embed.output_length(xs.size(1))
            inputs = inputs._replace(valid_frames=torch.full((xs.size(0),), chunk, dtype=torch.int64, device=xs.device))
        out = None
        if self.traced is not None:
            out = self._split_step(inputs) if self.step_threads > 1 else None
            if out is None:
                out = self.traced(inputs)
        if out is None:
            with self._count_lock:
                self.eager_steps += 1
            out = self.eager(*inputs)
        return ChunkStep(*out)

    def _split_step(self, inputs: ChunkStepInputs) -> tuple[torch.Tensor, ...] | None:
        """The traced step on parts of the batch at once; None where it does not apply (a batch
        too small to split, a shape without a graph yet, or a part the graphs decline)."""
        traced = self.traced
        assert traced is not None
        batch = inputs.xs.size(0)
        parts = min(self.step_threads, batch // SPLIT_MIN_STREAMS)
        if parts < 2 or not traced.has_graph(inputs.xs.size(1), inputs.att_cache.size(3), inputs.xs.dtype):
            return None
        if self._helpers is None:
            self._helpers = ThreadPoolExecutor(self.step_threads - 1, thread_name_prefix="asr-step")
        bounds = [batch * i // parts for i in range(parts + 1)]
        pieces = [_batch_slice(inputs, start, end) for start, end in itertools.pairwise(bounds)]
        futures = [self._helpers.submit(_run_inference, traced, piece) for piece in pieces[1:]]
        outs = [traced(pieces[0]), *(future.result() for future in futures)]
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


def _batch_slice(inputs: ChunkStepInputs, start: int, end: int) -> ChunkStepInputs:
    """Streams start..end of a step's inputs (the pool's caches whole, their rows sliced)."""
    assert inputs.rows is not None and inputs.valid_frames is not None  # set by TorchChunkRunner.step
    return inputs._replace(
        xs=inputs.xs[start:end],
        offsets=inputs.offsets[start:end],
        cache_pos=inputs.cache_pos[start:end],
        cache_mask=inputs.cache_mask[start:end],
        rows=inputs.rows[start:end],
        valid_frames=inputs.valid_frames[start:end],
    )


def _run_inference(traced: TracedSteps, inputs: ChunkStepInputs) -> tuple[torch.Tensor, ...] | None:
    with torch.inference_mode():  # per thread
        return traced(inputs)
