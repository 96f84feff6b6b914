"""Capacity benchmark of the shared engine: many streams fed at real-time pace.

``asr-bench engine`` opens N streams on one Engine, feeds each 20 ms of audio (at the model's
own rate from train.yaml, 16 or 8 kHz) every 20 ms (as RTP would), with start times spread over
one chunk so chunks do not all line up, and reports one JSON object. ``--find-max`` searches
the largest N that keeps up in real time (``meets_latency_rule``: over the last quarter of the
run, p95 partial latency <= 300 ms and no chunk later than 1 s) with p95 final latency <= 2 s,
once batched and once with ``--max-batch 1``, and reports the ratio as ``batching_gain``.
``--fast`` feeds as fast as possible (throughput).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr_common import allocator
from asr_core.backends import BACKENDS
from asr_core.context_graph import DEFAULT_BONUS, ContextGraph, HotwordsError, load_graph, load_phrases
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import DTYPES, EngineOptions, per_core, resolve_dtype
from asr_core.events import Event, Final
from asr_core.finals import WORKER_NICENESS
from asr_core.model.loader import LoadedModel
from asr_core.stream import StreamConfig
from asr_core.surge import FinalsReduction, SurgeSettings
from deploy.bench.bench_input import BLANK_RATE, PEAK_POSTERIOR, load_model
from deploy.bench.make_random_model import ARCHS
from rescoring.packing import PrefixTree
from rtp.leg import DEFAULT_RESAMPLE_BATCH_MS

# The service hands each call's audio to the engine in the RTP leg's resampler batches, so the
# bench feeds pieces of that size by default.
DEFAULT_PIECE_MS = DEFAULT_RESAMPLE_BATCH_MS
LATENCY_LIMIT_MS = 300.0
FINAL_LATENCY_LIMIT_MS = 2000.0
"""--find-max: finals must keep up too. They run at a lower priority than partials (a niced
process), so past the CPU's capacity partials still pass while finals fall further behind
with every utterance; a p95 of 2 s from endpoint to final bounds that backlog."""
SURGE_AB_KEYS = (
    "late_chunk_fraction",
    "partial_latency_ms",
    "tail_partial_latency_ms",
    "final_latency_ms",
    "finals",
    "cores_used",
    "degraded_streams_peak",
    "degraded_stream_seconds",
    "chunk_moves",
    "reduced_finals",
    "reduced_finals_saturated",
    "drain_s",
)
"""``--surge``: the measurements shown side by side, [off, on]."""
LATE_CHUNK_MS = 1000.0
"""No chunk of the judged window may come later than this (or than 3 chunks, for chunks over 333 ms)."""


def meets_latency_rule(tail_ms: Sequence[float], chunk_ms: int) -> bool:
    """The one real-time rule of the capacity benchmarks, applied to our engine
    (``asr-bench engine``) and to sherpa-onnx (``deploy.bench.sherpa_peer``) alike: over the
    judged window (the last quarter of a run's chunk latencies), p95 <= 300 ms and no chunk
    later than 1 s. An empty window fails."""
    if not len(tail_ms):
        return False
    values = np.asarray(tail_ms, dtype=np.float64)
    late_limit = max(LATE_CHUNK_MS, 3.0 * chunk_ms)
    return float(np.percentile(values, 95)) <= LATENCY_LIMIT_MS and float(values.max()) <= late_limit


@dataclass(frozen=True)
class Trial:
    streams: int
    seconds: float
    chunk_ms: int
    left_chunks: int
    max_batch: int
    max_wait_ms: float
    fast: bool
    backend: str = "torch"
    max_utterance_ms: int = 20000
    dtype: str = "float32"
    finalizer: str = "process"
    rescore: bool = True
    piece_ms: int = DEFAULT_PIECE_MS
    traced_step: bool = True
    step_threads: int = 1
    schedulers: int = 1
    context: ContextGraph | None = None  # hotwords on every stream (--hotwords-ab, --hotwords)
    surge: SurgeSettings | None = None  # --surge: streams may move up to ``max_chunk_ms`` while behind
    max_chunk_ms: int = 640
    finals_workers: int = 1  # finals lanes, each a thread and a child process (EngineOptions.finals_workers)
    traced_rescoring: bool = True  # the finals' rescoring decoder as traced graphs (EngineOptions.traced_rescoring)
    finals_niceness: int = WORKER_NICENESS  # the finals' child processes (EngineOptions.finals_niceness)
    endpoint_every_frame: bool = True  # EndpointRules.check_every_frame (--endpoint-at-chunk-ends: False)


def _percentiles(values: list[float], qs: tuple[int, ...]) -> dict[str, float]:
    if not values:
        return {f"p{q}": math.nan for q in qs}
    arr = np.asarray(values)
    return {f"p{q}": round(float(np.percentile(arr, q)), 2) for q in qs}


def run_trial(loaded: LoadedModel, trial: Trial, device: str, audio: np.ndarray) -> dict[str, Any]:
    """Run one load level; returns the measurements as a dict."""
    # With surge the engine also runs the longer sizes of the streams' ladders (and sizes its
    # pool for the largest: more memory, the same windows attended over); without, one size.
    sizes = [ms for ms in (160, 320, 640) if trial.chunk_ms < ms <= trial.max_chunk_ms] if trial.surge else []
    options = EngineOptions(
        max_streams=trial.streams,
        max_batch=trial.max_batch,
        max_wait_ms=trial.max_wait_ms,
        allowed_chunk_ms=(trial.chunk_ms, *sizes),
        max_left_chunks=trial.left_chunks,
        device=device,
        dtype=resolve_dtype(trial.dtype, device),
        finalizer=trial.finalizer,
        backend=trial.backend,
        traced_step=trial.traced_step,
        traced_rescoring=trial.traced_rescoring,
        step_threads=trial.step_threads,
        schedulers=trial.schedulers,
        endpoint=EndpointRules(max_utterance_ms=trial.max_utterance_ms, check_every_frame=trial.endpoint_every_frame),
        surge=trial.surge,
        finals_workers=trial.finals_workers,
        finals_niceness=trial.finals_niceness,
    )
    engine = Engine(loaded, options)
    config = StreamConfig(
        chunk_ms=trial.chunk_ms,
        left_chunks=trial.left_chunks,
        rescore=trial.rescore,
        context=trial.context,
        max_chunk_ms=trial.max_chunk_ms,
    )
    engine.warm_up(engine.ladder(config))
    finals: list[Final] = []  # measured after the run, not in the engine's event path
    lock = threading.Lock()

    def on_event(event: Event) -> None:
        if isinstance(event, Final):
            with lock:
                finals.append(event)

    streams = [engine.open_stream(config, on_event) for _ in range(trial.streams)]
    piece_samples = trial.piece_ms * loaded.frontend.sample_rate // 1000
    piece_s = trial.piece_ms / 1000.0
    pieces_total = int(trial.seconds / piece_s)
    audio_pieces = len(audio) // piece_samples
    # Each stream starts at a different point of the audio and of the chunk period.
    starts = np.linspace(0, audio_pieces, num=trial.streams, endpoint=False).astype(int)
    stagger = np.linspace(0, trial.chunk_ms / 1000.0, num=trial.streams, endpoint=False)
    engine.start()
    finals_cpu0 = engine.finalizer_cpu_seconds()
    cpu0 = time.process_time()
    wall0 = time.monotonic()
    latency_mark = 0
    degraded_peak = 0
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    if trial.fast:
        for k in range(pieces_total):
            for i, stream in enumerate(streams):
                j = (starts[i] + k) % audio_pieces
                stream.accept_waveform(audio[j * piece_samples : (j + 1) * piece_samples])
    else:
        next_piece = np.zeros(trial.streams, dtype=np.int64)
        while True:
            now = time.monotonic() - wall0
            due = np.minimum(np.floor((now - stagger) / piece_s).astype(np.int64) + 1, pieces_total)
            for i in np.nonzero(due > next_piece)[0].tolist():
                for k in range(int(next_piece[i]), int(due[i])):
                    j = (starts[i] + k) % audio_pieces
                    streams[i].accept_waveform(audio[j * piece_samples : (j + 1) * piece_samples])
                next_piece[i] = due[i]
            degraded_peak = max(degraded_peak, engine.degraded_streams)
            if not latency_mark and now >= 0.75 * trial.seconds:
                latency_mark = len(engine.stats.partial_latency_ms)
            if (next_piece >= pieces_total).all():
                break
            time.sleep(0.004)
    feed_end = time.monotonic()
    for stream in streams:
        stream.input_finished()
    for stream in streams:
        stream.done.wait(timeout=600)
    wall = time.monotonic() - wall0
    finals_cpu1 = engine.finalizer_cpu_seconds()
    finals_cpu = None if finals_cpu0 is None or finals_cpu1 is None else finals_cpu1 - finals_cpu0
    cpu = time.process_time() - cpu0 + (finals_cpu or 0.0)
    engine.stop()
    stats = engine.stats
    latencies = list(stats.partial_latency_ms)
    tail = latencies[latency_mark:] if latency_mark else latencies[len(latencies) * 3 // 4 :]
    audio_s = trial.streams * pieces_total * piece_s
    drain_s = wall - (feed_end - wall0)
    # Kept up: in the last quarter of the run no chunk waited more than a second (a backlog
    # grows without bound once the engine is slower than real time, so this separates the two).
    chunk_limit = max(LATE_CHUNK_MS, 3 * trial.chunk_ms)
    realtime_ok = (not trial.fast) and bool(tail) and max(tail) <= chunk_limit
    gpu = _gpu_memory(engine, device, trial.streams) if cuda else {}
    batch_sizes = list(stats.batch_sizes)
    return {
        "streams": trial.streams,
        "chunk_ms": trial.chunk_ms,
        "left_chunks": trial.left_chunks,
        "seconds": trial.seconds,
        "max_batch": trial.max_batch,
        "max_wait_ms": trial.max_wait_ms,
        "fast": trial.fast,
        "realtime_ok": realtime_ok,
        "latency_rule_ok": (not trial.fast) and meets_latency_rule(tail, trial.chunk_ms),
        "tail_partial_latency_ms": _percentiles(tail, (50, 95)),
        # CPU seconds per wall second of this process and the finals process: the cores used.
        "cores_used": round(cpu / wall, 2),
        "rtf": round(wall / audio_s if trial.fast else cpu / audio_s, 4),
        # The part of rtf the finals process used (CTC prefix beam search and attention
        # rescoring); null when finals run in a thread of this process.
        "finals_rtf": None if finals_cpu is None else round(finals_cpu / audio_s, 4),
        "throughput_x_realtime": round(audio_s / wall, 2),
        "chunks": stats.chunks,
        "batches": stats.batches,
        "batch_size_mean": round(float(np.mean(batch_sizes)), 2) if batch_sizes else 0.0,
        "batch_size_p95": float(np.percentile(batch_sizes, 95)) if batch_sizes else 0.0,
        "forward_ms_mean": round(float(np.mean(stats.forward_ms.values())), 3) if stats.forward_ms else 0.0,
        "partial_latency_ms": _percentiles(latencies, (50, 95, 99)),
        "final_latency_ms": _percentiles(list(stats.final_latency_ms), (50, 95)),
        "finals": len(finals),
        # Tokens of the finals per second of audio: the decoding work the finals represent.
        "final_tokens_per_s": round(sum(len(f.tokens) for f in finals) / audio_s, 2),
        # Decoder rows of the finals' rescoring per second of audio: the left-to-right and the
        # right-to-left prefix trees of each n-best (rescoring.packing.PrefixTree).
        "rescore_tree_nodes_per_s": round(sum(_tree_nodes(f) for f in finals) / audio_s, 2),
        "behind_realtime_chunks": stats.behind_realtime_chunks,
        "endpoints_inside_chunks": stats.endpoints_inside_chunks,
        # Chunks later than behind_ms (1 s) of all chunks: how far the run fell behind real time.
        "late_chunk_fraction": round(stats.behind_realtime_chunks / stats.chunks, 4) if stats.chunks else 0.0,
        "surge": trial.surge is not None,
        "degraded_streams_peak": degraded_peak,
        "degraded_stream_seconds": round(stats.degraded_stream_seconds, 1),
        "chunk_moves": [stats.chunk_moves_up, stats.chunk_moves_down],
        "reduced_finals": stats.reduced_finals,
        # ... of which the engine was saturated rather than the finals queued (asr_core/surge.py)
        "reduced_finals_saturated": stats.reduced_finals_by_reason[FinalsReduction.ENGINE_SATURATED],
        "drain_s": round(drain_s, 3),
        # Seconds the feeding took beyond the audio's length: the load generator (one Python
        # thread) fell behind real time, so the trial offered less than its stream count.
        "feed_lag_s": round(max(0.0, feed_end - wall0 - trial.seconds), 3),
        "kv_bytes_per_stream": engine.pool.bytes_per_slot,
        "kv_bytes_total": engine.pool.total_bytes,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        **gpu,
    }


def _gpu_memory(engine: Engine, device: str, streams: int) -> dict[str, float]:
    """Peak CUDA memory of the trial; per stream: the peak less the model's weights."""
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    peak = torch.cuda.max_memory_allocated(device)
    return {
        "gpu_peak_allocated_mb": round(peak / 2**20, 1),
        "gpu_weights_mb": round(weights / 2**20, 1),
        "gpu_mb_per_stream": round((peak - weights) / 2**20 / max(1, streams), 4),
    }


def _tree_nodes(final: Final) -> int:
    """Nodes of the left-to-right and right-to-left prefix trees of a final's n-best."""
    hyps = [entry.tokens for entry in final.nbest]
    if not hyps:
        return 0
    return len(PrefixTree.of(hyps, 0)) + len(PrefixTree.of([h[::-1] for h in hyps], 0))


def _passes(result: dict[str, Any]) -> bool:
    final_p95 = result["final_latency_ms"].get("p95")
    return bool(result["latency_rule_ok"]) and (
        final_p95 is None or math.isnan(final_p95) or final_p95 <= FINAL_LATENCY_LIMIT_MS
    )


def find_max(
    loaded: LoadedModel, base: Trial, device: str, audio: np.ndarray, start: int, deadline: float | None = None
) -> tuple[int, list[dict]]:
    """Largest stream count that passes: doubling, then bisection to within ~10 %. Past
    ``deadline`` (``time.monotonic()`` seconds) no further trial starts and each counts as a
    failure, so the count found is then a lower bound; a trial under way runs to its end."""
    trials: list[dict[str, Any]] = []

    def attempt(n: int) -> bool:
        if deadline is not None and time.monotonic() > deadline:
            return False
        result = run_trial(loaded, Trial(**{**base.__dict__, "streams": n}), device, audio)
        trials.append(result)
        print(
            json.dumps(
                {
                    "trial": n,
                    "ok": _passes(result),
                    "p95": result["partial_latency_ms"]["p95"],
                    "final_p95": result["final_latency_ms"]["p95"],
                }
            ),
            file=sys.stderr,
        )
        return _passes(result)

    return largest_passing(attempt, start), trials


def largest_passing(attempt: Callable[[int], bool], start: int, limit: int = 100_000) -> int:
    """Largest n for which ``attempt(n)`` holds: doubling from ``start``, then bisection to ~10 %."""
    low, high, n = 0, 0, start
    while not high:
        if attempt(n):
            low, n = n, n * 2
            if n > limit:
                return low
        else:
            high = n
    while high - low > max(1, low // 10):
        mid = (low + high) // 2
        if attempt(mid):
            low = mid
        else:
            high = mid
    return low


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", type=Path, help="WeNet model directory")
    source.add_argument(
        "--arch",
        choices=sorted(ARCHS),
        default="aishell",
        help="random-weight model of this shape (default: aishell)",
    )
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--streams", type=int, default=16)
    load.add_argument("--find-max", action="store_true", help="search the largest real-time stream count")
    parser.add_argument("--start", type=int, default=8, help="first stream count tried by --find-max")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--chunk-ms", type=int, default=160, choices=[160, 240, 320, 640])
    parser.add_argument("--left-chunks", type=int, default=8)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=20.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="torch", choices=list(BACKENDS))
    parser.add_argument("--dtype", choices=list(DTYPES), help="default: float16 on a GPU, float32 on a CPU")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    parser.add_argument(
        "--no-rescore",
        dest="rescore",
        action="store_false",
        help="finals from the CTC prefix beam search alone (no attention rescoring), as peers without a decoder",
    )
    parser.add_argument(
        "--finalizer",
        choices=["thread", "process"],
        default="process",
        help="where finals are searched and rescored (EngineOptions.finalizer; the service's default is process)",
    )
    parser.add_argument(
        "--eager-step",
        dest="traced_step",
        action="store_false",
        help="torch backends: run the chunk step eagerly instead of as traced graphs (EngineOptions.traced_step)",
    )
    parser.add_argument(
        "--eager-rescoring",
        dest="traced_rescoring",
        action="store_false",
        help="rescore the finals with the decoder in eager PyTorch instead of traced graphs "
        "(EngineOptions.traced_rescoring)",
    )
    parser.add_argument(
        "--step-threads",
        type=int,
        default=1,
        help="split traced steps of large batches over this many threads (EngineOptions.step_threads)",
    )
    parser.add_argument(
        "--schedulers",
        type=int,
        default=1,
        help="scheduler threads over disjoint sets of streams (EngineOptions.schedulers; the service: one per core)",
    )
    parser.add_argument(
        "--finals-workers",
        type=int,
        default=0,
        help="finals lanes, each a thread and a child process (EngineOptions.finals_workers); 0 (default): "
        "the service's default, one per usable core on a CPU, one on a GPU",
    )
    parser.add_argument(
        "--finals-niceness",
        type=int,
        default=WORKER_NICENESS,
        help="niceness of the finals' child processes, 0-19 (EngineOptions.finals_niceness; default: the service's)",
    )
    parser.add_argument("--fast", action="store_true", help="feed as fast as possible (throughput)")
    parser.add_argument(
        "--hotwords-ab", type=int, default=0, metavar="N",
        help="A/B in one run: the trial without, then with an N-phrase random hotwords list on every "
        "stream; reports both finals_rtf and the extra finals CPU (needs --finalizer process)",
    )  # fmt: skip
    parser.add_argument(
        "--hotwords", type=Path, metavar="FILE",
        help="A/B in one run as --hotwords-ab, with this phrase file (spelled in the model's units) on every stream",
    )  # fmt: skip
    parser.add_argument(
        "--surge", action="store_true",
        help="A/B in one run: the trial at fixed chunks, then with graceful degradation (streams move up to "
        "--max-chunk-ms while the engine is behind); reports both (surge_ab: [off, on])",
    )  # fmt: skip
    parser.add_argument(
        "--max-chunk-ms", type=int, default=640, choices=[160, 320, 640], help="with --surge: the longest chunk"
    )
    parser.add_argument(
        "--piece-ms",
        type=int,
        default=DEFAULT_PIECE_MS,
        help="ms of audio handed to a stream per call (20: one RTP packet; default: the service's resampler batch)",
    )
    parser.add_argument(
        "--audio", type=Path, help="a mono WAV to feed instead of synthetic speech (resampled to the model's rate)"
    )
    parser.add_argument(
        "--max-utterance-ms",
        type=int,
        default=None,
        help="endpoint at this utterance length (default: 6000 for random models, which rarely "
        "emit 800 ms of blanks, so finals spread over the run as real speech's do; else 20000)",
    )
    parser.add_argument(
        "--endpoint-at-chunk-ends",
        action="store_true",
        help="check the trailing-silence rule at chunk ends only, as WeNet's runtime (default: at every frame, "
        "as the service: engine.endpoint.check_every_frame)",
    )
    parser.add_argument(
        "--blank-rate",
        type=float,
        default=BLANK_RATE,
        help="with --arch: share of frames the random model's CTC head is calibrated to decode as blank "
        "(default: %(default)s, as the bundled trained model on the hotline recordings)",
    )
    parser.add_argument(
        "--peak-posterior",
        type=float,
        default=PEAK_POSTERIOR,
        help="with --arch: mean top CTC posterior the random model is sharpened to (default: %(default)s)",
    )


def random_hotwords(units: list[str], count: int, seed: int) -> ContextGraph:
    """``count`` random phrases of 2-6 of the model's units (a cost measurement: many partial
    matches, since first tokens cover much of the vocabulary), each with the default bonus."""
    rng = np.random.default_rng(seed)
    ids = [i for i, unit in enumerate(units) if not (unit.startswith("<") and unit.endswith(">"))]
    phrases = [(rng.choice(ids, size=int(rng.integers(2, 7))).tolist(), DEFAULT_BONUS) for _ in range(count)]
    return ContextGraph(phrases)


def base_trial(args: argparse.Namespace) -> Trial:
    """The trial the engine bench's options describe (``--find-max`` varies its stream count)."""
    return Trial(
        args.streams,
        args.seconds,
        args.chunk_ms,
        args.left_chunks,
        args.max_batch,
        args.max_wait_ms,
        args.fast,
        args.backend,
        args.max_utterance_ms or (20000 if args.model else 6000),
        args.dtype or ("float16" if args.device.startswith("cuda") else "float32"),
        args.finalizer,
        args.rescore,
        args.piece_ms,
        args.traced_step,
        args.step_threads,
        args.schedulers,
        max_chunk_ms=args.max_chunk_ms,
        finals_workers=per_core(args.finals_workers, args.device),
        traced_rescoring=args.traced_rescoring,
        finals_niceness=args.finals_niceness,
        endpoint_every_frame=not args.endpoint_at_chunk_ends,
    )


def run(args: argparse.Namespace) -> int:
    if args.piece_ms <= 0:
        raise SystemExit(f"--piece-ms must be positive, got {args.piece_ms}")
    if args.hotwords is not None and args.hotwords_ab > 0:
        raise SystemExit("give --hotwords FILE or --hotwords-ab N, not both")
    if args.hotwords is not None:
        try:
            load_phrases(args.hotwords)  # a bad file fails before the model is built
        except HotwordsError as exc:
            raise SystemExit(str(exc)) from None
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        loaded, audio, calibration = load_model(args, Path(tmp))
    base = base_trial(args)
    header = {
        "arch": None if args.model else args.arch,
        "max_utterance_ms": base.max_utterance_ms,
        "endpoint_every_frame": base.endpoint_every_frame,
        "ctc_calibration": calibration,
        "model": str(args.model) if args.model else None,
        "device": args.device,
        "backend": args.backend,
        "dtype": base.dtype,
        "finalizer": base.finalizer,
        "piece_ms": base.piece_ms,
        "rescore": base.rescore,
        "traced_step": base.traced_step,
        "traced_rescoring": base.traced_rescoring,
        "step_threads": base.step_threads,
        "schedulers": base.schedulers,
        "finals_workers": base.finals_workers,
        "finals_niceness": base.finals_niceness,
        "torch_threads": torch.get_num_threads(),
        "allocator": allocator.describe(),
    }
    if args.hotwords_ab > 0 or args.hotwords is not None:
        if args.hotwords is not None:
            try:
                graph, phrases = load_graph(args.hotwords, loaded.units), len(load_phrases(args.hotwords))
            except HotwordsError as exc:  # a phrase the model's units cannot spell
                raise SystemExit(str(exc)) from None
        else:
            graph, phrases = random_hotwords(loaded.units, args.hotwords_ab, seed=5), args.hotwords_ab
        without = run_trial(loaded, base, args.device, audio)
        with_list = run_trial(loaded, Trial(**{**base.__dict__, "context": graph}), args.device, audio)
        a, b = without["finals_rtf"], with_list["finals_rtf"]
        ab = {
            "phrases": phrases,
            "file": None if args.hotwords is None else str(args.hotwords),
            "graph_nodes": len(graph),
            "finals_rtf": [a, b],
            "finals_cpu_extra": None if not a or b is None else round(b / a - 1.0, 4),
            "final_tokens_per_s": [without["final_tokens_per_s"], with_list["final_tokens_per_s"]],
        }
        print(json.dumps({**header, **without, "hotwords_ab": ab}, ensure_ascii=False))
        return 0
    if args.surge:
        # Off and on in one run, same offered load (--streams: e.g. twice the fixed-chunk maximum).
        off = run_trial(loaded, base, args.device, audio)
        on = run_trial(loaded, Trial(**{**base.__dict__, "surge": SurgeSettings()}), args.device, audio)
        surge_ab = {key: [off[key], on[key]] for key in SURGE_AB_KEYS}
        print(json.dumps({**header, "streams": base.streams, "surge_ab": surge_ab, "off": off, "on": on}))
        return 0
    if not args.find_max:
        print(json.dumps({**header, **run_trial(loaded, base, args.device, audio)}, ensure_ascii=False))
        return 0
    batched, batched_trials = find_max(loaded, base, args.device, audio, args.start)
    unbatched_base = Trial(**{**base.__dict__, "max_batch": 1})
    unbatched, _ = find_max(loaded, unbatched_base, args.device, audio, max(1, args.start // 4))
    best = next((t for t in batched_trials if t["streams"] == batched), batched_trials[-1])
    print(
        json.dumps(
            {
                **header,
                **best,
                "max_realtime_streams": batched,
                "unbatched_max_realtime_streams": unbatched,
                "batching_gain": round(batched / unbatched, 2) if unbatched else None,
            },
            ensure_ascii=False,
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asr-bench engine", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
