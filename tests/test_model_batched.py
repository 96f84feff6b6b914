"""Batched multi-stream chunk forward == single-stream WeNet forward_chunk, and a simulated
KV ring reproduces WeNet's streaming outputs (what the engine does)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from asr_core.model import LoadedModel, load_wenet_model
from asr_core.model.attention import RelPositionMultiHeadedAttention
from asr_core.model.encoder_layer import ConformerEncoderLayer

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(
    not (FIXTURE / "expected.npz").is_file(), reason=f"WeNet fixture not found at {FIXTURE}"
)
TOL = 1e-4
CHUNK = 4


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(FIXTURE / "model")


@pytest.fixture(scope="module")
def fbanks() -> dict[str, torch.Tensor]:
    with np.load(FIXTURE / "expected.npz") as npz:
        return {utt: torch.from_numpy(npz[f"{utt}__fbank"]) for utt in ("utt1", "utt2")}


@dataclass
class Expected:
    """One stream's state before chunk ``index`` and WeNet-style results of that chunk."""

    xs: torch.Tensor  # (T_in, n_mels)
    offset: int
    att_cache: torch.Tensor  # (L, H, cache_t, 2*d_k)
    cnn_cache: torch.Tensor  # (L, 1, D, K-1)
    ys: torch.Tensor  # (C, D)
    new_kv: torch.Tensor  # (L, H, C, 2*d_k)
    new_cnn: torch.Tensor  # (L, 1, D, K-1)


def single_stream(loaded: LoadedModel, fbank: torch.Tensor, index: int, left_chunks: int) -> Expected:
    """Run WeNet's loop single-stream up to chunk ``index`` with ``left_chunks`` of history."""
    encoder = loaded.model.encoder
    windows = encoder.chunk_windows(fbank.size(0), CHUNK)
    att = torch.zeros(0, 0, 0, 0)
    cnn = torch.zeros(0, 0, 0, 0)
    offset = 0
    with torch.inference_mode():
        for start, end in windows[:index]:
            ys, att, cnn = encoder.forward_chunk(fbank[None, start:end], offset, CHUNK * left_chunks, att, cnn)
            offset += ys.size(1)
        if att.size(0) == 0:
            att = torch.zeros(loaded.num_blocks, loaded.heads, 0, 2 * loaded.d_k)
            cnn = torch.zeros(loaded.num_blocks, 1, loaded.d_model, loaded.cnn_cache_frames)
        start, end = windows[index]
        ys, full, new_cnn = encoder.forward_chunk(fbank[None, start:end], offset, -1, att, cnn)
    return Expected(fbank[start:end], offset, att, cnn, ys[0], full[:, :, -ys.size(1) :], new_cnn)


def test_batched_equals_single_streams(loaded: LoadedModel, fbanks: dict[str, torch.Tensor]) -> None:
    # (utterance, chunk index, left chunks kept): new streams, full and partly full caches.
    plan = [
        ("utt1", 0, 2),
        ("utt2", 3, -1),
        ("utt1", 5, 2),
        ("utt2", 1, 1),
        ("utt1", 2, -1),
        ("utt2", 7, 3),
        ("utt2", 0, -1),
    ]
    streams = [single_stream(loaded, fbanks[utt], index, left) for utt, index, left in plan]
    generator = torch.Generator().manual_seed(0)
    width = 16
    batch = len(streams)
    ring = torch.full((loaded.num_blocks, batch, loaded.heads, width, 2 * loaded.d_k), float("nan"))
    cache_pos = torch.randint(-5, 10_000, (batch, width), generator=generator)
    cache_mask = torch.zeros(batch, width, dtype=torch.bool)
    for b, stream in enumerate(streams):
        cache_t = stream.att_cache.size(2)
        slots = torch.randperm(width, generator=generator)[:cache_t]  # shuffled ring order
        ring[:, b, :, slots] = stream.att_cache
        cache_pos[b, slots] = stream.offset - cache_t + torch.arange(cache_t)
        cache_mask[b, slots] = True
    assert sorted(int(n) for n in cache_mask.sum(1)) == [0, 0, 4, 8, 8, 12, 12]
    xs = torch.stack([s.xs for s in streams])
    offsets = torch.tensor([s.offset for s in streams])
    cnn = torch.cat([s.cnn_cache for s in streams], dim=1)
    with torch.inference_mode():
        ys, new_kv, new_cnn = loaded.model.encoder.forward_chunk_batch(xs, offsets, ring, cache_pos, cache_mask, cnn)
    assert ys.shape == (batch, CHUNK, loaded.d_model)
    assert new_kv.shape == (loaded.num_blocks, batch, loaded.heads, CHUNK, 2 * loaded.d_k)
    assert new_cnn.shape == (loaded.num_blocks, batch, loaded.d_model, loaded.cnn_cache_frames)
    for b, stream in enumerate(streams):
        assert float((ys[b] - stream.ys).abs().max()) <= TOL, f"stream {b} ys"
        assert float((new_kv[:, b] - stream.new_kv).abs().max()) <= TOL, f"stream {b} kv"
        assert float((new_cnn[:, b] - stream.new_cnn[:, 0]).abs().max()) <= TOL, f"stream {b} cnn"


