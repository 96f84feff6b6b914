"""forward_chunk_batch exports to ONNX with dynamic batch and cache width, and matches eager."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from asr_core.model import U2Encoder, load_wenet_model

ort = pytest.importorskip("onnxruntime")
FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(not (FIXTURE / "model").is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")
NAMES = ["xs", "offsets", "att_cache", "cache_pos", "cache_mask", "cnn_cache"]


class ChunkBatch(nn.Module):
    def __init__(self, encoder: U2Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, xs: Tensor, offsets: Tensor, att: Tensor, pos: Tensor, mask: Tensor, cnn: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        return self.encoder.forward_chunk_batch(xs, offsets, att, pos, mask, cnn)


def make_inputs(batch: int, width: int, generator: torch.Generator) -> tuple[Tensor, ...]:
    offsets = torch.randint(width, 5000, (batch,), generator=generator)
    pos = offsets[:, None] - width + torch.randperm(width, generator=generator)[None]
    mask = torch.rand(batch, width, generator=generator) > 0.3
    return (
        torch.randn(batch, 19, 80, generator=generator),
        offsets,
        torch.randn(4, batch, 4, width, 64, generator=generator),
        pos,
        mask,
        torch.randn(4, batch, 128, 14, generator=generator),
    )


def test_onnx_export_matches_eager(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    encoder = load_wenet_model(FIXTURE / "model").model.encoder
    generator = torch.Generator().manual_seed(1)
    onnx_path = tmp_path / "chunk_batch.onnx"
    torch.onnx.export(
        ChunkBatch(encoder),
        make_inputs(3, 8, generator),
        onnx_path,
        dynamo=False,
        input_names=NAMES,
        output_names=["ys", "new_kv", "new_cnn"],
        dynamic_axes={
            "xs": {0: "B"},
            "offsets": {0: "B"},
            "att_cache": {1: "B", 3: "W"},
            "cache_pos": {0: "B", 1: "W"},
            "cache_mask": {0: "B", 1: "W"},
            "cnn_cache": {1: "B"},
        },
        opset_version=17,
    )
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    inputs = make_inputs(5, 12, generator)
    got = session.run(None, {name: t.numpy() for name, t in zip(NAMES, inputs, strict=True)})
    with torch.inference_mode():
        want = encoder.forward_chunk_batch(*inputs)
    for g, w in zip(got, want, strict=True):
        assert g.shape == tuple(w.shape)
        assert float(np.abs(g - w.numpy()).max()) <= 1e-4
