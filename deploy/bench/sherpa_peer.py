"""Peer benchmark: sherpa-onnx's streaming WeNet CTC recognizer vs our engine, same model and audio.

    python -m deploy.bench.sherpa_peer --arch aishell --streams N --seconds S
    python -m deploy.bench.sherpa_peer --arch aishell --find-max [--no-ours]

The model (random weights of the chosen shape, blank-calibrated as in ``asr-bench engine``, or
``--model DIR``) is exported with ``asr-export sherpa-onnx`` and run by sherpa-onnx's
``OnlineRecognizer`` with the same chunk size and left chunks. N streams get 20 ms pieces of
the same synthetic speech at real-time pace (staggered over one chunk); one decoder thread
calls ``decode_streams`` on every ready stream. A chunk's latency runs from the arrival of its
last sample to the end of the ``decode_streams`` call that decoded it. A load passes with the
same rule as ``asr-bench engine --find-max`` (p95 <= 300 ms, no chunk later than 1 s, no backlog
at the end).
``--find-max`` searches both the largest passing N for sherpa-onnx and (unless ``--no-ours``)
for our engine with ``--backend`` (default ``onnxruntime``: the runtime sherpa-onnx uses, so the
comparison is batching against one-stream-at-a-time on equal kernels), and prints one JSON object
with both and their ratio. With ``--streams N`` both run N streams once and the JSON also gives
each one's CPU seconds per audio second (``cpu_rtf`` / ``rtf``) and their ratio: the compute cost
per stream, which a busy shared machine distorts less than the real-time search.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr_core.backends import BACKENDS
from asr_core.model.loader import LoadedModel, load_wenet_model
from deploy.bench.engine_bench import (
    BLANK_RATE,
    LATENCY_LIMIT_MS,
    Trial,
    calibrate_ctc,
    find_max,
    largest_passing,
    run_trial,
    synthetic_speech,
)
from deploy.export.sherpa import MODEL_FILE, TOKENS_FILE, export_sherpa_model, write_tokens

PIECE_SAMPLES = 320  # both recognisers get 20 ms pieces at 16 kHz: one RTP packet each
PIECE_S = PIECE_SAMPLES / 16000
OURS_KEYS = ("realtime_ok", "rtf", "partial_latency_ms", "batch_size_mean", "forward_ms_mean", "drain_s")
FBANK_SHIFT_SAMPLES = 160
FBANK_FIRST_FRAME_END = 280
"""sherpa-onnx's fbank (snip_edges off): frame j is complete once 160*j + 280 samples arrived.
Its ``is_ready`` wants one frame beyond the chunk's last (measured: 1 s gives 5 chunks of 160 ms)."""


@dataclass(frozen=True)
class PeerTrial:
    streams: int
    seconds: float
    chunk: int  # encoder frames per chunk
    left_chunks: int
    threads: int


def _chunk_ready_sample(chunk_index: int, chunk: int, subsampling: int, right_context: int) -> int:
    """Samples a stream needs before sherpa-onnx can decode its chunk ``chunk_index``."""
    frames = chunk_index * chunk * subsampling + (chunk - 1) * subsampling + right_context + 1
    return frames * FBANK_SHIFT_SAMPLES + FBANK_FIRST_FRAME_END


