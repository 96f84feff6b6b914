"""``asr-bench accuracy --int8-change``: the CER change of each INT8 backend against float32
torch on one test set, decoded through the serving engine, with the INT8 mode each ran in.

    asr-bench accuracy --int8-change --model asr_core/demo_model --testset DIR \\
        [--backends torch-int8,onnxruntime-int8] [--limit N] [--threads 1]

INT8 accuracy depends on the CPU (see asr_core.cpu_isa), so the JSON names the CPU tier and
the mode: ONNX Runtime's per-ISA weight mode, torch's quantized engine. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from asr_core import cpu_isa

DEFAULT_BACKENDS = "torch-int8,onnxruntime-int8"


def int8_mode(backend: str) -> str:
    """The INT8 mode ``backend`` runs in on this machine."""
    if backend.startswith("onnxruntime"):
        from asr_core.backends.onnx_graph import int8_mode_for

        return int8_mode_for(cpu_isa.detect())
    from asr_core.backends import int8_engine

    # torch's dynamic int8 Linears quantize activations to 7 bits (reduce_range) on x86.
    return f"{int8_engine()}-u7s8"


def cer_change(
    model: Path, testset: Path, backends: Sequence[str], limit: int | None, left_chunks: int, attention_beam: int
) -> dict[str, Any]:
    """CER per chunk size and method for torch and each backend, and each backend's change in points."""
    from deploy.bench.accuracy import evaluate

    def run(backend: str) -> dict[str, Any]:
        return evaluate(
            model, testset, limit=limit, backend=backend, left_chunks=left_chunks, attention_beam=attention_beam
        )

    isa = cpu_isa.detect()
    baseline = run("torch")
    report: dict[str, Any] = {
        "model": str(model),
        "testset": str(testset),
        "utterances": baseline["utterances"],
        "reference_chars": baseline["reference_chars"],
        "cpu": isa.level,
        "cpu_capped_by": isa.capped_by,
        "torch": baseline["cer"],
        "backends": {},
    }
    for backend in backends:
        got = run(backend)
        change = {
            chunk: {
                method: round(100 * (value - baseline["cer"][chunk][method]), 2)
                for method, value in cer.items()
                if method != "seconds"
            }
            for chunk, cer in got["cer"].items()
        }
        report["backends"][backend] = {"int8_mode": int8_mode(backend), "cer": got["cer"], "cer_change_points": change}
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asr-bench accuracy --int8-change", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="WeNet model dir")
    parser.add_argument("--testset", type=Path, required=True, help="dir with WAVs and a text file")
    parser.add_argument("--backends", default=DEFAULT_BACKENDS, help="comma-separated INT8 backends")
    parser.add_argument("--limit", type=int, help="only the first N utterances")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--left-chunks", type=int, default=8, help="the engine's cache window in chunks")
    parser.add_argument(
        "--attention-beam", type=int, default=0, help="attention proposals of joint finals (default 0: rescore)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    backends = [name for name in args.backends.split(",") if name]
    report = cer_change(args.model, args.testset, backends, args.limit, args.left_chunks, args.attention_beam)
    print(json.dumps(report, ensure_ascii=False))
    return 0
