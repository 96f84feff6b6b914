"""Peer benchmark: sherpa-onnx's streaming WeNet CTC recognizer vs our engine, same model and audio.

    python -m deploy.bench.sherpa_peer --arch aishell --streams N --seconds S
    python -m deploy.bench.sherpa_peer --arch aishell --find-max [--no-ours]
    python -m deploy.bench.sherpa_peer --find-max --int8 --workers 1 2 --backend torch-int8 --step-threads 1 2

The model (random weights of the chosen shape, blank-calibrated as in ``asr-bench engine``, or
``--model DIR``) is exported with ``asr-export sherpa-onnx`` and run by sherpa-onnx's
``OnlineRecognizer`` with the same chunk size and left chunks (``--int8``: the INT8 export,
against our INT8 backend). N streams get 20 ms pieces of the same synthetic speech at
real-time pace (staggered over one chunk); ``--workers N`` decode threads (the pool of
sherpa-onnx's own server) each take the ready streams no other worker holds (all of them, or
the ``--max-batch`` whose chunks came first) and call ``decode_streams`` on them. sherpa-onnx
decodes the streams of one call one after another, so all of them is not what its server does
(it takes 3) and makes this harness's peer figure lower than ../shared/peers/sherpa_bench.py's
at the same load. A chunk's latency runs from the arrival of its
last sample to the end of the ``decode_streams`` call that decoded it. A load passes by the
rule ``asr-bench engine --find-max`` applies (``engine_bench.meets_latency_rule``: p95 <= 300 ms
and no chunk later than 1 s over the last quarter) and, here, no backlog at the end.
``--find-max`` searches the largest passing N for sherpa-onnx at each ``--workers`` count and
(unless ``--no-ours``) for our engine at each ``--backend`` x ``--step-threads`` (default
backend ``onnxruntime``, or ``torch-int8`` with ``--int8``), and prints one JSON object with
every configuration's maximum and the cores it used there, each engine's best and the ratio
of the bests. With
``--streams N`` both run N streams once and the JSON also gives
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

from asr_common import allocator
from asr_core import cpu_isa
from asr_core.backends import BACKENDS
from asr_core.backends.onnx_graph import int8_mode_for, quantize_int8
from asr_core.model.loader import LoadedModel, load_wenet_model
from deploy.bench.bench_input import BLANK_RATE, calibrate_ctc, synthetic_speech
from deploy.bench.engine_bench import Trial, find_max, largest_passing, meets_latency_rule, run_trial
from deploy.export.sherpa import MODEL_FILE, MODEL_INT8_FILE, TOKENS_FILE, export_sherpa_model, write_tokens

PIECE_SAMPLES = 320  # both recognisers get 20 ms pieces at 16 kHz: one RTP packet each
PIECE_S = PIECE_SAMPLES / 16000
OURS_KEYS = (
    "realtime_ok", "latency_rule_ok", "rtf", "cores_used", "partial_latency_ms", "tail_partial_latency_ms",
    "batch_size_mean", "forward_ms_mean", "drain_s",
)  # fmt: skip
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
    workers: int = 1
    max_batch: int | None = None
    """Streams per ``decode_streams`` call: None takes every ready stream no other worker holds;
    3 is what sherpa-onnx's own server (``--max-batch-size``) and ../shared/peers/sherpa_bench.py
    take. sherpa-onnx's WeNet CTC model decodes the streams of one call one after another, so
    every stream of a large call waits for the whole call."""


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
    held: set[int] = set()  # streams a worker is decoding

    def decode_loop() -> None:
        while True:
            with lock:
                ready = [i for i, s in enumerate(streams) if i not in held and recognizer.is_ready(s)]
                ready = sorted(ready, key=lambda i: (decoded[i], i))[: trial.max_batch]  # oldest chunk first
                held.update(ready)
            if not ready:
                if feeding_done.is_set() and not held:
                    return
                time.sleep(0.002)
                continue
            recognizer.decode_streams([streams[i] for i in ready])
            done = time.monotonic()
            with lock:
                calls[0] += 1
                for i in ready:
                    need = _chunk_ready_sample(int(decoded[i]), trial.chunk, loaded.subsampling, loaded.right_context)
                    piece = min(need // PIECE_SAMPLES, len(piece_time[i]) - 1)
                    latencies.append((done - piece_time[i][piece]) * 1000.0)
                    decoded[i] += 1
                held.difference_update(ready)

    cpu0 = time.process_time()
    workers = [threading.Thread(target=decode_loop, name=f"sherpa-decode-{n}") for n in range(max(1, trial.workers))]
    for worker in workers:
        worker.start()
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
    for worker in workers:
        worker.join()
    wall = time.monotonic() - wall0
    cpu = time.process_time() - cpu0
    tail = latencies[latency_mark:] or latencies[len(latencies) * 3 // 4 :]
    drain_s = wall - (feed_end - wall0)
    chunk_ms = trial.chunk * loaded.subsampling * 10
    return {
        "streams": trial.streams,
        "workers": trial.workers,
        "realtime_ok": meets_latency_rule(tail, chunk_ms) and drain_s < 2.0,
        "chunks": int(decoded.sum()),
        "decode_calls": calls[0],
        "chunk_latency_ms": {f"p{q}": round(float(np.percentile(tail, q)), 2) if tail else None for q in (50, 95, 99)},
        "drain_s": round(drain_s, 3),
        "cpu_rtf": round(cpu / (trial.streams * pieces_total * PIECE_S), 4),
        "cores_used": round(cpu / wall, 2),
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
            json.dumps(
                {
                    "peer_trial": n,
                    "ok": result["realtime_ok"],
                    "p95": result["chunk_latency_ms"]["p95"],
                    "cores": result["cores_used"],
                }
            ),
            file=sys.stderr,
        )
        return bool(result["realtime_ok"])

    return largest_passing(attempt, start), trials


def make_recognizer_factory(
    export_dir: Path, model_file: str, chunk: int, left_chunks: int, threads: int
) -> Callable[[], Any]:
    """A maker of sherpa-onnx recognizers for an ``asr-export sherpa-onnx`` directory (a fresh one
    per trial: no state carries from one load level to the next)."""
    import sherpa_onnx

    def make() -> Any:
        return sherpa_onnx.OnlineRecognizer.from_wenet_ctc(
            tokens=str(export_dir / TOKENS_FILE),
            model=str(export_dir / model_file),
            chunk_size=chunk,
            num_left_chunks=left_chunks,
            num_threads=threads,
        )

    return make


def _load(args: argparse.Namespace, workdir: Path, audio: np.ndarray) -> LoadedModel:
    if args.model:
        return load_wenet_model(args.model)
    from deploy.bench.make_random_model import make_random_model

    make_random_model(args.arch, workdir / "model", seed=0)
    loaded = load_wenet_model(workdir / "model")
    calibrate_ctc(loaded, audio, args.blank_rate, chunk_ms=args.chunk_ms, left_chunks=args.left_chunks)
    return loaded


def ours_trial(
    args: argparse.Namespace, streams: int, backend: str, step_threads: int = 1, schedulers: int = 1
) -> Trial:
    """Our engine's trial with the peer's load settings (pieces of audio included) and the
    command's engine options."""
    return Trial(
        streams, args.seconds, args.chunk_ms, args.left_chunks, max_batch=64, max_wait_ms=args.max_wait_ms,
        fast=False, backend=backend, rescore=args.rescore, piece_ms=PIECE_SAMPLES // 16, step_threads=step_threads,
        schedulers=schedulers,
    )  # fmt: skip


