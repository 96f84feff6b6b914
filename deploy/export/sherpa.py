"""Export a WeNet U2++ model for sherpa-onnx's streaming WeNet CTC recognizer.

    asr-export sherpa-onnx --model MODEL_DIR --out OUT_DIR [--chunk-size 16] [--left-chunks 4] [--int8]

Writes ``model-streaming.onnx`` (and ``model-streaming.int8.onnx`` with ``--int8``) plus
``tokens.txt``; load them with ``sherpa_onnx.OnlineRecognizer.from_wenet_ctc(tokens=...,
model=..., chunk_size=..., num_left_chunks=...)``.

sherpa-onnx runs one stream per call with this interface (names and order are what it feeds):

    inputs   x (1, T_in, n_mels) raw fbank (samples in int16 range), offset (1,) int64,
             required_cache_size (1,) int64, attn_cache (L, H, R, 2*d_k),
             conv_cache (L, 1, D, K-1), attn_mask (1, 1, R + chunk) bool
    outputs  log_probs (1, C, V), next_att_cache (L, H, R, 2*d_k), next_conv_cache (L, 1, D, K-1)

with R = chunk_size * left_chunks. sherpa-onnx starts ``offset`` at R (not 0) and marks the
not-yet-filled part of the cache invalid in ``attn_mask``. The graph subtracts R again, so
encoder positions are the ones WeNet's own streaming (and our engine) uses; it is our batched
chunk step with B = 1 and the attention cache kept as a fixed-size window of the last R frames.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from asr_core import cpu_isa
from asr_core.backends.onnx_graph import (
    DEFAULT_OPSET,
    LEGACY_EXPORTER_WARNINGS,
    add_metadata,
    cpu_float_copy,
    int8_mode_for,
    quantize_int8,
)
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.stream import chunk_input_frames

MODEL_FILE = "model-streaming.onnx"
MODEL_INT8_FILE = "model-streaming.int8.onnx"
TOKENS_FILE = "tokens.txt"
INPUTS = ("x", "offset", "required_cache_size", "attn_cache", "conv_cache", "attn_mask")
OUTPUTS = ("log_probs", "next_att_cache", "next_conv_cache")


class SherpaWenetGraph(nn.Module):
    """sherpa-onnx's WeNet streaming signature on top of ``forward_chunk_batch`` (B = 1)."""

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__()
        self.model = loaded.model

    def forward(
        self,
        x: Tensor,
        offset: Tensor,
        required_cache_size: Tensor,
        attn_cache: Tensor,
        conv_cache: Tensor,
        attn_mask: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        window = attn_cache.size(2)  # R
        start = offset - required_cache_size  # (1,) encoder frames already emitted
        cache_pos = start.unsqueeze(1) - window + torch.arange(window).unsqueeze(0)  # (1, R)
        cache_mask = attn_mask[:, 0, :window]  # (1, R)
        ys, new_kv, new_cnn = self.model.encoder.forward_chunk_batch(
            x, start, attn_cache.unsqueeze(1), cache_pos, cache_mask, conv_cache
        )  # ys (1, C, D), new_kv (L, 1, H, C, 2*d_k)
        full = torch.cat((attn_cache, new_kv[:, 0]), dim=2)  # (L, H, R + C, 2*d_k)
        return self.model.ctc_log_probs(ys), full[:, :, full.size(2) - window :], new_cnn


def sherpa_metadata(loaded: LoadedModel, chunk_size: int, left_chunks: int) -> dict[str, int | str]:
    """The metadata keys sherpa-onnx's ``OnlineWenetCtcModel`` reads (plus descriptive ones)."""
    return {
        "model_type": "wenet_ctc",
        "version": "1",
        "model_author": "hotline-asr",
        "comment": "streaming",
        "chunk_size": chunk_size,
        "left_chunks": left_chunks,
        "head": loaded.heads,
        "num_blocks": loaded.num_blocks,
        "output_size": loaded.d_model,
        "cnn_module_kernel": loaded.cnn_cache_frames + 1,
        "right_context": loaded.right_context,
        "subsampling_factor": loaded.subsampling,
        "vocab_size": loaded.vocab_size,
    }


def _example(loaded: LoadedModel, chunk_size: int, left_chunks: int) -> tuple[Tensor, ...]:
    """The inputs of sherpa-onnx's first call for one stream."""
    window = chunk_size * left_chunks
    t_in = chunk_input_frames(chunk_size, loaded.subsampling, loaded.right_context)
    x = torch.randn(1, t_in, loaded.config.input_dim) * 3 + 8  # (1, T_in, n_mels)
    attn_cache = torch.zeros(loaded.num_blocks, loaded.heads, window, 2 * loaded.d_k)
    conv_cache = torch.zeros(loaded.num_blocks, 1, loaded.d_model, loaded.cnn_cache_frames)
    attn_mask = torch.ones(1, 1, window + chunk_size, dtype=torch.bool)
    attn_mask[:, :, :window] = False
    return x, torch.tensor([window]), torch.tensor([window]), attn_cache, conv_cache, attn_mask


def export_sherpa_model(loaded: LoadedModel, path: Path, chunk_size: int, left_chunks: int) -> None:
    """Write the sherpa-onnx streaming graph with dynamic T_in and cache length R."""
    loaded = cpu_float_copy(loaded)
    axes = {
        "x": {1: "T_in"},
        "attn_cache": {2: "R"},
        "attn_mask": {2: "R_plus_chunk"},
        "log_probs": {1: "C"},
        "next_att_cache": {2: "R"},
    }
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", LEGACY_EXPORTER_WARNINGS, DeprecationWarning)
        torch.onnx.export(
            SherpaWenetGraph(loaded).eval(),
            _example(loaded, chunk_size, left_chunks),
            str(path),
            input_names=list(INPUTS),
            output_names=list(OUTPUTS),
            dynamic_axes=axes,
            opset_version=DEFAULT_OPSET,
            dynamo=False,
        )
    add_metadata(path, sherpa_metadata(loaded, chunk_size, left_chunks))


def write_tokens(loaded: LoadedModel, path: Path) -> None:
    """``tokens.txt``: one ``<symbol> <id>`` per line, as WeNet's units.txt."""
    path.write_text("".join(f"{unit} {index}\n" for index, unit in enumerate(loaded.units)), encoding="utf-8")


def export_for_sherpa(
    model_dir: Path, out_dir: Path, chunk_size: int = 16, left_chunks: int = 4, int8: bool = False
) -> dict[str, str]:
    """Export the model in ``model_dir`` into ``out_dir``; returns {name: path}."""
    if chunk_size <= 0 or left_chunks <= 0:
        raise ValueError(f"chunk size and left chunks must be > 0, got {chunk_size} and {left_chunks}")
    loaded = load_wenet_model(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {"model": out_dir / MODEL_FILE, "tokens": out_dir / TOKENS_FILE}
    export_sherpa_model(loaded, written["model"], chunk_size, left_chunks)
    write_tokens(loaded, written["tokens"])
    if int8:
        written["model_int8"] = out_dir / MODEL_INT8_FILE
        mode = int8_mode_for(cpu_isa.detect())  # the mode accurate on this machine's CPU
        quantize_int8(written["model"], written["model_int8"], mode)
        return {**{name: str(path) for name, path in written.items()}, "int8_mode": mode}
    return {name: str(path) for name, path in written.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asr-export sherpa-onnx", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="WeNet model dir (train.yaml, final.pt, ...)")
    parser.add_argument("--out", type=Path, required=True, help="directory for model-streaming.onnx and tokens.txt")
    parser.add_argument("--chunk-size", type=int, default=16, help="encoder frames per chunk (metadata default)")
    parser.add_argument("--left-chunks", type=int, default=4, help="cached chunks of left context (metadata default)")
    parser.add_argument("--int8", action="store_true", help="also write the INT8 (dynamic quantization) model")
    args = parser.parse_args(argv)
    result = export_for_sherpa(args.model, args.out, args.chunk_size, args.left_chunks, args.int8)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
