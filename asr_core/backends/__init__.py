"""Backends that run the batched chunk step: the encoder forward plus the CTC head.

The engine talks to every backend through ``ChunkRunner``: B streams' chunk features and
gathered caches in, encoder output, CTC log-probs and the chunk's new caches out. The torch
backend lives here; others (ONNX Runtime, TensorRT) are imported lazily by ``make_runner`` so
that their packages stay optional.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from asr_core.model.loader import LoadedModel


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
    """Eager PyTorch: the model's own ``forward_chunk_batch`` and CTC head."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.model = loaded.model

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
        ys, new_kv, new_cnn = self.model.encoder.forward_chunk_batch(
            xs, offsets, att_cache, cache_pos, cache_mask, cnn_cache
        )
        return ChunkStep(ys, self.model.ctc_log_probs(ys).float(), new_kv, new_cnn)


def make_runner(backend: str, loaded: LoadedModel) -> ChunkRunner:
    """The chunk runner for ``backend`` (``torch`` here; others are optional extras)."""
    if backend == "torch":
        return TorchChunkRunner(loaded)
    raise ValueError(f"engine backend {backend!r} is not available; choose one of: torch")