@pytest.mark.parametrize(("chunk", "left"), [(4, -1), (4, 2), (8, -1), (16, 4)])
def test_simulated_ring_matches_wenet_streaming(
    loaded: LoadedModel, fbanks: dict[str, torch.Tensor], chunk: int, left: int
) -> None:
    """Both utterances decoded together, window = chunk * left_chunks frames per stream."""
    encoder = loaded.model.encoder
    with np.load(FIXTURE / "expected.npz") as npz:
        want = {utt: npz[f"{utt}__encoder_out_stream_c{chunk}_l{left}"] for utt in fbanks}
    utts = sorted(fbanks)
    windows = {utt: encoder.chunk_windows(fbanks[utt].size(0), chunk) for utt in utts}
    longest = max(len(w) for w in windows.values())
    width = chunk * left if left > 0 else chunk * longest
    n_layers, heads, dkk = loaded.num_blocks, loaded.heads, 2 * loaded.d_k
    ring = torch.zeros(n_layers, len(utts), heads, width, dkk)
    ring_pos = torch.zeros(len(utts), width, dtype=torch.int64)
    ring_mask = torch.zeros(len(utts), width, dtype=torch.bool)
    cnn = torch.zeros(n_layers, len(utts), loaded.d_model, loaded.cnn_cache_frames)
    offsets = torch.zeros(len(utts), dtype=torch.int64)
    outputs: dict[str, list[torch.Tensor]] = {utt: [] for utt in utts}
    for step in range(longest):
        active = [i for i, utt in enumerate(utts) if step < len(windows[utt])]
        by_length: dict[int, list[int]] = {}
        for i in active:
            start, end = windows[utts[i]][step]
            by_length.setdefault(end - start, []).append(i)
        for group in by_length.values():
            idx = torch.tensor(group)
            xs = torch.stack([fbanks[utts[i]][slice(*windows[utts[i]][step])] for i in group])
            with torch.inference_mode():
                ys, new_kv, new_cnn = encoder.forward_chunk_batch(
                    xs, offsets[idx], ring[:, idx], ring_pos[idx], ring_mask[idx], cnn[:, idx]
                )
            frames = ys.size(1)
            for j, i in enumerate(group):
                outputs[utts[i]].append(ys[j])
                pos = int(offsets[i]) + torch.arange(frames)
                slots = pos % width
                ring[:, i, :, slots] = new_kv[:, j]
                ring_pos[i, slots] = pos
                ring_mask[i, slots] = True
                cnn[:, i] = new_cnn[:, j]
                offsets[i] += frames
    for utt in utts:
        got = torch.cat(outputs[utt])
        assert got.shape == want[utt].shape
        assert float((got - torch.from_numpy(want[utt])).abs().max()) <= TOL, utt


def first_rel_attention(loaded: LoadedModel) -> RelPositionMultiHeadedAttention:
    layer = loaded.model.encoder.encoders[0]
    assert isinstance(layer, ConformerEncoderLayer)
    assert isinstance(layer.self_attn, RelPositionMultiHeadedAttention)
    return layer.self_attn


def test_position_table_paths_agree(loaded: LoadedModel, fbanks: dict[str, torch.Tensor]) -> None:
    """Table lookup, on-the-fly projection (beyond the table limit) and weight edits agree."""
    encoder = loaded.model.encoder
    stream = single_stream(loaded, fbanks["utt2"], 6, -1)
    cache_t = stream.att_cache.size(2)
    args = (
        stream.xs[None],
        torch.tensor([stream.offset]),
        stream.att_cache[:, None],
        (stream.offset - cache_t + torch.arange(cache_t))[None],
        torch.ones(1, cache_t, dtype=torch.bool),
        stream.cnn_cache,
    )
    with torch.inference_mode():
        table_ys = encoder.forward_chunk_batch(*args)[0]
    limit = encoder.position_table_limit
    try:
        encoder.position_table_limit = 1
        with torch.inference_mode():
            direct_ys = encoder.forward_chunk_batch(*args)[0]
    finally:
        encoder.position_table_limit = limit
    assert float((table_ys - direct_ys).abs().max()) <= 1e-5
    weight = first_rel_attention(loaded).linear_pos.weight
    original = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)
        with torch.inference_mode():
            changed = encoder.forward_chunk_batch(*args)[0]
        encoder.position_table_limit = 1
        with torch.inference_mode():
            changed_direct = encoder.forward_chunk_batch(*args)[0]
    finally:
        encoder.position_table_limit = limit
        with torch.no_grad():
            weight.copy_(original)
    assert float((changed - table_ys).abs().max()) > 1e-3
    assert float((changed - changed_direct).abs().max()) <= 1e-5
    with torch.inference_mode():
        restored = encoder.forward_chunk_batch(*args)[0]
    assert float((restored - table_ys).abs().max()) <= 1e-6
