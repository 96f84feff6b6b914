"""The contract between the engine and a backend: ``ChunkRunner``, its inputs ``ChunkStepInputs``
and its output ``ChunkStep``.

A runner takes B streams' chunk features and caches and returns encoder output, CTC log-probs
and the chunk's new caches. Backends live in their own modules (``torch_runner``,
``onnxruntime``, ``tensorrt``, ``cudagraph``); ``registry.make_runner`` picks one by name.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


class ChunkStepInputs(NamedTuple):
    """Inputs of one batched chunk step: B streams, T_in fbank frames each, W cached encoder
    frames (L layers, H heads, D model dims, K conv kernel). The first six are
    ``U2Encoder.forward_chunk_batch``'s arguments in its order (see it for their meaning), and
    the exported graphs' inputs (``onnx_graph.CHUNK_INPUTS``).

    The caches are either exactly the batch's (``rows`` None: dim 1 is B) or a whole pool's of S
    slots (dim 1 is S) with ``rows`` the batch's rows of it (``cache_rows``).

    ``valid_frames`` (only for a runner that ``pads_short_chunks``): each row's encoder frames of
    real audio, the rest of its fbank padding (a stream's short last chunk run at its full
    chunk's shape); the step's outputs past them are meaningless (``forward_chunk_batch``).
    """

    xs: torch.Tensor  # (B, T_in, n_mels) raw fbank
    offsets: torch.Tensor  # (B,) int64 encoder-frame index of each stream's first new frame
    att_cache: torch.Tensor  # (L, B or S, H, W, 2*d_k) cached keys|values
    cache_pos: torch.Tensor  # (B, W) int64 encoder-frame index of each cached frame
    cache_mask: torch.Tensor  # (B, W) bool, True where the cached frame is valid
    cnn_cache: torch.Tensor  # (L, B or S, D, K-1)
    rows: torch.Tensor | None = None  # (B,) int64 the batch's rows of a pool's caches
    valid_frames: torch.Tensor | None = None  # (B,) int64 real output frames per row, 1..C; None: all C

    def gathered(self) -> ChunkStepInputs:
        """The same step with the batch's caches only (copies of the pool's ``rows``) and no
        rows, for backends whose graphs take them gathered; these inputs where they already are."""
        if self.rows is None:
            return self
        return self._replace(
            att_cache=self.att_cache.index_select(1, self.rows),
            cnn_cache=self.cnn_cache.index_select(1, self.rows),
            rows=None,
        )

    def graph_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The six tensors an exported graph takes (``onnx_graph.CHUNK_INPUTS``, in its order),
        with the batch's caches gathered. The graphs take no padding mask (``valid_frames``)."""
        if self.valid_frames is not None:
            raise ValueError(
                "exported chunk graphs take no valid_frames (padded short chunks); run the chunk at its own shape"
            )
        batch = self.gathered()
        return batch.xs, batch.offsets, batch.att_cache, batch.cache_pos, batch.cache_mask, batch.cnn_cache


class ChunkStep(NamedTuple):
    """Outputs of one batched chunk step (B streams, C new encoder frames)."""

    ys: torch.Tensor  # (B, C, D) encoder output
    log_probs: torch.Tensor  # (B, C, V) CTC log-softmax
    new_kv: torch.Tensor  # (L, B, H, C, 2*d_k) keys|values of the chunk's frames
    new_cnn: torch.Tensor  # (L, B, D, K-1)


class ChunkRunner(Protocol):
    """What the engine calls on a backend: ``expect`` while it is built and as streams of new
    shapes open, ``step`` once per batch, ``close`` when it stops. Every backend implements all three (no-ops where a
    backend has nothing to prepare or release), so callers never probe for them.

    ``reads_pool``: whether ``step`` is best given the whole cache pool and the batch's ``rows``
    (it reads each layer's rows where they lie: the torch backends); otherwise the caller
    gathers the batch's caches first (into a reused buffer). Every backend accepts both
    (``ChunkStepInputs``).

    ``pads_short_chunks``: whether ``step`` takes a short last chunk padded to a full chunk's
    shape (``ChunkStepInputs.valid_frames``), so that it runs the full shape's prepared step (the
    torch backends' traced graph); otherwise the caller runs it at its own shape.
    """

    reads_pool: bool
    pads_short_chunks: bool

    def expect(self, input_frames: int, window: int) -> None:
        """Declare a chunk shape the caller will run often: ``input_frames`` fbank frames per
        chunk, ``window`` cached encoder frames. A backend may prepare for it (the torch
        backends trace a graph for it); a step of any other shape must still run."""
        ...

    def step(self, inputs: ChunkStepInputs) -> ChunkStep:
        """One batched chunk step (shapes in ``ChunkStepInputs``)."""
        ...

    def close(self) -> None:
        """Release what the runner holds beyond its weights (helper threads); a later step may
        start them again."""
        ...
