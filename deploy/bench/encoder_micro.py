"""Micro-benchmark of the batched chunk step (encoder + CTC head) the engine runs per batch.

    python -m deploy.bench.encoder_micro --arch aishell --batch 1,8,32,64 --chunk 4 --window 32 --threads 1

Each call is one ``ChunkRunner.step`` of B streams in steady state: C new encoder frames per
stream, a full window of W cached frames in ring order, offsets spread over a long call. The
caches lie in a pool of 2B streams' slots, the batch's in random rows, and each call includes
what the engine does to hand them to the step: the rows themselves for backends that read the
pool where it lies (``ChunkRunner.reads_pool``: the torch backends copy each layer's rows inside
the step), a gather of the rows into a reused buffer for the others. With
``--traced`` the torch backends run the frozen graphs the engine runs by default
(``engine.traced_step``), and the offsets are spread within the graphs' position table
(``traced.POSITION_LIMIT``) instead, since later positions run eagerly. The
wall time of a call is timed ``--repeat`` times after ``--warmup`` calls; the minimum is the
number to compare (the machine may be shared), the median is printed too. Several backends
(``--backend torch,torch-int8``) are measured in the same run, interleaved per batch size, so
that their numbers are comparable. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from asr_common import allocator
from asr_core.backends import ChunkRunner, ChunkStepInputs, make_runner
from asr_core.backends.traced import POSITION_LIMIT
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.stream import chunk_input_frames
from deploy.bench.make_random_model import ARCHS, make_random_model

FIRST_OFFSET = 1000
"""Encoder frame of the youngest stream's chunk (40 s into a call); stream b is b*7 frames older."""


def step_inputs(
    loaded: LoadedModel, batch: int, chunk: int, window: int, position_limit: int | None = None
) -> ChunkStepInputs:
    """Inputs of ``ChunkRunner.step`` for ``batch`` streams in steady state (full windows);
    with ``position_limit`` every stream's chunk ends below that encoder frame."""
    g = torch.Generator().manual_seed(batch)
    rate = loaded.subsampling
    t_in = chunk_input_frames(chunk, rate, loaded.right_context)
    offsets = FIRST_OFFSET + 7 * torch.arange(batch, dtype=torch.int64)  # (B,)
    if position_limit is not None:
        offsets = window + offsets % (position_limit - chunk - window)
    # Ring order as kv_ring stores it: frame p lives at index p % W.
    ring = torch.arange(window, dtype=torch.int64)  # (W,)
    newest = offsets.unsqueeze(1) - 1  # (B, 1)
    cache_pos = newest - (newest - ring) % window  # (B, W) the frame at each ring index
    return ChunkStepInputs(
        xs=10.0 + 3.0 * torch.randn(batch, t_in, 80, generator=g),
        offsets=offsets,
        att_cache=torch.randn(loaded.num_blocks, batch, loaded.heads, window, 2 * loaded.d_k, generator=g),
        cache_pos=cache_pos,
        cache_mask=torch.ones(batch, window, dtype=torch.bool),
        cnn_cache=torch.randn(loaded.num_blocks, batch, loaded.d_model, loaded.cnn_cache_frames, generator=g),
    )


def in_pool(inputs: ChunkStepInputs, seed: int) -> tuple[ChunkStepInputs, torch.Tensor]:
    """``inputs`` with its caches as random rows of a pool of twice the batch; returns the
    pooled inputs (with those rows) and the rows."""
    g = torch.Generator().manual_seed(seed)
    batch = inputs.xs.size(0)
    rows = torch.randperm(2 * batch, generator=g)[:batch]

    def pooled(cache: torch.Tensor) -> torch.Tensor:
        pool = torch.zeros((cache.size(0), 2 * batch, *cache.shape[2:]), dtype=cache.dtype)
        pool[:, rows] = cache
        return pool

    return inputs._replace(att_cache=pooled(inputs.att_cache), cnn_cache=pooled(inputs.cnn_cache), rows=rows), rows


