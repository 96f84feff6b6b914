"""``asr-bench peer-ratio``: our engine against sherpa-onnx on one exported model, by both peer
harnesses, alternated in one run.

    asr-bench peer-ratio --shared-harness ../shared/peers/sherpa_bench.py [--rounds 2]

The model is a random-weight one of ``--arch`` shape, written as ``asr-bench engine --arch``
writes it and exported with ``asr-export sherpa-onnx --int8`` (the shared harness's README).
Each round then measures, one after another:

1. ``shared``: sherpa-onnx's real-time streams by the shared harness, run as a subprocess the
   way its README runs it (this Python, ``--find-max --rule p95``, ``--pool`` decode threads,
   one onnxruntime thread, its default batch of 3), on glibc's malloc as a new user's shell
   would have it (this command's jemalloc preload is not handed down);
2. ``ours``: our engine's real-time streams by ``asr-bench engine --find-max`` on the same
   model (CTC head calibrated as there), partials p95 <= 300 ms and finals p95 <= 2 s;
3. ``sherpa_peer``: sherpa-onnx's real-time streams by our harness (``deploy.bench.sherpa_peer``)
   on the same INT8 export, in this process.

Rounds alternate the three so the load of a shared machine falls on each alike. One JSON object
on stdout: each figure per round, ours / peer on each harness per round, and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr_common import allocator
from asr_core.model.loader import LoadedModel
from deploy.bench import bench_input, engine_bench
from deploy.bench.sherpa_peer import PeerTrial, cores_at, find_peer_max, make_recognizer_factory
from deploy.export.sherpa import MODEL_INT8_FILE, export_for_sherpa

FIGURES = ("shared", "ours", "sherpa_peer")
"""The three measurements of a round, in the order they run."""


@dataclass(frozen=True)
class Settings:
    """What every round measures with (the command's options, resolved)."""

    shared_harness: Path
    chunk: int  # encoder frames per chunk (160 ms: 4)
    left_chunks: int
    workers: int  # sherpa-onnx decode threads in both harnesses
    peer_duration_s: float  # the shared harness's --duration (each search trial)
    peer_confirm_s: float  # the shared harness's --confirm-duration
    peer_seconds: float  # our harness's trial length
    ours_start: int
    peer_start: int


def shared_harness_argv(settings: Settings, model_dir: Path, out: Path) -> list[str]:
    """The shared harness's command line, as its README gives it (INT8, rule p95)."""
    return [
        sys.executable, str(settings.shared_harness), "--model-dir", str(model_dir), "--int8",
        "--chunk-size", str(settings.chunk), "--left-chunks", str(settings.left_chunks),
        "--pool", str(settings.workers), "--threads", "1", "--find-max",
        "--duration", f"{settings.peer_duration_s:g}", "--confirm-duration", f"{settings.peer_confirm_s:g}",
        "--rule", "p95", "--out", str(out),
    ]  # fmt: skip


def new_user_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without what :func:`allocator.prefer_jemalloc` added: a shell's environment.

    A new user runs the shared harness from a shell, on glibc's malloc; the jemalloc preload
    of this command would otherwise pass to the subprocess and change the peer's figure."""
    env = dict(environ)
    kept = [lib for lib in env.pop("LD_PRELOAD", "").split() if lib != allocator.LIBRARY]
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    if env.get("MALLOC_CONF") == allocator.CONF:
        del env["MALLOC_CONF"]
    return env


def run_shared_harness(settings: Settings, model_dir: Path, workdir: Path, round_index: int) -> dict[str, Any]:
    """One ``--find-max`` of the shared harness; its trials' lines go to stderr as they come."""
    out = workdir / f"shared_round{round_index}.json"
    argv = shared_harness_argv(settings, model_dir, out)
    wall0 = time.monotonic()
    done = subprocess.run(argv, env=new_user_environment(os.environ), stdout=subprocess.DEVNULL, check=False)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"{settings.shared_harness}: exited {done.returncode} without a result; its stderr is above")
    report = json.loads(out.read_text(encoding="utf-8"))
    confirm = report.get("confirm") or {}
    return {
        "max_realtime_streams": int(report["max_realtime_streams"]),
        "lag_ms_p95_at_max": confirm.get("lag_ms_p95"),
        "worker_utilisation_at_max": confirm.get("worker_utilisation"),
        "decode_ms_per_chunk_at_max": confirm.get("decode_ms_per_chunk_mean"),
        "machine_cpu_busy_pct_at_max": confirm.get("cpu_busy_pct"),
        "trials": len(report.get("trials", [])),
        "wall_s": round(time.monotonic() - wall0, 1),
    }


