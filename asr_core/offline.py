"""Whole-file encoding for ``asr-transcribe``: full context, or WeNet's simulated streaming."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from asr_core.model.loader import LoadedModel


@dataclass(frozen=True)
class ChunkInfo:
    """One step of the streaming loop (all counts in frames)."""

    index: int
    fbank_start: int
    """first fbank frame read (inclusive)"""
    fbank_end: int
    """last fbank frame read (exclusive)"""
    offset: int
    """absolute encoder frame of the chunk's first output"""
    output_frames: int
    att_cache_frames: int
    """attention cache frames kept after this chunk"""


def encode_full(loaded: LoadedModel, fbank: Tensor) -> Tensor:
    """fbank: (T, n_mels) raw (CMVN is inside the model) -> encoder output (T', D), full context."""
    model = loaded.model
    xs = fbank.to(next(model.parameters()).device).unsqueeze(0)
    with torch.inference_mode():
        ys, _ = model.encoder(xs, torch.tensor([xs.size(1)], device=xs.device), -1, -1)
    return ys[0]


def encode_streaming(
    loaded: LoadedModel, fbank: Tensor, chunk_frames: int, left_chunks: int
) -> tuple[Tensor, list[ChunkInfo]]:
    """Chunk-by-chunk encoding with caches, as WeNet's ``forward_chunk_by_chunk``.

    fbank: (T, n_mels) raw; chunk_frames: encoder frames per chunk (C > 0); left_chunks:
    chunks of attention history kept (-1: unlimited). Returns (encoder output (T', D), chunks).
    An utterance shorter than right_context+1 fbank frames gives (0, D) and no chunks.
    """
    encoder = loaded.model.encoder
    xs = fbank.to(next(loaded.model.parameters()).device).unsqueeze(0)
    required_cache_size = chunk_frames * left_chunks
    att_cache: Tensor | None = None
    cnn_cache: Tensor | None = None
    outputs: list[Tensor] = []
    infos: list[ChunkInfo] = []
    offset = 0
    with torch.inference_mode():
        for index, (start, end) in enumerate(encoder.chunk_windows(xs.size(1), chunk_frames)):
            ys, att_cache, cnn_cache = encoder.forward_chunk(
                xs[:, start:end], offset, required_cache_size, att_cache, cnn_cache
            )
            infos.append(ChunkInfo(index, start, end, offset, ys.size(1), att_cache.size(2)))
            outputs.append(ys[0])
            offset += ys.size(1)
    if not outputs:
        return xs.new_zeros(0, encoder.output_size), infos
    return torch.cat(outputs), infos