def run_peer_trial(
    make_recognizer: Callable[[], Any], loaded: LoadedModel, trial: PeerTrial, audio: np.ndarray
) -> dict[str, Any]:
    """One load level on sherpa-onnx; returns latency percentiles and whether it kept up."""
    recognizer = make_recognizer()
    streams = [recognizer.create_stream() for _ in range(trial.streams)]
    floats = audio.astype(np.float32) / 32768.0
    pieces_total = int(trial.seconds / PIECE_S)
    audio_pieces = len(audio) // PIECE_SAMPLES
    starts = np.linspace(0, audio_pieces, num=trial.streams, endpoint=False).astype(int)
    stagger = np.linspace(0, trial.chunk * loaded.subsampling * 0.01, num=trial.streams, endpoint=False)
    fed = np.zeros(trial.streams, dtype=np.int64)  # pieces fed per stream
    piece_time: list[list[float]] = [[] for _ in range(trial.streams)]
    decoded = np.zeros(trial.streams, dtype=np.int64)  # chunks decoded per stream
    latencies: list[float] = []
    lock = threading.Lock()
    feeding_done = threading.Event()
    calls = [0]

    def decode_loop() -> None:
        while True:
            with lock:
                ready = [i for i, s in enumerate(streams) if recognizer.is_ready(s)]
            if not ready:
                if feeding_done.is_set():
                    return
                time.sleep(0.002)
                continue
            recognizer.decode_streams([streams[i] for i in ready])
            calls[0] += 1
            done = time.monotonic()
            for i in ready:
                need = _chunk_ready_sample(int(decoded[i]), trial.chunk, loaded.subsampling, loaded.right_context)
                piece = min(need // PIECE_SAMPLES, len(piece_time[i]) - 1)
                latencies.append((done - piece_time[i][piece]) * 1000.0)
                decoded[i] += 1

    cpu0 = time.process_time()
    decoder = threading.Thread(target=decode_loop, name="sherpa-decode")
    decoder.start()
    wall0 = time.monotonic()
    latency_mark = 0
    while True:
        now = time.monotonic() - wall0
        due = np.minimum(np.floor((now - stagger) / PIECE_S).astype(np.int64) + 1, pieces_total)
        for i in np.nonzero(due > fed)[0].tolist():
            for k in range(int(fed[i]), int(due[i])):
                j = (starts[i] + k) % audio_pieces
                with lock:
                    streams[i].accept_waveform(16000, floats[j * PIECE_SAMPLES : (j + 1) * PIECE_SAMPLES])
                piece_time[i].append(time.monotonic())
            fed[i] = due[i]
        if not latency_mark and now >= 0.75 * trial.seconds:
            latency_mark = len(latencies)
        if (fed >= pieces_total).all():
            break
        time.sleep(0.004)
    feed_end = time.monotonic()
    feeding_done.set()
    decoder.join()
    wall = time.monotonic() - wall0
    tail = latencies[latency_mark:] or latencies[len(latencies) * 3 // 4 :]
    drain_s = wall - (feed_end - wall0)
    p95 = float(np.percentile(tail, 95)) if tail else float("nan")
    chunk_limit_ms = max(1000.0, 3 * trial.chunk * loaded.subsampling * 10.0)
    keeps_up = bool(tail) and max(tail) <= chunk_limit_ms and drain_s < 2.0
    return {
        "streams": trial.streams,
        "realtime_ok": keeps_up and p95 <= LATENCY_LIMIT_MS,
        "chunks": int(decoded.sum()),
        "decode_calls": calls[0],
        "chunk_latency_ms": {f"p{q}": round(float(np.percentile(tail, q)), 2) if tail else None for q in (50, 95, 99)},
        "drain_s": round(drain_s, 3),
        "cpu_rtf": round((time.process_time() - cpu0) / (trial.streams * pieces_total * PIECE_S), 4),
    }


def find_peer_max(
    make_recognizer: Callable[[], Any], loaded: LoadedModel, base: PeerTrial, audio: np.ndarray, start: int
) -> tuple[int, list[dict[str, Any]]]:
    """Largest passing stream count: doubling, then bisection to within ~10 %."""
    trials: list[dict[str, Any]] = []

    def attempt(n: int) -> bool:
        result = run_peer_trial(make_recognizer, loaded, PeerTrial(**{**base.__dict__, "streams": n}), audio)
        trials.append(result)
        print(
            json.dumps({"peer_trial": n, "ok": result["realtime_ok"], "p95": result["chunk_latency_ms"]["p95"]}),
            file=sys.stderr,
        )
        return bool(result["realtime_ok"])

    return largest_passing(attempt, start), trials


def _load(args: argparse.Namespace, workdir: Path, audio: np.ndarray) -> LoadedModel:
    if args.model:
        return load_wenet_model(args.model)
    from deploy.bench.make_random_model import make_random_model

    make_random_model(args.arch, workdir / "model", seed=0)
    loaded = load_wenet_model(workdir / "model")
    calibrate_ctc(loaded, audio, args.blank_rate, chunk_ms=args.chunk_ms, left_chunks=args.left_chunks)
    return loaded


def ours_trial(args: argparse.Namespace, streams: int) -> Trial:
    """Our engine's trial with the peer's load settings (pieces of audio included) and the
    command's engine options."""
    return Trial(
        streams, args.seconds, args.chunk_ms, args.left_chunks, max_batch=64, max_wait_ms=args.max_wait_ms,
        fast=False, backend=args.backend, rescore=args.rescore, piece_ms=PIECE_SAMPLES // 16,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.sherpa_peer", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", type=Path, help="WeNet model directory")
    source.add_argument("--arch", choices=["aishell", "wenetspeech", "small"], default="aishell")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--streams", type=int, default=8)
    load.add_argument("--find-max", action="store_true", help="search the largest real-time stream count")
    parser.add_argument("--start", type=int, default=4, help="first stream count tried by --find-max")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--chunk-ms", type=int, default=160, choices=[160, 240, 320, 640])
    parser.add_argument("--left-chunks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="sherpa-onnx and torch threads")
    parser.add_argument(
        "--blank-rate",
        type=float,
        default=BLANK_RATE,
        help="share of frames the random model is calibrated to decode as blank (asr-bench engine --blank-rate)",
    )
    parser.add_argument("--no-ours", action="store_true", help="with --find-max: skip our engine's search")
    parser.add_argument("--backend", default="onnxruntime", choices=list(BACKENDS), help="our engine's backend")
    parser.add_argument(
        "--no-rescore",
        dest="rescore",
        action="store_false",
        help="our finals without attention rescoring (sherpa-onnx's WeNet CTC path has no attention decoder)",
    )
    parser.add_argument(
        "--max-wait-ms", type=float, default=80.0, help="our engine's batching wait (asr-bench engine --max-wait-ms)"
    )
    args = parser.parse_args(argv)
    try:
        import sherpa_onnx
    except ModuleNotFoundError:
        parser.error("sherpa-onnx is not installed: pip install sherpa-onnx")
    torch.set_num_threads(args.threads)
    audio = synthetic_speech(30.0, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        loaded = _load(args, workdir, audio)
        chunk = args.chunk_ms // (10 * loaded.subsampling)
        export_sherpa_model(loaded, workdir / MODEL_FILE, chunk, args.left_chunks)
        write_tokens(loaded, workdir / TOKENS_FILE)

        def make_recognizer() -> Any:
            return sherpa_onnx.OnlineRecognizer.from_wenet_ctc(
                tokens=str(workdir / TOKENS_FILE),
                model=str(workdir / MODEL_FILE),
                chunk_size=chunk,
                num_left_chunks=args.left_chunks,
                num_threads=args.threads,
            )

        base = PeerTrial(args.streams, args.seconds, chunk, args.left_chunks, args.threads)
        header = {
            "arch": None if args.model else args.arch,
            "model": str(args.model) if args.model else None,
            "chunk_ms": args.chunk_ms,
            "left_chunks": args.left_chunks,
            "seconds": args.seconds,
            "threads": args.threads,
            "sherpa_onnx_version": getattr(sherpa_onnx, "__version__", None),
        }
        if not args.find_max:
            peer = run_peer_trial(make_recognizer, loaded, base, audio)
            result: dict[str, Any] = {**header, "sherpa_onnx": peer}
            if not args.no_ours:
                ours = run_trial(loaded, ours_trial(args, args.streams), "cpu", audio)
                result["ours_backend"] = args.backend
                result["ours_rescore"] = args.rescore
                result["ours"] = {key: ours[key] for key in OURS_KEYS}
                result["cpu_per_stream_ratio"] = round(peer["cpu_rtf"] / ours["rtf"], 2) if ours["rtf"] else None
            print(json.dumps(result))
            return 0
        peer_max, peer_trials = find_peer_max(make_recognizer, loaded, base, audio, args.start)
    result = {
        **header,
        "sherpa_onnx_max_realtime_streams": peer_max,
        "sherpa_onnx_best": next((t for t in peer_trials if t["streams"] == peer_max), None),
    }
    if not args.no_ours:
        ours_max, _ = find_max(loaded, ours_trial(args, 8), "cpu", audio, max(8, peer_max))
        result["ours_backend"] = args.backend
        result["ours_rescore"] = args.rescore
        result["ours_max_realtime_streams"] = ours_max
        result["ours_vs_sherpa_onnx"] = round(ours_max / peer_max, 2) if peer_max else None
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
