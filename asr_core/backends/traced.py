"""The torch backends' chunk step as frozen TorchScript graphs, one per input shape.

Why: in eager mode each of the step's ~500 torch operations returns to Python, and so has
to take the GIL back before the next one can start. Any other Python thread of the process
that is busy at that moment (the gateway's RTP and SIP loops, the event publisher, a bench's
feeder) holds it for up to the interpreter's switch interval, and the step waits that long,
again and again. Measured (AISHELL size, torch-int8, 14 streams, 1 thread): 64-76 ms alone,
168-208 ms beside a thread that runs Python half of the time; the traced graph runs all its
operations without the GIL, in 51-75 ms either way, with bitwise the same outputs
(docs/BENCHMARKS.md). Freezing folds the weight-derived tensors (the projected position
tables, prepacked int8 weights) into the graph.

A graph is traced from the eager step on the first batch of its shape (input frames T_in,
cache window W and dtype; the batch size stays free) and only for the shapes the owner
declared (``expect``: the engine's full chunks), because tracing takes a second or more and
rare shapes are not worth a stall. A call's short last chunk, once such a rare shape and the
service's most common eager step (one per ended call), runs in its full chunk's graph with its
fbank padded and the padded frames masked out (``ChunkStepInputs.valid_frames``, the engine's
scheduler). Positions are looked up in
a table of ``position_limit`` rows frozen into the graph; a batch with a later position (an
utterance longer than the limit) runs eagerly.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from asr_core.backends.runner import ChunkStepInputs
from asr_core.model.ctc import CTC
from asr_core.model.encoder import U2Encoder
from asr_core.model.inference import serving_trace

log = logging.getLogger(__name__)

POSITION_LIMIT = 1024
"""Encoder frames from an utterance's start the traced graphs cover: 41 s at 4x subsampling
(the engine ends utterances after 20 s by default); later chunks run eagerly."""

ShapeKey = tuple[int, int, torch.dtype]


class TorchStep(nn.Module):
    """The torch backends' chunk step (encoder chunk forward + CTC head) as one module with
    tensor inputs and outputs: run eagerly, or traced with ``position_rows`` fixed.

    The conv caches are in the GLU layout (``forward_chunk_batch(glu_cache=True)``) and the
    attention cache is a zero-initialised pool of model outputs (``cache_is_finite``). The caches
    are the whole pool's and ``rows`` (B,) the batch's rows of them (``cache_rows``);
    ``valid_frames`` (B,) each row's real output frames (all C but for a padded short last chunk),
    an input of every graph, so that one graph per full shape serves both."""

    def __init__(self, encoder: U2Encoder, ctc: CTC, position_rows: int | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.ctc = ctc
        self.position_rows = position_rows

    def forward(
        self,
        xs: Tensor,
        offsets: Tensor,
        att_cache: Tensor,
        cache_pos: Tensor,
        cache_mask: Tensor,
        cnn_cache: Tensor,
        rows: Tensor,
        valid_frames: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        ys, new_kv, new_cnn = self.encoder.forward_chunk_batch(
            xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache,
            cache_is_finite=True, position_rows=self.position_rows, glu_cache=True, cache_rows=rows,
            valid_frames=valid_frames,
        )  # fmt: skip
        return ys, self.ctc.log_softmax(ys).float(), new_kv, new_cnn


class TracedSteps:
    """Frozen traced graphs of ``encoder`` + ``ctc``'s chunk step, built on first use of a
    declared shape; ``__call__`` returns None where the caller must run the eager step."""

    def __init__(self, encoder: U2Encoder, ctc: CTC, position_limit: int = POSITION_LIMIT) -> None:
        self.module = TorchStep(encoder, ctc, position_limit).eval()
        self.position_limit = position_limit
        self.subsampling = encoder.embed
        self._expected: set[tuple[int, int]] | None = set()
        self._graphs: dict[ShapeKey, Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]] = {}
        self._failed: set[ShapeKey] = set()
        self._trace_lock = threading.Lock()  # several engine threads may meet a new shape at once

    def expect(self, input_frames: int, window: int) -> None:
        """Trace the step for chunks of ``input_frames`` fbank frames over ``window`` cache frames."""
        if self._expected is not None:
            self._expected.add((input_frames, window))

    def expect_any(self) -> None:
        """Trace every shape on its first use (benchmarks, tools that repeat a few shapes)."""
        self._expected = None

    @property
    def graphs(self) -> int:
        return len(self._graphs)

    def has_graph(self, input_frames: int, window: int, dtype: torch.dtype) -> bool:
        """Whether the graph of this shape is built (calls for it then trace nothing, so several
        threads may run it at once)."""
        return (input_frames, window, dtype) in self._graphs

    def __call__(self, inputs: ChunkStepInputs) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """The step's (ys, log_probs, new_kv, new_cnn), or None: not a declared shape, a
        position beyond the graphs' table, or tracing failed for this shape. ``inputs.rows`` and
        ``inputs.valid_frames`` are set: the graphs read the pool's rows (``TorchStep``)."""
        xs, offsets = inputs.xs, inputs.offsets
        t_in, window = xs.size(1), inputs.att_cache.size(3)
        max_offset = int(offsets.max()) if offsets.numel() else 0
        if max_offset + self.subsampling.output_length(t_in) > self.position_limit:
            return None
        key = (t_in, window, xs.dtype)
        graph = self._graphs.get(key)
        if graph is None:
            wanted = self._expected is None or (t_in, window) in self._expected
            if not wanted:
                return None
            with self._trace_lock:
                graph = self._graphs.get(key)
                if graph is None and key not in self._failed:
                    graph = self._trace(key, inputs)
            if graph is None:
                return None
        # No profiling-executor passes on top of freezing: re-optimizing for batch sizes it
        # had not seen stalled single steps by hundreds of ms in the micro-benchmark.
        with torch.jit.optimized_execution(False):
            return graph(*inputs)

    def _trace(
        self, key: ShapeKey, example: ChunkStepInputs
    ) -> Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]] | None:
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                # One eager step first fills the modules' weight-derived caches, so that the trace
                # records their values as constants rather than the ops that build them (some,
                # such as int8 matmuls on constants, are not folded by freezing).
                self.module(*example)
            # The tracer warns about Python values it records as constants: the shape (one
            # graph per shape) and the table size (checked in __call__): expected here.
            graph = frozen_trace(self.module, tuple(example), baked_values="ignore")
        except Exception:  # a model the tracer cannot follow still runs, eagerly
            log.exception("tracing the chunk step for input shape %s failed; it runs eagerly", key[:2])
            self._failed.add(key)
            return None
        self._graphs[key] = graph
        log.info(
            "traced the chunk step for %d-frame chunks over %d cache frames in %.1f s",
            key[0], key[1], time.perf_counter() - started,
        )  # fmt: skip
        return graph


def frozen_trace(
    module: nn.Module, example: tuple[Tensor | None, ...], *, baked_values: Literal["ignore", "error"]
) -> torch.jit.ScriptModule:
    """``module`` traced on ``example`` in serving mode and frozen (its weights and prepacked int8
    matmuls folded in as constants), for inference. ``baked_values``: what to do with the
    tracer's warnings that a Python value was recorded as a constant: "ignore" where the caller
    keys its graphs by those values (``TracedSteps``: one per shape), "error" where a graph must
    serve every size (``traced_decoder``): the caller then runs eagerly. Raises whatever the
    tracer raises; a caller keeps the eager module for that case.

    torch 2.13 marks ``torch.jit`` deprecated (``torch.compile`` was slower here and took minutes
    to compile, docs/BENCHMARKS.md); that warning is silenced, and where ``torch.jit`` is gone the
    call raises and the callers run eagerly."""
    with torch.inference_mode(), serving_trace(), warnings.catch_warnings():
        warnings.simplefilter(baked_values, torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r"`torch\.jit\.")
        traced = torch.jit.trace(module, example, check_trace=False)
        return torch.jit.freeze(traced.eval())
