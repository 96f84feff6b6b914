"""Export a WeNet U2++ model to ONNX: the batched chunk step, the rescoring decoder, INT8.

    python -m deploy.export.onnx_export --model MODEL_DIR --out OUT_DIR
    python -m deploy.export.onnx_export check --model MODEL_DIR --out OUT_DIR [--wav WAV ...]

`encoder_chunk.onnx` is `forward_chunk_batch` plus the CTC head, with dynamic batch B,
cache length W and input length T_in (so any chunk size):

    inputs   xs (B, T_in, n_mels) float32 raw fbank, offsets (B,) int64,
             att_cache (L, B, H, W, 2*d_k) float32, cache_pos (B, W) int64,
             cache_mask (B, W) bool, cnn_cache (L, B, D, K-1) float32
    outputs  ys (B, C, D), log_probs (B, C, V), new_kv (L, B, H, C, 2*d_k), new_cnn (L, B, D, K-1)

`encoder_chunk.int8.onnx` is the same graph with its weight MatMuls dynamically quantized to
INT8 (activations quantized per call). `decoder.onnx` maps (memory (N, T', D), memory_mask
(N, 1, T') bool, ys_in_pad (N, L) int64, ys_in_lens (N,), r_ys_in_pad (N, L)) to the
left-to-right and right-to-left log-probs (N, L, V). `check` runs ONNX Runtime and torch side
by side and prints the largest absolute differences as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from asr_common.scoring import char_errors, scoring_text
from asr_core import cpu_isa
from asr_core.audio_io import read_wav
from asr_core.backends.onnx_graph import (
    CHUNK_OUTPUTS,
    DEFAULT_OPSET,
    ENCODER_FILE,
    ENCODER_INT8_FILE,
    INT8_MODES,
    LEGACY_EXPORTER_WARNINGS,
    ChunkStepGraph,
    add_metadata,
    chunk_example,
    export_chunk_step,
    int8_mode_for,
    model_metadata,
    quantize_int8,
)
from asr_core.backends.onnxruntime import DECODER_INPUTS, OrtChunkRunner, OrtDecoderRunner
from asr_core.backends.runner import ChunkStepInputs
from asr_core.frontend import compute_fbank
from asr_core.model.decoder import BiTransformerDecoder
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.tokens import tokens_to_text
from kv_ring import KvPool

__all__ = ["DECODER_FILE", "ENCODER_FILE", "ENCODER_INT8_FILE", "export_all", "export_decoder", "main"]

DECODER_FILE = "decoder.onnx"


class DecoderGraph(nn.Module):
    """The attention decoder with both directions always on (rescoring weighs them later)."""

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__()
        self.decoder = loaded.model.decoder

    def forward(
        self, memory: Tensor, memory_mask: Tensor, ys_in_pad: Tensor, ys_in_lens: Tensor, r_ys_in_pad: Tensor
    ) -> tuple[Tensor, ...]:
        l2r, r2l = self.decoder(memory, memory_mask, ys_in_pad, ys_in_lens, r_ys_in_pad, 1.0)
        return (l2r, r2l) if isinstance(self.decoder, BiTransformerDecoder) else (l2r,)


def export_decoder(loaded: LoadedModel, path: Path, opset: int = DEFAULT_OPSET) -> None:
    """Write the rescoring decoder with dynamic N hypotheses, L tokens and T' frames."""
    bidirectional = isinstance(loaded.model.decoder, BiTransformerDecoder)
    outputs = ["l2r_log_probs", "r2l_log_probs"] if bidirectional else ["l2r_log_probs"]
    example = _decoder_example(loaded, hyps=3, length=6, frames=11, seed=0)
    axes = {
        "memory": {0: "N", 1: "T"},
        "memory_mask": {0: "N", 2: "T"},
        "ys_in_pad": {0: "N", 1: "L"},
        "ys_in_lens": {0: "N"},
        "r_ys_in_pad": {0: "N", 1: "L"},
        **{name: {0: "N", 1: "L"} for name in outputs},
    }
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", LEGACY_EXPORTER_WARNINGS, DeprecationWarning)
        # make_pad_mask's `max_len > 0` is traced as a constant; L >= 1 always (sos comes first).
        warnings.filterwarnings("ignore", "Converting a tensor to a Python boolean", torch.jit.TracerWarning)
        torch.onnx.export(
            DecoderGraph(loaded).eval(),
            example,
            str(path),
            input_names=list(DECODER_INPUTS),
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )
    add_metadata(path, dict(model_metadata(loaded)))


