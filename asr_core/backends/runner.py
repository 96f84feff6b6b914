"""The contract between the engine and a backend: ``ChunkRunner`` and its output ``ChunkStep``.

A runner takes B streams' chunk features and gathered caches and returns encoder output, CTC
log-probs and the chunk's new caches. Backends live in their own modules (``torch_runner``,
``onnxruntime``, ``tensorrt``, ``cudagraph``); ``registry.make_runner`` picks one by name.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


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
    gathers the batch's caches first (into a reused buffer). Every backend accepts both.
    """

    reads_pool: bool

    def expect(self, input_frames: int, window: int) -> None:
        """Declare a chunk shape the caller will run often: ``input_frames`` fbank frames per
        chunk, ``window`` cached encoder frames. A backend may prepare for it (the torch
        backends trace a graph for it); a step of any other shape must still run."""
        ...

    def step(
        self,
        xs: torch.Tensor,
        offsets: torch.Tensor,
        att_cache: torch.Tensor,
        cache_pos: torch.Tensor,
        cache_mask: torch.Tensor,
        cnn_cache: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> ChunkStep:
        """One batched chunk step; see ``U2Encoder.forward_chunk_batch`` for the argument shapes.
        ``rows`` (B,) int64: att_cache and cnn_cache are a pool's (L, S, ...) and these are the
        batch's rows of it (``cache_rows``); None: they hold exactly the batch's caches."""
        ...

    def close(self) -> None:
        """Release what the runner holds beyond its weights (helper threads); a later step may
        start them again."""
        ...


def batch_caches(
    att_cache: torch.Tensor, cnn_cache: torch.Tensor, rows: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's caches of ``ChunkRunner.step``'s arguments, for backends whose graphs take
    them gathered (copies of the pool's ``rows``; the arguments themselves without rows)."""
    if rows is None:
        return att_cache, cnn_cache
    return att_cache.index_select(1, rows), cnn_cache.index_select(1, rows)
