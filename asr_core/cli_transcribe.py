"""``asr-transcribe``: transcribe WAV files with a WeNet U2++ model, full context or simulated
streaming, the quickest way to try a model and to diff our arrays against WeNet's.

    asr-transcribe a.wav b.wav --model DIR --chunk-ms 320 --left-chunks -1 --mode rescore --json

Modes: ``greedy`` (CTC best path), ``prefix_beam`` (CTC n-best), ``rescore`` (WeNet's attention
rescoring of the CTC n-best, the default, as the serving engine's finals by default) and
``joint`` (the n-best plus the attention decoder's own beam search, rescored together, as the
serving engine's finals with ``engine.attention_beam`` > 0 or a route's ``attention_beam``;
see ``asr_core/finals.py``).

Exit status: 0 on success, 2 when an input (WAV file, model directory, option) is unusable;
the message is one line on stderr (``--debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr_common.itn import normalize_numbers
from asr_core.audio_io import AudioError, read_wav
from asr_core.context_graph import DEFAULT_BONUS, ContextGraph, HotwordsError, load_graph
from asr_core.ctc_search import ctc_greedy_batch, ctc_prefix_beam_search, ctc_topk
from asr_core.finals import FinalRequest, FinalSearch, FinalSettings
from asr_core.frontend import compute_fbank
from asr_core.model.loader import LoadedModel, ModelLoadError, load_wenet_model
from asr_core.offline import encode_full, encode_streaming
from asr_core.tokens import tokens_to_text
from rescoring.attention import attention_rescore

CHUNK_MS_CHOICES = ("160", "240", "320", "640", "full")
MODES = ("greedy", "prefix_beam", "rescore", "joint")
MODEL_DIR_ENV = "ASR_MODEL_DIR"
DEMO_MODEL_DIR = Path(__file__).resolve().parent / "demo_model"
FBANK_SHIFT_MS = 10


class UsageError(Exception):
    """An input the user must fix; reported as one line, exit status 2."""


@dataclass
class Transcript:
    """Result for one file, as printed with ``--json``."""

    file: str
    text: str
    tokens: list[int]
    nbest: list[dict[str, Any]]
    mode: str
    chunk_ms: int | str
    left_chunks: int
    duration_s: float
    rtf: float
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "text": self.text,
            **({"text_raw": self.nbest[0]["text_raw"]} if self.nbest and "text_raw" in self.nbest[0] else {}),
            "tokens": self.tokens,
            "nbest": self.nbest,
            "mode": self.mode,
            "chunk_ms": self.chunk_ms,
            "left_chunks": self.left_chunks,
            "duration_s": round(self.duration_s, 4),
            "rtf": round(self.rtf, 5),
        }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr-transcribe",
        description="Transcribe 16 kHz (or 8 kHz) 16-bit mono WAV files with a WeNet U2++ model.",
    )
    parser.add_argument("wavs", nargs="+", metavar="WAV", help="input files")
    parser.add_argument(
        "--model",
        help=f"WeNet model directory (train.yaml, final.pt, units.txt, global_cmvn); "
        f"default: ${MODEL_DIR_ENV}, else the bundled demo model",
    )
    parser.add_argument(
        "--chunk-ms",
        choices=CHUNK_MS_CHOICES,
        default="full",
        help="streaming chunk in ms (160 ms = 4 encoder frames) or 'full' context (default)",
    )
    parser.add_argument(
        "--left-chunks",
        type=int,
        default=-1,
        help="chunks of attention history kept when streaming; -1 keeps all (default)",
    )
    parser.add_argument("--mode", choices=MODES, default="rescore", help="decoding (default: rescore)")
    parser.add_argument("--beam", type=int, default=10, help="prefix beam size (default: 10)")
    parser.add_argument(
        "--attention-beam", type=int, default=4, help="joint mode: attention decoder proposals (default: 4)"
    )
    parser.add_argument("--nbest", type=int, default=None, help="n-best entries to print (default: all)")
    parser.add_argument("--ctc-weight", type=float, default=0.5, help="rescoring CTC weight (default: 0.5)")
    parser.add_argument("--reverse-weight", type=float, default=0.3, help="rescoring R2L weight (default: 0.3)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--json", action="store_true", help="one JSON object per file per line")
    parser.add_argument(
        "--hotwords", metavar="FILE",
        help="phrase list to bias the CTC search towards: one phrase per line, optional ' :BOOST' "
        f"(log-domain bonus per token, default {DEFAULT_BONUS}); modes prefix_beam, rescore, joint",
    )  # fmt: skip
    parser.add_argument(
        "--itn", action="store_true",
        help="spoken numbers in digits (新华路十二号 -> 新华路12号); JSON keeps the spoken form in text_raw",
    )  # fmt: skip
    parser.add_argument("--dump-npz", metavar="PATH", help="write intermediate arrays under the fixture's names")
    parser.add_argument("--debug", action="store_true", help="print tracebacks")
    return parser


def resolve_model_dir(arg: str | None) -> Path:
    """--model, else $ASR_MODEL_DIR, else the bundled demo model."""
    if arg:
        return Path(arg)
    env = os.environ.get(MODEL_DIR_ENV)
    if env:
        return Path(env)
    if DEMO_MODEL_DIR.is_dir():
        return DEMO_MODEL_DIR
    raise UsageError(f"no model: pass --model DIR or set {MODEL_DIR_ENV} to a WeNet model directory")


def setting_name(chunk_frames: int | None, left_chunks: int) -> str:
    """The fixture's array-name suffix: ``full`` or ``stream_c<C>_l<L>``."""
    return "full" if chunk_frames is None else f"stream_c{chunk_frames}_l{left_chunks}"


