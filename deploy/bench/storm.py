"""``asr-bench storm``: ``asr-bench e2e`` at several loads, surge off and on alternated; one JSON object.

A storm doubles the calls a node gets. This runs the service end to end (real sipp calls,
``deploy/bench/e2e_bench.py``) at each ``--loads`` multiple of ``--base-calls`` (the node's
real-time maximum with fixed chunks), once with ``engine.surge`` off and once on, each trial in
a subprocess of its own (a fresh service, model and Redis), in the order off, on at the first
load, off, on at the next ... and that period again ``--repeats`` times, so that drift of the
machine (heat, neighbours) falls on both settings alike.

Printed: per load (``"1x"``, ``"1.5x"``, ``"2x"``), per setting (``off``, ``on``), each trial's
key figures (``FIGURES``: calls refused, share of chunks behind real time, partial p95/p99,
final p95, finals missing, cores used and the share of the service's cores, how busy those
cores were while the engine was full and for how long) and their median;
``target``: whether every surge-on trial at the highest load met the storm target
(``TARGET``); the machine (CPU model, cores) and the model. Exit status 0 when every trial
reported (whatever the figures), 1 when one did not (its ``error`` says why).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.bench import affinity

TARGET = "surge on at the highest load: 0 calls refused, partial p95 <= 1500 ms, every call's finals delivered"
TARGET_PARTIAL_P95_MS = 1500.0
FIGURES = (
    "calls_placed",
    "calls_started",
    "calls_refused",
    "behind_realtime_fraction",
    "partial_p95_ms",
    "partial_p99_ms",
    "final_p95_ms",
    "finals_missing",
    "cores_used",
    "service_core_share",
    "service_cores_busy_when_full",
    "full_s",
    "degraded_streams_peak",
    "degraded_stream_seconds",
    "reduced_finals",
    "reduced_finals_saturated",
    "realtime_ok",
    "cpus_seen",
)
"""A trial's figures as printed (``key_figures``); the numeric ones also as the setting's median."""


@dataclass(frozen=True)
class Trial:
    """One ``asr-bench e2e`` run of the storm: ``calls`` = ``load`` x the base calls."""

    load: float
    calls: int
    surge: bool
    repeat: int

    @property
    def label(self) -> str:
        return f"{load_label(self.load)} {'on' if self.surge else 'off'}"


def load_label(load: float) -> str:
    """1.0 -> ``"1x"``, 1.5 -> ``"1.5x"``."""
    return f"{load:g}x"


def plan(base_calls: int, loads: Sequence[float], repeats: int) -> list[Trial]:
    """The trials in the order they run: per repeat, per load, surge off then on."""
    return [
        Trial(load, max(1, round(base_calls * load)), surge, repeat)
        for repeat in range(repeats)
        for load in loads
        for surge in (False, True)
    ]


def key_figures(report: dict[str, Any]) -> dict[str, Any]:
    """``FIGURES`` of one ``asr-bench e2e`` report (its ``error`` instead, when it has one)."""
    if "error" in report:
        return {"error": report["error"]}
    flat = {
        **report,
        "partial_p95_ms": report["partial_latency_ms"]["p95"],
        "partial_p99_ms": report["partial_latency_ms"]["p99"],
        "final_p95_ms": report["final_latency_ms"]["p95"],
    }
    return {key: flat[key] for key in FIGURES}


def meets_target(figures: dict[str, Any]) -> bool:
    """``TARGET`` for one trial: none refused, every placed call admitted and given all its
    finals, partial p95 within ``TARGET_PARTIAL_P95_MS``."""
    if "error" in figures:
        return False
    p95 = figures["partial_p95_ms"]
    return (
        figures["calls_refused"] == 0
        and figures["calls_started"] == figures["calls_placed"]
        and figures["finals_missing"] == 0
        and p95 is not None
        and p95 <= TARGET_PARTIAL_P95_MS
    )


def median(trials: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median of each numeric figure over the trials that reported it (None: none did)."""
    result: dict[str, float | None] = {}
    for key in FIGURES:
        if key in ("realtime_ok", "cpus_seen"):
            continue
        values = [t[key] for t in trials if isinstance(t.get(key), int | float)]
        result[key] = round(statistics.median(values), 4) if values else None
    return result


