"""Write a WeNet-format U2++ model directory with random weights, for benchmarks.

    python -m deploy.bench.make_random_model --arch aishell --out /tmp/aishell_random

The directory (``train.yaml``, ``final.pt``, ``units.txt``, ``global_cmvn``) loads with
``asr_core.model.loader.load_wenet_model`` and with WeNet's own loader; only the weights are
random, so speed and memory equal those of the released model of the same architecture.
Prints one JSON object describing what it wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from asr_core.model.asr_model import ASRModel
from asr_core.model.cmvn import GlobalCMVN, load_cmvn
from asr_core.model.config import parse_model_config
from asr_core.model.loader import load_wenet_model

FBANK_MEAN = 10.0  # typical log-mel level of 16-bit telephone speech
FBANK_STD = 3.0

ARCHS: dict[str, dict[str, Any]] = {
    # WeNet's AISHELL-1 U2++ conformer (examples/aishell/s0 u2++ config)
    "aishell": {
        "vocab": 4233,
        "encoder_conf": {
            "output_size": 256,
            "attention_heads": 4,
            "linear_units": 2048,
            "num_blocks": 12,
            "cnn_module_kernel": 8,
        },
        "decoder_conf": {"attention_heads": 4, "linear_units": 2048, "num_blocks": 3, "r_num_blocks": 3},
    },
    # WeNet's WenetSpeech U2++ conformer: encoder and decoder as in wenet-e2e/wenet
    # examples/wenetspeech/s0/conf/train_u2++_conformer.yaml (read 2026-12-06: conformer
    # 12 x 512, 8 heads, 2048 units, kernel 15, causal, dynamic chunk; bitransformer 3 + 3
    # blocks, 8 heads, 2048 units). The vocabulary is not in that file (the recipe builds
    # data/dict/lang_char.txt from the WenetSpeech transcripts) and the released archive's
    # train.yaml and units.txt could not be read from here: 5538 is unverified, and the
    # compute depends on it only through the CTC head and the decoder's embedding and output.
    "wenetspeech": {
        "vocab": 5538,
        "encoder_conf": {
            "output_size": 512,
            "attention_heads": 8,
            "linear_units": 2048,
            "num_blocks": 12,
            "cnn_module_kernel": 15,
        },
        "decoder_conf": {"attention_heads": 8, "linear_units": 2048, "num_blocks": 3, "r_num_blocks": 3},
    },
    # the golden fixture's architecture (wenet_u2pp_small)
    "small": {
        "vocab": 60,
        "encoder_conf": {
            "output_size": 128,
            "attention_heads": 4,
            "linear_units": 256,
            "num_blocks": 4,
            "cnn_module_kernel": 15,
        },
        "decoder_conf": {"attention_heads": 4, "linear_units": 256, "num_blocks": 2, "r_num_blocks": 1},
    },
}


def train_yaml(arch: str) -> dict[str, Any]:
    """A WeNet (2024+ layout) train.yaml for ``arch``, dropouts 0, streaming U2++ encoder."""
    spec = ARCHS[arch]
    vocab = spec["vocab"]
    return {
        "input_dim": 80,
        "output_dim": vocab,
        "vocab_size": vocab,
        "model": "asr_model",
        "encoder": "conformer",
        "encoder_conf": {
            **spec["encoder_conf"],
            "dropout_rate": 0.0,
            "positional_dropout_rate": 0.0,
            "attention_dropout_rate": 0.0,
            "input_layer": "conv2d",
            "normalize_before": True,
            "use_cnn_module": True,
            "activation_type": "swish",
            "pos_enc_layer_type": "rel_pos",
            "selfattention_layer_type": "rel_selfattn",
            "causal": True,
            "cnn_module_norm": "layer_norm",
            "use_dynamic_chunk": True,
            "use_dynamic_left_chunk": False,
            "static_chunk_size": 0,
        },
        "decoder": "bitransformer",
        "decoder_conf": {
            **spec["decoder_conf"],
            "dropout_rate": 0.0,
            "positional_dropout_rate": 0.0,
            "self_attention_dropout_rate": 0.0,
            "src_attention_dropout_rate": 0.0,
        },
        "ctc": "ctc",
        "ctc_conf": {"ctc_blank_id": 0},
        "model_conf": {"ctc_weight": 0.3, "reverse_weight": 0.3, "lsm_weight": 0.1, "length_normalized_loss": False},
        "cmvn": "global_cmvn",
        "cmvn_conf": {"cmvn_file": "global_cmvn", "is_json_cmvn": True},
        "tokenizer": "char",
        "tokenizer_conf": {
            "symbol_table_path": "units.txt",
            "special_tokens": {"<blank>": 0, "<unk>": 1, "<sos>": vocab - 1, "<eos>": vocab - 1},
        },
    }


def units(vocab: int) -> list[str]:
    """``<blank>``, ``<unk>``, CJK characters, ``<sos/eos>`` (last id), as released models."""
    return ["<blank>", "<unk>", *(chr(0x4E00 + i) for i in range(vocab - 3)), "<sos/eos>"]


def cmvn_stats(dim: int = 80, frames: int = 1000) -> dict[str, Any]:
    """WeNet JSON CMVN sums for frames of mean FBANK_MEAN and deviation FBANK_STD."""
    return {
        "mean_stat": [FBANK_MEAN * frames] * dim,
        "var_stat": [(FBANK_STD**2 + FBANK_MEAN**2) * frames] * dim,
        "frame_num": frames,
    }


def make_random_model(arch: str, out: Path, seed: int = 0) -> dict[str, Any]:
    """Write the model directory; returns a summary (parameter count, sizes)."""
    out.mkdir(parents=True, exist_ok=True)
    config_data = train_yaml(arch)
    (out / "train.yaml").write_text(yaml.safe_dump(config_data, sort_keys=True), encoding="utf-8")
    vocab = config_data["output_dim"]
    (out / "units.txt").write_text("".join(f"{u} {i}\n" for i, u in enumerate(units(vocab))), encoding="utf-8")
    (out / "global_cmvn").write_text(json.dumps(cmvn_stats()), encoding="utf-8")
    config = parse_model_config(config_data, out / "train.yaml")
    torch.manual_seed(seed)
    model = ASRModel(config, GlobalCMVN(*load_cmvn(out / "global_cmvn")))
    torch.save(model.state_dict(), out / "final.pt")
    loaded = load_wenet_model(out)
    return {
        "arch": arch,
        "out": str(out),
        "seed": seed,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "final_pt_bytes": (out / "final.pt").stat().st_size,
        "vocab_size": loaded.vocab_size,
        "d_model": loaded.d_model,
        "num_blocks": loaded.num_blocks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--arch", choices=sorted(ARCHS), required=True)
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights")
    args = parser.parse_args(argv)
    print(json.dumps(make_random_model(args.arch, args.out, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
