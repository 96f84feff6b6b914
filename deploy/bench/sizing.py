"""Sizing: real-time streams per CPU core for each model size and chunk size, INT8.

    asr-bench sizing --arch demo,aishell,wenetspeech --chunk-ms 160,320,640 --budget-s 3600

For each (arch, chunk) pair, the engine bench's stream-count search (``asr-bench engine
--find-max``, batched only: the same trials, the same real-time rule) on the torch-int8 backend.
``demo`` is the bundled trained model (``asr_core/demo_model``); the other names are random
weights of ``make_random_model.ARCHS`` with the CTC head calibrated to decode like a trained
model (``bench_input.calibrate_ctc``). Streams per core is the largest real-time stream count
divided by the CPU cores the engine and its finals process used at that count.

Options other than those below go to the engine bench unchanged (``--seconds``, ``--threads``,
``--step-threads``, ``--max-wait-ms``, ``--backend``, ``--left-chunks``, ``--start`` ...); the
defaults are ``SIZING_DEFAULTS``. ``--budget-s`` bounds the whole run: each pair gets an equal
share of the time left, and a pair whose share runs out stops searching and reports its count
as a lower bound (``cut_short``; shown as "≥ N", with no per-core figure). Prints one JSON object on stdout and the same
rows as a Markdown table on stderr (also in the JSON as ``markdown``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from asr_common import allocator
from asr_core import cpu_isa
from asr_core.cli_transcribe import DEMO_MODEL_DIR
from deploy.bench import bench_input, engine_bench
from deploy.bench.make_random_model import ARCHS

DEMO = "demo"
DEMO_MODEL_ARG = "asr_core/demo_model"
"""How a row's command names the bundled model (run from the repository root)."""
SIZING_DEFAULTS = ("--backend", "torch-int8", "--seconds", "8", "--threads", "1", "--max-wait-ms", "80")
"""Engine bench options of every trial unless given again: INT8 (the CPU default), short trials,
one torch thread, the batching wait of the capacity rows in docs/BENCHMARKS.md."""
NOT_SIZING = ("fast", "surge", "hotwords", "hotwords_ab")
"""Engine bench modes that are not a stream-count search; refused (``--streams`` the engine
bench's own parser refuses beside ``--find-max``)."""


@dataclass(frozen=True)
class SizingRow:
    """One (arch, chunk) pair's search result."""

    arch: str
    model: str  # what the weights are
    parameters: int
    d_model: int
    chunk_ms: int
    left_chunks: int
    max_realtime_streams: int  # 0: not even the first count passed (or the budget was spent before it)
    cores_used: float | None  # CPU cores at that count: engine process + finals process
    streams_per_core: float | None  # None when cut short
    partial_p95_ms: float | None
    final_p95_ms: float | None
    trials: int
    search_s: float  # wall seconds of this pair's search, model loading included
    cut_short: bool  # the pair's share of --budget-s ran out: max_realtime_streams is a lower bound
    command: str  # the engine bench command of this pair's search (it also searches unbatched)