def _decoder_example(loaded: LoadedModel, hyps: int, length: int, frames: int, seed: int) -> tuple[Tensor, ...]:
    """Random rescoring inputs: sos + tokens padded with eos, forward and reversed."""
    generator = torch.Generator().manual_seed(seed)
    memory = torch.randn(hyps, frames, loaded.d_model, generator=generator)  # (N, T', D)
    memory_mask = torch.ones(hyps, 1, frames, dtype=torch.bool)
    memory_mask[0, 0, frames // 2 :] = False
    tokens = torch.randint(2, loaded.vocab_size - 1, (hyps, length - 1), generator=generator)
    lens = torch.randint(1, length, (hyps,), generator=generator)  # (N,) tokens per hypothesis
    lens[0] = length - 1
    steps = torch.arange(length - 1)
    valid = steps.unsqueeze(0) < lens.unsqueeze(1)  # (N, L-1)
    sos = torch.full((hyps, 1), loaded.sos_id)
    forward = torch.cat((sos, torch.where(valid, tokens, loaded.eos_id)), dim=1)  # (N, L)
    reversed_index = ((lens.unsqueeze(1) - 1 - steps) * valid).clamp(min=0)
    backward = torch.cat((sos, torch.where(valid, tokens.gather(1, reversed_index), loaded.eos_id)), dim=1)
    return memory, memory_mask, forward, lens + 1, backward


def export_all(
    model_dir: Path, out_dir: Path, opset: int = DEFAULT_OPSET, int8: bool = True, int8_mode: str = "auto"
) -> dict[str, str]:
    """Export every graph of the model in `model_dir` into `out_dir`; returns {name: path} plus,
    with INT8, the mode used and the CPU tier it was chosen for (``auto``: this machine's)."""
    loaded = load_wenet_model(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {"encoder_chunk": out_dir / ENCODER_FILE, "decoder": out_dir / DECODER_FILE}
    export_chunk_step(loaded, written["encoder_chunk"], opset)
    export_decoder(loaded, written["decoder"], opset)
    if int8:
        isa = cpu_isa.detect()
        mode = int8_mode_for(isa) if int8_mode == "auto" else int8_mode
        written["encoder_chunk_int8"] = out_dir / ENCODER_INT8_FILE
        quantize_int8(written["encoder_chunk"], written["encoder_chunk_int8"], mode)
        chosen_for = isa.level if int8_mode == "auto" else "explicit --int8-mode"
        return {**{name: str(path) for name, path in written.items()}, "int8_mode": mode, "int8_chosen_for": chosen_for}
    return {name: str(path) for name, path in written.items()}


def _max_abs(a: Tensor, b: Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


ChunkStepFn = Callable[[ChunkStepInputs], tuple[Tensor, Tensor, Tensor, Tensor]]
"""A chunk step: a runner's ``step`` or ``torch_step``'s reference."""


def torch_step(loaded: LoadedModel) -> ChunkStepFn:
    """The exported graph's torch module (``ChunkStepGraph``), the reference the ONNX graphs are
    checked against, as a ``ChunkStepFn``."""
    graph = ChunkStepGraph(loaded).eval()

    def step(inputs: ChunkStepInputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        with torch.no_grad():
            return graph(*inputs.graph_inputs())

    return step


def check_random(loaded: LoadedModel, runner: OrtChunkRunner) -> dict[str, float]:
    """Largest |ONNX - torch| over random chunk steps of several batch, chunk and cache sizes."""
    errors = dict.fromkeys(CHUNK_OUTPUTS, 0.0)
    reference = torch_step(loaded)
    for seed, (batch, chunk, window) in enumerate(((1, 4, 8), (4, 16, 64), (6, 8, 5))):
        example = ChunkStepInputs(*chunk_example(loaded, batch, chunk, window, seed + 1))
        want = reference(example)
        got = runner.step(example)
        for name, a, b in zip(CHUNK_OUTPUTS, got, want, strict=True):
            errors[name] = max(errors[name], _max_abs(a, b))
    return errors


def stream_through_pool(
    step: ChunkStepFn, loaded: LoadedModel, fbank: Tensor, chunk: int, left_chunks: int
) -> tuple[Tensor, Tensor]:
    """Stream one utterance's fbank (T, n_mels) chunk by chunk with a one-slot KvPool.

    Returns (encoder output (T', D), CTC log-probs (T', V)).
    """
    pool = KvPool(1, loaded.cache_geometry(chunk * left_chunks))
    slot = torch.tensor([pool.allocate(chunk * left_chunks)])
    outputs: list[Tensor] = []
    log_probs: list[Tensor] = []
    offset = 0
    with torch.no_grad():
        for start, end in loaded.model.encoder.chunk_windows(fbank.size(0), chunk):
            view = pool.gather(slot)
            offsets = torch.tensor([offset])
            ys, logp, new_kv, new_cnn = step(
                ChunkStepInputs(fbank[start:end].unsqueeze(0), offsets, view.att, view.pos, view.mask, view.cnn)
            )
            pool.write(slot, new_kv, offset + torch.arange(ys.size(1)).unsqueeze(0), new_cnn)
            outputs.append(ys[0])
            log_probs.append(logp[0])
            offset += ys.size(1)
    return torch.cat(outputs), torch.cat(log_probs)


def check_audio(
    loaded: LoadedModel, runners: dict[str, OrtChunkRunner], wavs: Sequence[Path], chunk: int, left_chunks: int
) -> dict[str, dict[str, float]]:
    """Stream each WAV through torch and each ONNX runner; per runner the largest differences
    of the encoder output and log-probs, and the share of frames whose best CTC token agrees."""
    reference = torch_step(loaded)
    report: dict[str, dict[str, float]] = {
        name: {"ys": 0.0, "log_probs": 0.0, "argmax_agreement": 1.0} for name in runners
    }
    for wav in wavs:
        audio = read_wav(wav, loaded.frontend.sample_rate).samples  # at the model's own rate
        fbank = torch.from_numpy(compute_fbank(audio, loaded.frontend))  # (T, n_mels)
        want_ys, want_logp = stream_through_pool(reference, loaded, fbank, chunk, left_chunks)
        for name, runner in runners.items():
            ys, logp = stream_through_pool(runner.step, loaded, fbank, chunk, left_chunks)
            entry = report[name]
            entry["ys"] = max(entry["ys"], _max_abs(ys, want_ys))
            entry["log_probs"] = max(entry["log_probs"], _max_abs(logp, want_logp))
            agreement = float((logp.argmax(-1) == want_logp.argmax(-1)).float().mean())
            entry["argmax_agreement"] = min(entry["argmax_agreement"], agreement)
    return report


def check_decoder(loaded: LoadedModel, runner: OrtDecoderRunner) -> dict[str, float]:
    """Largest |ONNX - torch| of the decoder log-probs over random hypotheses (valid rows only)."""
    graph = DecoderGraph(loaded).eval()
    errors: dict[str, float] = {}
    for seed, (hyps, length, frames) in enumerate(((1, 3, 20), (10, 12, 90))):
        example = _decoder_example(loaded, hyps, length, frames, seed + 1)
        with torch.no_grad():
            want = graph(*example)
        got = runner(*example)
        lens = example[3]
        valid = (torch.arange(length).unsqueeze(0) < lens.unsqueeze(1)).unsqueeze(-1)  # (N, L, 1)
        for name, a, b in zip(("l2r", "r2l"), got, want, strict=False):
            errors[name] = max(errors.get(name, 0.0), _max_abs(a * valid, b * valid))
    return errors


def check_testset(
    loaded: LoadedModel, runners: dict[str, OrtChunkRunner], testset: Path, chunk: int, left_chunks: int
) -> dict[str, object]:
    """Streaming CTC-greedy CER of torch and each ONNX runner on a test set (WAVs + ``text``).

    Same chunking and cache window for all, so the differences are the runtime's (INT8 vs fp32).
    """
    from deploy.bench.accuracy import read_testset

    steps: dict[str, ChunkStepFn] = {"torch": torch_step(loaded), **{name: r.step for name, r in runners.items()}}
    errors = dict.fromkeys(steps, 0)
    items = read_testset(testset, loaded.frontend)
    ref_chars = sum(len(scoring_text(text)) for _, text, _ in items)
    for _, text, fbank in items:
        for name, step in steps.items():
            _, log_probs = stream_through_pool(step, loaded, torch.from_numpy(fbank), chunk, left_chunks)
            best = log_probs.argmax(-1).tolist()
            tokens = [t for i, t in enumerate(best) if t != loaded.blank_id and (i == 0 or t != best[i - 1])]
            errors[name] += char_errors(tokens_to_text(tokens, loaded.units), text)[0]
    cer = {name: round(count / max(ref_chars, 1), 4) for name, count in errors.items()}
    return {
        "utterances": len(items),
        "reference_chars": ref_chars,
        "cer_greedy": cer,
        "cer_change_points": {name: round(100 * (value - cer["torch"]), 2) for name, value in cer.items()},
    }


def check_all(
    model_dir: Path,
    out_dir: Path,
    wavs: Sequence[Path],
    chunk: int,
    left_chunks: int,
    threads: int,
    testset: Path | None = None,
) -> dict[str, object]:
    """Compare every exported graph in `out_dir` with the torch model; JSON-ready report."""
    torch.set_num_threads(threads)
    loaded = load_wenet_model(model_dir)
    fp32 = OrtChunkRunner(out_dir / ENCODER_FILE, threads)
    runners = {"fp32": fp32}
    if (out_dir / ENCODER_INT8_FILE).is_file():
        runners["int8"] = OrtChunkRunner(out_dir / ENCODER_INT8_FILE, threads)
    report: dict[str, object] = {
        "cpu": cpu_isa.detect().level,
        "int8_mode": runners["int8"].int8_mode if "int8" in runners else None,
        "random_fp32": check_random(loaded, fp32),
        "decoder": check_decoder(loaded, OrtDecoderRunner(out_dir / DECODER_FILE, threads)),
    }
    if wavs:
        report["audio"] = {
            "chunk": chunk,
            "left_chunks": left_chunks,
            "wavs": [Path(w).name for w in wavs],
            **check_audio(loaded, runners, wavs, chunk, left_chunks),
        }
    if testset is not None:
        report["testset"] = {"path": str(testset), **check_testset(loaded, runners, testset, chunk, left_chunks)}
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.export.onnx_export", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("export", "check"), default="export")
    parser.add_argument("--model", type=Path, required=True, help="WeNet model dir (train.yaml, final.pt, ...)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the .onnx files")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    parser.add_argument("--no-int8", action="store_true", help="skip the INT8 encoder")
    parser.add_argument(
        "--int8-mode",
        choices=("auto", *INT8_MODES),
        default="auto",
        help="INT8 weights: u8s8 (fast, for VNNI/AMX CPUs), u8s8-reduce-range (7-bit weights, accurate on "
        "AVX2/AVX-512 without VNNI), u8u8; auto: the accurate one for this machine's CPU",
    )
    parser.add_argument("--wav", type=Path, nargs="*", default=[], help="check: 16 kHz WAVs streamed through both")
    parser.add_argument("--testset", type=Path, help="check: dir of WAVs + `text`; streaming greedy CER per runtime")
    parser.add_argument("--chunk", type=int, default=16, help="check: chunk size in encoder frames")
    parser.add_argument("--left-chunks", type=int, default=4, help="check: cached chunks of left context")
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime threads")
    args = parser.parse_args(argv)
    if args.command == "export":
        result: dict[str, object] = dict(export_all(args.model, args.out, args.opset, not args.no_int8, args.int8_mode))
    else:
        result = check_all(args.model, args.out, args.wav, args.chunk, args.left_chunks, args.threads, args.testset)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