def chunk_frames_for(chunk_ms: str, subsampling: int) -> int | None:
    """Encoder frames per chunk: 160 ms with 4x subsampling of 10 ms frames = 4."""
    if chunk_ms == "full":
        return None
    frames, rest = divmod(int(chunk_ms), FBANK_SHIFT_MS * subsampling)
    if rest or frames <= 0:
        raise UsageError(f"--chunk-ms {chunk_ms} is not a multiple of {FBANK_SHIFT_MS * subsampling} ms")
    return frames


class Transcriber:
    """Runs fbank -> encoder -> CTC search (-> rescoring) on one file at a time."""

    def __init__(self, loaded: LoadedModel, args: argparse.Namespace) -> None:
        self.loaded = loaded
        self.args = args
        self.chunk_frames = chunk_frames_for(args.chunk_ms, loaded.subsampling)
        self.setting = setting_name(self.chunk_frames, args.left_chunks)
        self.context: ContextGraph | None = None
        if args.hotwords:
            self.context = load_graph(args.hotwords, loaded.units)

    def transcribe(self, path: str) -> Transcript:
        args, loaded = self.args, self.loaded
        audio = read_wav(path, loaded.frontend.sample_rate)
        if audio.resampled:
            print(f"{path}: resampled from {audio.source_rate} Hz to {audio.rate} Hz", file=sys.stderr)
        started = time.perf_counter()
        device = torch.device(args.device)
        fbank = torch.from_numpy(compute_fbank(audio.samples, loaded.frontend)).to(device)  # (T, n_mels)
        with torch.inference_mode():
            if self.chunk_frames is None:
                enc = encode_full(loaded, fbank)  # (T_enc, D)
            else:
                enc, _ = encode_streaming(loaded, fbank, self.chunk_frames, args.left_chunks)
            log_probs = loaded.model.ctc_log_probs(enc[None])[0]  # (T_enc, V)
        arrays = {"fbank": fbank, f"encoder_out_{self.setting}": enc, f"ctc_logprobs_{self.setting}": log_probs}
        nbest = self._search(enc, log_probs, arrays)
        elapsed = time.perf_counter() - started
        limit = args.nbest if args.nbest is not None else len(nbest)
        return Transcript(
            file=path,
            text=nbest[0]["text"],
            tokens=nbest[0]["tokens"],
            nbest=nbest[:limit],
            mode=args.mode,
            chunk_ms=args.chunk_ms if args.chunk_ms == "full" else int(args.chunk_ms),
            left_chunks=args.left_chunks,
            duration_s=audio.duration_s,
            rtf=elapsed / audio.duration_s,
            arrays={name: value.detach().float().cpu().numpy() for name, value in arrays.items()},
        )

    def _search(
        self, enc: torch.Tensor, log_probs: torch.Tensor, arrays: dict[str, torch.Tensor]
    ) -> list[dict[str, Any]]:
        args, loaded = self.args, self.loaded
        lp = log_probs.float().cpu()
        if args.mode == "greedy":
            tokens = ctc_greedy_batch(lp[None], torch.tensor([lp.shape[0]]), blank=loaded.blank_id)[0]
            best_path = float(lp.max(-1).values.double().sum())
            return [self._entry(tokens, best_path)]
        if args.mode == "joint":
            return self._joint(enc, lp)
        hyps = ctc_prefix_beam_search(lp, beam=args.beam, blank=loaded.blank_id, context=self.context)
        if args.mode == "prefix_beam":
            return [self._entry(h.tokens, h.score) for h in hyps]
        # The padded decoder call (one row per hypothesis), whose outputs are the arrays WeNet's
        # reference dumps; the hook keeps them.
        captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        decoder = loaded.model.decoder
        hook = decoder.register_forward_hook(lambda _module, _args, output: captured.append(output))
        try:
            (result,) = attention_rescore(
                decoder,
                [enc],
                [hyps],
                bonuses=[[h.context_score for h in hyps]] if self.context is not None else None,
                sos=loaded.sos_id,
                eos=loaded.eos_id,
                ctc_weight=args.ctc_weight,
                reverse_weight=args.reverse_weight,
                prefix_tree=False,
            )
        finally:
            hook.remove()
        l2r, r2l = captured[0]
        arrays[f"decoder_logprobs_l2r_{self.setting}"] = l2r
        if r2l.numel():
            arrays[f"decoder_logprobs_r2l_{self.setting}"] = r2l
        return [
            self._entry(h.tokens, h.score, ctc_score=h.ctc_score, l2r_score=h.l2r_score, r2l_score=h.r2l_score)
            for h in result.hypotheses
        ]

    def _joint(self, enc: torch.Tensor, log_probs: torch.Tensor) -> list[dict[str, Any]]:
        """The engine's finals search (``FinalSearch``) on the utterance's top-k posteriors."""
        args, loaded = self.args, self.loaded
        settings = FinalSettings.for_model(
            loaded, beam=args.beam, ctc_weight=args.ctc_weight, reverse_weight=args.reverse_weight,
            attention_beam=args.attention_beam,
        )  # fmt: skip
        values, ids = ctc_topk(log_probs, args.beam)
        (result,) = FinalSearch(loaded.model.decoder, settings).run(
            [FinalRequest(values, ids, enc.float().cpu(), self.context)]
        )
        if result.rescored is None:  # nothing decoded
            return [self._entry(h.tokens, h.score) for h in result.nbest] or [self._entry((), 0.0)]
        return [
            self._entry(h.tokens, h.score, ctc_score=h.ctc_score, l2r_score=h.l2r_score, r2l_score=h.r2l_score)
            for h in result.rescored.hypotheses
        ]

    def _entry(self, tokens: Sequence[int], score: float, **extra: float) -> dict[str, Any]:
        text = tokens_to_text(tokens, self.loaded.units)
        entry: dict[str, Any] = {"tokens": list(tokens), "text": text, "score": round(score, 6)}
        if self.args.itn:
            entry["text"], entry["text_raw"] = normalize_numbers(text).text, text
        entry.update({name: round(value, 6) for name, value in extra.items()})
        return entry