def config_name(backend: str, step_threads: int, schedulers: int) -> str:
    """How a configuration of ours is named in the report (schedulers only when not 1)."""
    name = f"{backend} step_threads={step_threads}"
    return name if schedulers == 1 else f"{name} schedulers={schedulers}"


def config_key(backend: str, step_threads: int, schedulers: int) -> str:
    """The report key of a configuration's single trial: its name with ``_`` for spaces and ``=``."""
    return "ours_" + config_name(backend, step_threads, schedulers).replace(" ", "_").replace("=", "_")


def best_of(maxima: dict[str, int]) -> tuple[str | None, int]:
    """The configuration with the most real-time streams (the first listed on a tie)."""
    if not maxima:
        return None, 0
    name = max(maxima, key=lambda key: maxima[key])
    return name, maxima[name]


def cores_at(trials: list[dict[str, Any]], streams: int) -> float | None:
    """CPU cores the measured trial of ``streams`` streams used (None when none ran: a max of 0)."""
    return next((t["cores_used"] for t in trials if t["streams"] == streams), None)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
    parser.add_argument(
        "--threads", type=int, default=1, help="ONNX Runtime threads per sherpa-onnx decode call, and torch's"
    )
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1], metavar="N",
        help="sherpa-onnx decode worker threads (its server's pool); several values: each is measured, "
        "the best reported (default: 1)",
    )  # fmt: skip
    parser.add_argument(
        "--max-batch", type=int, metavar="N",
        help="sherpa-onnx streams per decode_streams call (default: every ready stream; its server and "
        "../shared/peers/sherpa_bench.py: 3)",
    )  # fmt: skip
    parser.add_argument(
        "--int8", action="store_true",
        help="sherpa-onnx runs the INT8 export (asr-export sherpa-onnx --int8); our default backend becomes torch-int8",
    )  # fmt: skip
    parser.add_argument(
        "--blank-rate",
        type=float,
        default=BLANK_RATE,
        help="share of frames the random model is calibrated to decode as blank (asr-bench engine --blank-rate)",
    )
    parser.add_argument("--no-ours", action="store_true", help="skip our engine")
    parser.add_argument(
        "--backend", nargs="+", choices=list(BACKENDS), metavar="BACKEND",
        help="our engine's backend(s); several: each is measured, the best reported "
        "(default: onnxruntime, or torch-int8 with --int8)",
    )  # fmt: skip
    parser.add_argument(
        "--step-threads", type=int, nargs="+", default=[1], metavar="N",
        help="our engine's step threads (asr-bench engine --step-threads); several: each is measured",
    )  # fmt: skip
    parser.add_argument(
        "--schedulers", type=int, nargs="+", default=[1], metavar="N",
        help="our engine's scheduler threads (asr-bench engine --schedulers; the service's engine.schedulers); "
        "several: each is measured",
    )  # fmt: skip
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
    if min(args.workers) < 1 or min(args.step_threads) < 1 or min(args.schedulers) < 1 or args.threads < 1:
        parser.error("--workers, --step-threads, --schedulers and --threads take counts of at least 1")
    if args.max_batch is not None and args.max_batch < 1:
        parser.error(f"--max-batch takes a count of at least 1, got {args.max_batch}")
    args.backend = args.backend or (["torch-int8"] if args.int8 else ["onnxruntime"])
    try:
        import sherpa_onnx  # noqa: F401
    except ModuleNotFoundError:
        parser.error("sherpa-onnx is not installed: pip install sherpa-onnx (or the test extra)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import sherpa_onnx

    torch.set_num_threads(args.threads)
    audio = synthetic_speech(30.0, seed=1)
    ours_configs = [
        (backend, threads, schedulers)
        for backend in args.backend
        for threads in args.step_threads
        for schedulers in args.schedulers
    ]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        loaded = _load(args, workdir, audio)
        chunk = args.chunk_ms // (10 * loaded.subsampling)
        export_sherpa_model(loaded, workdir / MODEL_FILE, chunk, args.left_chunks)
        write_tokens(loaded, workdir / TOKENS_FILE)
        model_file = MODEL_FILE
        if args.int8:
            quantize_int8(workdir / MODEL_FILE, workdir / MODEL_INT8_FILE, int8_mode_for(cpu_isa.detect()))
            model_file = MODEL_INT8_FILE

        make_recognizer = make_recognizer_factory(workdir, model_file, chunk, args.left_chunks, args.threads)
        header = {
            "arch": None if args.model else args.arch,
            "model": str(args.model) if args.model else None,
            "chunk_ms": args.chunk_ms,
            "left_chunks": args.left_chunks,
            "seconds": args.seconds,
            "threads": args.threads,
            "sherpa_onnx_max_batch": args.max_batch,
            "int8": args.int8,
            "sherpa_onnx_model": model_file,
            "sherpa_onnx_version": getattr(sherpa_onnx, "__version__", None),
            "ours_rescore": args.rescore,
            "allocator": allocator.describe(),
            "latency_rule": "p95 <= 300 ms and no chunk later than 1 s over the last quarter (meets_latency_rule)",
        }
        if not args.find_max:
            result: dict[str, Any] = dict(header)
            for workers in args.workers:
                base = PeerTrial(
                    args.streams, args.seconds, chunk, args.left_chunks, args.threads, workers, args.max_batch
                )
                result[f"sherpa_onnx_workers_{workers}"] = run_peer_trial(make_recognizer, loaded, base, audio)
            peer = result[f"sherpa_onnx_workers_{args.workers[0]}"]
            result["sherpa_onnx"] = peer
            if not args.no_ours:
                for config in ours_configs:
                    ours = run_trial(loaded, ours_trial(args, args.streams, *config), "cpu", audio)
                    result[config_key(*config)] = {key: ours[key] for key in OURS_KEYS}
                backend = ours_configs[0][0]
                first = result[config_key(*ours_configs[0])]
                result["ours_backend"] = backend
                result["ours"] = first
                result["cpu_per_stream_ratio"] = round(peer["cpu_rtf"] / first["rtf"], 2) if first["rtf"] else None
            print(json.dumps(result))
            return 0
        peer_maxima: dict[str, int] = {}
        peer_cores: dict[str, float | None] = {}
        for workers in args.workers:
            base = PeerTrial(args.streams, args.seconds, chunk, args.left_chunks, args.threads, workers, args.max_batch)
            name = f"workers={workers}"
            peer_maxima[name], trials = find_peer_max(make_recognizer, loaded, base, audio, args.start)
            peer_cores[name] = cores_at(trials, peer_maxima[name])
    peer_best, peer_max = best_of(peer_maxima)
    result = {
        **header,
        "sherpa_onnx_max_realtime_streams_by_config": peer_maxima,
        "sherpa_onnx_best_config": peer_best,
        "sherpa_onnx_max_realtime_streams": peer_max,
        "sherpa_onnx_cores_used_at_max_by_config": peer_cores,
    }
    if not args.no_ours:
        ours_maxima: dict[str, int] = {}
        ours_cores: dict[str, float | None] = {}
        for config in ours_configs:
            trial = ours_trial(args, 8, *config)
            name = config_name(*config)
            ours_maxima[name], trials = find_max(loaded, trial, "cpu", audio, max(8, peer_max))
            ours_cores[name] = cores_at(trials, ours_maxima[name])
        ours_best, ours_max = best_of(ours_maxima)
        result["ours_max_realtime_streams_by_config"] = ours_maxima
        result["ours_best_config"] = ours_best
        result["ours_max_realtime_streams"] = ours_max
        result["ours_cores_used_at_max_by_config"] = ours_cores
        result["ours_vs_sherpa_onnx"] = round(ours_max / peer_max, 2) if peer_max else None
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    allocator.prefer_jemalloc()
    sys.exit(main())
