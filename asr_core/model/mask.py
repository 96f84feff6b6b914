"""Attention masks: padding, causal (decoder) and chunk (streaming encoder) masks, as WeNet."""

from __future__ import annotations

import torch
from torch import Tensor


def make_pad_mask(lengths: Tensor, max_len: int = 0) -> Tensor:
    """True at padded positions.

    lengths: (B,) int64. Returns (B, max_len) bool (max_len defaults to lengths.max()).
    """
    max_len = max_len if max_len > 0 else int(lengths.max().item())
    steps = torch.arange(max_len, device=lengths.device, dtype=lengths.dtype)
    return steps.unsqueeze(0) >= lengths.unsqueeze(1)


def subsequent_mask(size: int, device: torch.device) -> Tensor:
    """(size, size) bool lower-triangular mask: position i sees 0..i (decoder self-attention)."""
    return torch.ones(size, size, device=device, dtype=torch.bool).tril()


def subsequent_chunk_mask(
    size: int, chunk_size: int, num_left_chunks: int = -1, device: torch.device | None = None
) -> Tensor:
    """(size, size) bool: frame i sees its own chunk, and ``num_left_chunks`` chunks before it
    (all previous chunks when negative). Same values as WeNet's ``subsequent_chunk_mask``."""
    pos = torch.arange(size, device=device)
    chunk_idx = pos // chunk_size  # (size,)
    ending = torch.clamp((chunk_idx + 1) * chunk_size, max=size)  # (size,)
    if num_left_chunks < 0:
        start = torch.zeros_like(chunk_idx)
    else:
        start = torch.clamp((chunk_idx - num_left_chunks) * chunk_size, min=0)
    cols = pos.unsqueeze(0)  # (1, size)
    return (cols >= start.unsqueeze(1)) & (cols < ending.unsqueeze(1))


def add_optional_chunk_mask(
    xs: Tensor,
    masks: Tensor,
    use_dynamic_chunk: bool,
    use_dynamic_left_chunk: bool,
    decoding_chunk_size: int,
    static_chunk_size: int,
    num_decoding_left_chunks: int,
    training: bool,
    max_chunk_size: int = 25,
) -> Tensor:
    """Encoder self-attention mask, as WeNet's ``add_optional_chunk_mask``.

    xs: (B, T, D) (only T is used); masks: (B, 1, T) bool padding mask.
    decoding_chunk_size: < 0 full context; > 0 that chunk size; 0 a random chunk size in
    training (dynamic chunk training) and full context in eval mode (WeNet would draw a random
    chunk in eval mode too, which no caller wants).
    Returns (B, T, T) or (B, 1, T) bool; a row that would be all False is set all True.
    """
    chunk_masks = masks
    if use_dynamic_chunk:
        max_len = xs.size(1)
        num_left_chunks = -1
        if decoding_chunk_size < 0 or (decoding_chunk_size == 0 and not training):
            chunk_size = max_len
        elif decoding_chunk_size > 0:
            chunk_size = decoding_chunk_size
            num_left_chunks = num_decoding_left_chunks
        else:
            chunk_size = int(torch.randint(1, max(max_len, 2), (1,)).item())
            if chunk_size > max_len // 2:
                chunk_size = max_len
            else:
                chunk_size = chunk_size % max_chunk_size + 1
                if use_dynamic_left_chunk:
                    max_left_chunks = (max_len - 1) // chunk_size
                    num_left_chunks = int(torch.randint(0, max(max_left_chunks, 1), (1,)).item())
        chunk_masks = masks & subsequent_chunk_mask(max_len, chunk_size, num_left_chunks, xs.device)
    elif static_chunk_size > 0:
        chunk_masks = masks & subsequent_chunk_mask(xs.size(1), static_chunk_size, num_decoding_left_chunks, xs.device)
    return chunk_masks | ~chunk_masks.any(dim=-1, keepdim=True)