def summarize(trials: list[Trial], reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The storm's figures from its trials and their e2e reports (same order): ``loads`` and ``target``."""
    loads: dict[str, dict[str, Any]] = {}
    for trial, report in zip(trials, reports, strict=True):
        entry = loads.setdefault(load_label(trial.load), {"calls": trial.calls, "off": [], "on": []})
        entry["on" if trial.surge else "off"].append(key_figures(report))
    for entry in loads.values():
        for setting in ("off", "on"):
            entry[setting] = {"trials": entry[setting], "median": median(entry[setting])}
    top = load_label(max(trial.load for trial in trials))
    judged = [meets_target(figures) for figures in loads[top]["on"]["trials"]]
    return {
        "loads": loads,
        "target": {"rule": TARGET, "load": top, "trials": judged, "met": bool(judged) and all(judged)},
    }


def machine() -> dict[str, Any]:
    """The CPU model (Linux ``/proc/cpuinfo``; else the platform's word for it) and its cores."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "machine_cores": os.cpu_count(), "node": platform.node()}


def run_trial(trial: Trial, e2e_options: list[str], timeout_s: float) -> dict[str, Any]:
    """One ``asr-bench e2e`` in a subprocess; its JSON report, or ``{"error": ...}``."""
    command = [sys.executable, "-m", "deploy.bench.cli", "e2e", "--calls", str(trial.calls), *e2e_options]
    if trial.surge:
        command.append("--surge")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"{trial.label}: no report within {timeout_s:.0f} s"}
    lines = done.stdout.strip().splitlines()
    try:
        report: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"{trial.label}: exit status {done.returncode}, no JSON; stderr: {done.stderr[-1500:]}"}
    return report


def e2e_options(args: argparse.Namespace) -> list[str]:
    """The options each trial's ``asr-bench e2e`` gets (those of the storm's that it shares)."""
    options = ["--seconds", f"{args.seconds:g}", "--threads", str(args.threads), "--steady", str(args.steady)]
    if args.attention_beam is not None:
        options += ["--attention-beam", str(args.attention_beam)]
    if args.model is not None:
        options += ["--model", str(args.model)]
    if args.redis is not None:
        options += ["--redis", args.redis]
    for flag, cpus in (("--service-cpus", args.service_cpus), ("--generator-cpus", args.generator_cpus)):
        if cpus is not None:
            options += [flag, affinity.format_cpus(cpus)]
    return options


def trial_timeout_s(seconds: float, steady: int) -> float:
    """Generous: start-up, the calls (``steady`` + 1 waves of calls of ``seconds``, plus the
    ramp), and the drain, each at twice its length."""
    return 300.0 + 2.0 * (steady + 2) * (seconds + 5.0)


def storm(
    args: argparse.Namespace, run: Callable[[Trial, list[str], float], dict[str, Any]] = run_trial
) -> dict[str, Any]:
    """The trials of ``args`` run one after the other with ``run``; the storm's JSON object."""
    trials = plan(args.base_calls, args.loads, args.repeats)
    options = e2e_options(args)
    timeout_s = trial_timeout_s(args.seconds, args.steady)
    reports: list[dict[str, Any]] = []
    for trial in trials:
        print(f"storm: {trial.label} ({trial.calls} calls, repeat {trial.repeat + 1})", file=sys.stderr, flush=True)
        reports.append(run(trial, options, timeout_s))
    model = next((r["model"] for r in reports if "model" in r), str(args.model) if args.model else None)
    return {
        "base_calls": args.base_calls,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "e2e_options": options,
        "order": [trial.label for trial in trials],
        "machine": machine(),
        "model": model,
        "service_cpus": sorted(args.service_cpus) if args.service_cpus is not None else None,
        "generator_cpus": sorted(args.generator_cpus) if args.generator_cpus is not None else None,
        **summarize(trials, reports),
    }


def _loads(text: str) -> list[float]:
    try:
        loads = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give multiples of --base-calls like 1,1.5,2") from None
    if not loads or min(loads) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: every load must be above 0")
    return loads


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="asr-bench storm", description=__doc__.split("\n\n")[0])
    result.add_argument(
        "--base-calls", type=int, required=True, help="calls at load 1: the node's real-time maximum with surge off"
    )
    result.add_argument("--loads", type=_loads, default=[1.0, 1.5, 2.0], help="multiples of --base-calls (1,1.5,2)")
    result.add_argument("--seconds", type=float, default=20.0, help="audio per call in s (default: %(default)s)")
    result.add_argument("--repeats", type=int, default=1, help="periods of off/on at every load (default: 1)")
    result.add_argument("--threads", type=int, default=1, help="e2e --threads (default: %(default)s)")
    result.add_argument("--steady", type=int, default=1, metavar="K", help="e2e --steady (default: %(default)s)")
    result.add_argument("--attention-beam", type=int, help="e2e --attention-beam (default: the service's)")
    result.add_argument("--model", type=Path, help="e2e --model (default: the bundled demo model)")
    result.add_argument("--redis", help="e2e --redis (default: a local redis-server per trial)")
    result.add_argument("--service-cpus", type=affinity.cpu_list, metavar="LIST", help="e2e --service-cpus")
    result.add_argument("--generator-cpus", type=affinity.cpu_list, metavar="LIST", help="e2e --generator-cpus")
    return result


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.base_calls < 1 or args.repeats < 1:
        print(json.dumps({"error": "--base-calls and --repeats must be at least 1"}))
        return 2
    result = storm(args)
    print(json.dumps(result, ensure_ascii=False))
    trials = [t for load in result["loads"].values() for s in ("off", "on") for t in load[s]["trials"]]
    return 1 if any("error" in t for t in trials) else 0