def _validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.left_chunks < -1 or args.left_chunks == 0:
        parser.error("--left-chunks must be a positive number of chunks, or -1 for all history")
    if args.beam < 1:
        parser.error("--beam must be at least 1")
    if args.nbest is not None and args.nbest < 1:
        parser.error("--nbest must be at least 1")
    if args.attention_beam < 0:
        parser.error("--attention-beam must be 0 (no proposals) or more")
    if not 0.0 <= args.reverse_weight <= 1.0:
        parser.error("--reverse-weight must be between 0 and 1")
    if args.threads < 0:
        parser.error("--threads must be 0 (torch's choice) or more")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device}: not a torch device (e.g. cpu, cuda, cuda:1)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine; use --device cpu")


def _dump_key(path: str, name: str) -> str:
    return f"{Path(path).stem}__{name}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _validate(args, parser)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        loaded = load_wenet_model(resolve_model_dir(args.model), device=args.device)
        transcriber = Transcriber(loaded, args)
    except (UsageError, ModelLoadError, HotwordsError) as exc:
        return _fail(exc, args.debug)
    status = 0
    dump: dict[str, np.ndarray] = {}
    for path in args.wavs:
        try:
            result = transcriber.transcribe(path)
        except AudioError as exc:
            status = _fail(exc, args.debug)
            continue
        except Exception as exc:  # a bug, not a bad input: say so, keep the traceback behind --debug
            if args.debug:
                raise
            print(f"asr-transcribe: internal error on {path}: {exc!r} (rerun with --debug)", file=sys.stderr)
            return 1
        dump.update({_dump_key(path, name): value for name, value in result.arrays.items()})
        if args.json:
            print(json.dumps(result.as_json(), ensure_ascii=False), flush=True)
        else:
            print(f"{result.file}\t{result.text}", flush=True)
    if args.dump_npz and dump:
        try:
            np.savez(args.dump_npz, **dump)  # type: ignore[arg-type]  # numpy stubs type **kwds as allow_pickle
        except OSError as exc:
            return _fail(UsageError(f"--dump-npz {args.dump_npz}: cannot write ({exc.strerror or exc})"), args.debug)
    return status


def _fail(exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    message = " ".join(str(exc).split())  # one line, whatever the exception held
    print(f"asr-transcribe: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