def time_calls(runner: ChunkRunner, inputs: ChunkStepInputs, warmup: int, repeat: int) -> list[float]:
    """Milliseconds of each of ``repeat`` calls after ``warmup`` untimed ones, each with the
    engine's hand-over of the pool's rows (see the module docstring)."""
    pooled, rows = in_pool(inputs, seed=inputs.xs.size(0))
    att_buffer, cnn_buffer = torch.empty_like(inputs.att_cache), torch.empty_like(inputs.cnn_cache)

    def call() -> None:
        if runner.reads_pool:
            runner.step(pooled)
            return
        att = torch.index_select(pooled.att_cache, 1, rows, out=att_buffer)
        cnn = torch.index_select(pooled.cnn_cache, 1, rows, out=cnn_buffer)
        runner.step(pooled._replace(att_cache=att, cnn_cache=cnn, rows=None))

    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000.0)
    return times


def run(
    loaded: LoadedModel,
    backends: list[str],
    batches: list[int],
    chunk: int,
    window: int,
    warmup: int,
    repeat: int,
    traced: bool = False,
    step_threads: int = 1,
) -> dict[str, dict[str, dict[str, float]]]:
    """{backend: {B: {ms_min, ms_median, stream_chunks_per_s, realtime_streams}}}."""
    runners = {name: make_runner(name, loaded, traced=traced, step_threads=step_threads) for name in backends}
    chunk_s = chunk * loaded.subsampling * 0.01  # 10 ms fbank frames
    results: dict[str, dict[str, dict[str, float]]] = {name: {} for name in backends}
    for runner in runners.values():
        runner.expect(chunk_input_frames(chunk, loaded.subsampling, loaded.right_context), window)
    for batch in batches:
        inputs = step_inputs(loaded, batch, chunk, window, POSITION_LIMIT if traced else None)
        for name, runner in runners.items():
            times = time_calls(runner, inputs, warmup, repeat)
            best = min(times)
            per_s = batch * 1000.0 / best
            results[name][str(batch)] = {
                "ms_min": round(best, 3),
                "ms_median": round(statistics.median(times), 3),
                "stream_chunks_per_s": round(per_s, 1),
                "realtime_streams": round(per_s * chunk_s, 1),
            }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--arch", choices=sorted(ARCHS), help="random-weight model of this architecture")
    source.add_argument("--model", type=Path, help="WeNet model directory")
    parser.add_argument("--batch", default="1,8,32,64", help="comma-separated batch sizes (streams per call)")
    parser.add_argument("--chunk", type=int, default=4, help="encoder frames per chunk (4 = 160 ms)")
    parser.add_argument("--window", type=int, default=32, help="cached encoder frames per stream")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--backend", default="torch", help="comma-separated backends, e.g. torch,torch-int8")
    parser.add_argument("--traced", action="store_true", help="torch backends: the frozen graphs the engine runs")
    parser.add_argument(
        "--step-threads", type=int, default=1, help="with --traced: split large batches over this many threads"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per batch size")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per batch size")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch.split(",")]
    backends = args.backend.split(",")
    report: dict[str, Any] = {
        "model": str(args.model) if args.model else f"random:{args.arch}",
        "chunk": args.chunk,
        "window": args.window,
        "threads": args.threads,
        "torch": torch.__version__,
        "allocator": allocator.describe(),
        "traced": args.traced,
        "step_threads": args.step_threads,
    }
    if args.model is not None:
        loaded = load_wenet_model(args.model)
        report["results"] = run(
            loaded, backends, batches, args.chunk, args.window, args.warmup, args.repeat, args.traced, args.step_threads
        )
    else:
        with tempfile.TemporaryDirectory() as tmp:
            make_random_model(args.arch, Path(tmp))
            loaded = load_wenet_model(Path(tmp))
        report["results"] = run(
            loaded, backends, batches, args.chunk, args.window, args.warmup, args.repeat, args.traced, args.step_threads
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    allocator.prefer_jemalloc()
    sys.exit(main())