def parse_list(text: str, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise SystemExit(f"{what}: give a comma-separated list, got {text!r}")
    return items


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Sizing's own options and the rest, checked against the engine bench's parser."""
    parser = argparse.ArgumentParser(prog="asr-bench sizing", description=__doc__.split("\n\n")[0])
    names = ", ".join([DEMO, *sorted(ARCHS)])
    parser.add_argument("--arch", default="demo,aishell,wenetspeech", help=f"comma-separated, of: {names}")
    parser.add_argument("--chunk-ms", default="160,320,640", help="comma-separated chunk sizes (ms)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=3600.0,
        help="wall seconds for the whole run, shared equally by the pairs left (default: %(default)s)",
    )
    args, engine_argv = parser.parse_known_args(list(argv))
    args.archs = parse_list(args.arch, "--arch")
    unknown = [a for a in args.archs if a != DEMO and a not in ARCHS]
    if unknown:
        raise SystemExit(f"--arch: unknown {', '.join(unknown)}; choose from {names}")
    try:
        args.chunks = [int(c) for c in parse_list(args.chunk_ms, "--chunk-ms")]
    except ValueError:
        raise SystemExit(f"--chunk-ms: whole milliseconds, comma-separated, got {args.chunk_ms!r}") from None
    if args.budget_s <= 0:
        raise SystemExit(f"--budget-s must be positive, got {args.budget_s}")
    engine = engine_args(args.archs[0], args.chunks[0], engine_argv)  # a bad option fails now, not hours in
    refused = [f"--{name.replace('_', '-')}" for name in NOT_SIZING if getattr(engine, name)]
    if refused:
        raise SystemExit(f"asr-bench sizing runs the stream-count search only; drop {' '.join(refused)}")
    return args, engine_argv


def _without(argv: Sequence[str], flag: str) -> list[str]:
    """``argv`` less ``flag`` and its value (``--flag V`` or ``--flag=V``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            kept.append(arg)
    return kept


def engine_options(extra: Sequence[str]) -> list[str]:
    """``SIZING_DEFAULTS`` not given again in ``extra``, then ``extra``."""
    given = {arg.split("=", 1)[0] for arg in extra}
    pairs = [SIZING_DEFAULTS[i : i + 2] for i in range(0, len(SIZING_DEFAULTS), 2)]
    return [arg for pair in pairs if pair[0] not in given for arg in pair] + list(extra)


def engine_argv_for(arch: str, chunk_ms: int, extra: Sequence[str], start: int | None = None) -> list[str]:
    """The engine bench's arguments for one pair (the demo model by its repository path), with
    ``start`` in place of any ``--start``."""
    source = ["--model", DEMO_MODEL_ARG] if arch == DEMO else ["--arch", arch]
    options = engine_options(extra if start is None else [*_without(extra, "--start"), "--start", str(start)])
    return [*source, "--find-max", "--chunk-ms", str(chunk_ms), *options]


def engine_args(arch: str, chunk_ms: int, extra: Sequence[str], start: int | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asr-bench sizing (engine options)")
    engine_bench.add_arguments(parser)
    args = parser.parse_args(engine_argv_for(arch, chunk_ms, extra, start))
    if arch == DEMO:
        args.model = DEMO_MODEL_DIR
    return args


def size_pair(
    arch: str, chunk_ms: int, extra: Sequence[str], start: int | None, workdir: Path, deadline: float
) -> SizingRow:
    """Search one pair's largest real-time stream count, stopping at ``deadline`` (monotonic s)."""
    began = time.monotonic()
    args = engine_args(arch, chunk_ms, extra, start)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded, audio, _ = bench_input.load_model(args, workdir)
    base = engine_bench.base_trial(args)
    found, trials = engine_bench.find_max(loaded, base, args.device, audio, args.start, deadline=deadline)
    cut_short = time.monotonic() > deadline
    best = next((t for t in trials if t["streams"] == found), None)
    cores = best["cores_used"] if best else None
    return SizingRow(
        arch=arch,
        model="bundled demo model" if arch == DEMO else "random weights, CTC head calibrated",
        parameters=sum(p.numel() for p in loaded.model.parameters()),
        d_model=loaded.d_model,
        chunk_ms=chunk_ms,
        left_chunks=args.left_chunks,
        max_realtime_streams=found,
        cores_used=cores,
        # Below the real maximum the cores used are no measure of the cost: no figure then.
        streams_per_core=round(found / cores, 1) if found and cores and not cut_short else None,
        partial_p95_ms=best["partial_latency_ms"]["p95"] if best else None,
        final_p95_ms=best["final_latency_ms"]["p95"] if best else None,
        trials=len(trials),
        search_s=round(time.monotonic() - began, 1),
        cut_short=cut_short,
        command=" ".join(["asr-bench", "engine", *engine_argv_for(arch, chunk_ms, extra, start)]),
    )


def _cell(value: float | None, unit: str = "") -> str:
    return "—" if value is None or value != value else f"{value:g}{unit}"  # NaN: no final ended


def markdown_table(rows: Sequence[SizingRow]) -> str:
    """The rows as deploy/README.md's sizing table ("≥ N": the search was cut short by the budget)."""
    lines = [
        "| model | parameters | chunk | real-time streams | cores used | streams per core | partial p95 | final p95 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        streams = f"≥ {row.max_realtime_streams}" if row.cut_short else str(row.max_realtime_streams)
        lines.append(
            f"| {row.arch} ({row.model}, d={row.d_model}) | {row.parameters / 1e6:.1f} M | {row.chunk_ms} ms "
            f"| {streams} | {_cell(row.cores_used)} | {_cell(row.streams_per_core)} "
            f"| {_cell(row.partial_p95_ms, ' ms')} | {_cell(row.final_p95_ms, ' ms')} |"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "isa": cpu_isa.detect().level,
        "allocator": allocator.describe(),
    }


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    began = time.monotonic()
    end = began + args.budget_s
    pairs = [(arch, chunk) for arch in args.archs for chunk in args.chunks]
    rows: list[SizingRow] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (arch, chunk) in enumerate(pairs):
            now = time.monotonic()
            deadline = now + max(0.0, end - now) / (len(pairs) - i)
            # A longer chunk costs less per stream than a shorter one of the same model: its
            # search starts from the shorter one's count instead of doubling up to it again.
            before = next((r for r in reversed(rows) if r.arch == arch and r.chunk_ms < chunk), None)
            start = before.max_realtime_streams if before and before.max_realtime_streams else None
            progress = {"sizing": arch, "chunk_ms": chunk, "budget_s": round(deadline - now, 1)}
            print(json.dumps(progress), file=sys.stderr)
            rows.append(size_pair(arch, chunk, extra, start, Path(tmp), deadline))
    table = markdown_table(rows)
    report = {
        "machine": machine(),
        "engine_options": engine_options(extra),
        "torch_threads": torch.get_num_threads(),
        "budget_s": args.budget_s,
        "elapsed_s": round(time.monotonic() - began, 1),
        "rows": [asdict(row) for row in rows],
        "markdown": table,
    }
    print(json.dumps(report, ensure_ascii=False))
    print(table, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