def where_ours_stops(trials: list[dict[str, Any]], streams: int) -> dict[str, Any]:
    """Our trial at the maximum and the smallest failing one above it: which rule failed, and
    where the CPU went (the finals process's share of it, the chunk step's mean time)."""
    keys = (
        "streams", "cores_used", "rtf", "finals_rtf", "forward_ms_mean", "batch_size_mean",
        "tail_partial_latency_ms", "final_latency_ms",
    )  # fmt: skip
    at_max = next((t for t in trials if t["streams"] == streams), None)
    above = sorted((t for t in trials if t["streams"] > streams), key=lambda t: int(t["streams"]))
    return {
        "at_max": None if at_max is None else {key: at_max[key] for key in keys},
        "first_fail": None if not above else {key: above[0][key] for key in keys},
    }


def ratio(ours: int, peer: int) -> float | None:
    """ours / peer, to two places (None where the peer held no stream)."""
    return round(ours / peer, 2) if peer else None


def summarise(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-round ratios on each harness, and the medians of the figures and ratios."""
    table = [
        {
            "shared": r["shared"]["max_realtime_streams"],
            "ours": r["ours"]["max_realtime_streams"],
            "sherpa_peer": r["sherpa_peer"]["max_realtime_streams"],
        }
        for r in rounds
    ]
    for row in table:
        row["ratio_on_shared_harness"] = ratio(row["ours"], row["shared"])
        row["ratio_on_sherpa_peer_harness"] = ratio(row["ours"], row["sherpa_peer"])
        row["peer_shared_over_sherpa_peer"] = ratio(row["shared"], row["sherpa_peer"])
    medians = {
        key: round(statistics.median(v), 2) if (v := [row[key] for row in table if row[key] is not None]) else None
        for key in table[0]
    }
    return {"per_round": table, "median": medians}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asr-bench peer-ratio", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shared-harness", type=Path, required=True, help="the shared peer harness (../shared/peers/sherpa_bench.py)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three measurements (default: 2)")
    parser.add_argument("--arch", choices=sorted(engine_bench.ARCHS), default="aishell")
    parser.add_argument("--chunk-ms", type=int, default=160, choices=[160, 240, 320, 640])
    parser.add_argument("--left-chunks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="sherpa-onnx decode threads, both harnesses")
    parser.add_argument("--backend", default="torch-int8", help="our engine's backend (asr-bench engine --backend)")
    parser.add_argument("--step-threads", type=int, default=2, help="asr-bench engine --step-threads")
    parser.add_argument("--max-wait-ms", type=float, default=80.0, help="asr-bench engine --max-wait-ms")
    parser.add_argument("--no-rescore", dest="rescore", action="store_false", help="our finals without rescoring")
    parser.add_argument("--seconds", type=float, default=8.0, help="each trial of our engine and of our harness")
    parser.add_argument("--peer-duration", type=float, default=8.0, help="the shared harness's --duration")
    parser.add_argument("--peer-confirm", type=float, default=16.0, help="the shared harness's --confirm-duration")
    parser.add_argument("--start", type=int, default=16, help="our engine's first stream count (round 1)")
    parser.add_argument("--peer-start", type=int, default=8, help="our harness's first stream count (round 1)")
    parser.add_argument("--workdir", type=Path, help="where the model and export go (default: a temporary dir)")
    args = parser.parse_args(argv)
    if not args.shared_harness.is_file():
        parser.error(f"--shared-harness {args.shared_harness}: no such file (../shared/peers/sherpa_bench.py?)")
    if min(args.rounds, args.workers, args.step_threads, args.start, args.peer_start) < 1:
        parser.error("--rounds, --workers, --step-threads, --start and --peer-start take counts of at least 1")
    return args


def engine_argv(args: argparse.Namespace) -> list[str]:
    """``asr-bench engine`` options of our figure (also reported, to rerun it alone)."""
    argv = [
        "--arch", args.arch, "--find-max", "--seconds", f"{args.seconds:g}", "--threads", "1",
        "--chunk-ms", str(args.chunk_ms), "--left-chunks", str(args.left_chunks),
        "--max-wait-ms", f"{args.max_wait_ms:g}", "--backend", args.backend,
        "--step-threads", str(args.step_threads), "--start", str(args.start),
    ]  # fmt: skip
    return argv if args.rescore else [*argv, "--no-rescore"]


def next_start(previous: int) -> int:
    """A later round's first stream count: three quarters of the last round's maximum, so the
    doubling search passes once and then bisects."""
    return max(1, previous * 3 // 4)


def run_rounds(
    settings: Settings,
    rounds: int,
    measure: Mapping[str, Callable[[int, int], dict[str, Any]]],
) -> list[dict[str, Any]]:
    """``rounds`` x (shared, ours, sherpa_peer); ``measure[name](round, start)`` returns a figure
    with ``max_realtime_streams``. Later rounds start searching near the last round's figure."""
    starts = {"shared": 0, "ours": settings.ours_start, "sherpa_peer": settings.peer_start}
    results: list[dict[str, Any]] = []
    for index in range(rounds):
        row: dict[str, Any] = {}
        for name in FIGURES:
            load_before = os.getloadavg()[0]
            row[name] = measure[name](index, starts[name])
            # the 1-minute load average around it: how busy the shared machine was meanwhile
            row[name]["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            print(json.dumps({"round": index, name: row[name]["max_realtime_streams"]}), file=sys.stderr, flush=True)
            starts[name] = next_start(row[name]["max_realtime_streams"]) if name != "shared" else 0
        results.append(row)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    engine_args = argparse.ArgumentParser()
    engine_bench.add_arguments(engine_args)
    engine_options = engine_argv(args)
    engine = engine_args.parse_args(engine_options)
    base = engine_bench.base_trial(engine)
    wall0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        loaded, audio, calibration = bench_input.load_model(engine, workdir)
        chunk = args.chunk_ms // (10 * loaded.subsampling)
        export_dir = workdir / "sherpa"
        export_for_sherpa(workdir / f"random_{args.arch}", export_dir, chunk, args.left_chunks, int8=True)
        settings = Settings(
            args.shared_harness, chunk, args.left_chunks, args.workers, args.peer_duration, args.peer_confirm,
            args.seconds, args.start, args.peer_start,
        )  # fmt: skip
        make_recognizer = make_recognizer_factory(export_dir, MODEL_INT8_FILE, chunk, args.left_chunks, 1)
        peer_base = PeerTrial(0, args.seconds, chunk, args.left_chunks, 1, args.workers)
        rounds = run_rounds(
            settings,
            args.rounds,
            {
                "shared": lambda index, _start: run_shared_harness(settings, export_dir, workdir, index),
                "ours": lambda _index, start: _ours(loaded, base, audio, start),
                "sherpa_peer": lambda _index, start: _sherpa_peer(make_recognizer, loaded, peer_base, audio, start),
            },
        )
    result = {
        "arch": args.arch,
        "chunk_ms": args.chunk_ms,
        "left_chunks": args.left_chunks,
        "ctc_calibration": calibration,
        "shared_harness_command": " ".join(shared_harness_argv(settings, Path("SHERPA_DIR"), Path("OUT.json"))),
        "ours_command": "asr-bench engine " + " ".join(engine_options),
        "sherpa_peer_harness": f"deploy.bench.sherpa_peer, INT8 export, --workers {args.workers} --threads 1, "
        f"--seconds {args.seconds:g}",
        "allocator": {"ours_and_sherpa_peer": allocator.describe(), "shared": "as a shell's (no preload handed down)"},
        "rounds": rounds,
        **summarise(rounds),
        "wall_s": round(time.monotonic() - wall0, 1),
    }
    print(json.dumps(result))
    return 0


def _ours(loaded: LoadedModel, base: engine_bench.Trial, audio: np.ndarray, start: int) -> dict[str, Any]:
    wall0 = time.monotonic()
    streams, trials = engine_bench.find_max(loaded, base, "cpu", audio, start)
    return {
        "max_realtime_streams": streams,
        "cores_used_at_max": cores_at(trials, streams),
        **where_ours_stops(trials, streams),
        "trials": len(trials),
        "wall_s": round(time.monotonic() - wall0, 1),
    }


def _sherpa_peer(
    make_recognizer: Callable[[], Any], loaded: LoadedModel, base: PeerTrial, audio: np.ndarray, start: int
) -> dict[str, Any]:
    wall0 = time.monotonic()
    streams, trials = find_peer_max(make_recognizer, loaded, base, audio, start)
    at_max = next((t for t in trials if t["streams"] == streams), None)
    return {
        "max_realtime_streams": streams,
        "cores_used_at_max": cores_at(trials, streams),
        "chunk_latency_ms_at_max": None if at_max is None else at_max["chunk_latency_ms"],
        "trials": len(trials),
        "wall_s": round(time.monotonic() - wall0, 1),
    }


if __name__ == "__main__":
    allocator.prefer_jemalloc()
    sys.exit(main())
