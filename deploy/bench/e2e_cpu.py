"""The CPU figures of ``asr-bench e2e``: samples of the engine's chunk counts and the CPU used
(this process by thread, the finals processes, the whole machine), and CPU per wall second
between two of them (``deploy/bench/e2e_bench.py`` has the run)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, NamedTuple

from asr_gateway.service import Service


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds of this process by Python thread name (Linux ``/proc``; {} elsewhere);
    threads Python does not know (torch's, native libraries') are summed as ``other``."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    seconds: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return seconds
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        name = names.get(int(tid), "other")
        seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return seconds


def machine_busy_seconds() -> float | None:
    """CPU seconds all cores of the machine have been busy since boot (Linux; None elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # without guest time (counted in user)


class Sample(NamedTuple):
    """The engine's chunk counts and the CPU used so far, at one moment (``time.monotonic()``)."""

    at: float
    behind_chunks: int
    chunks: int
    cpu_s: float  # this process (user + system) and the finals processes
    threads: dict[str, float]  # thread_cpu_seconds()
    finals_cpu_s: float
    machine_busy_s: float | None


def take_sample(service: Service) -> Sample:
    """The ``Sample`` of now."""
    times, stats = os.times(), service.engine.stats
    finals_cpu_s = service.engine.finalizer_cpu_seconds() or 0.0
    return Sample(
        at=time.monotonic(),
        behind_chunks=stats.behind_realtime_chunks,
        chunks=stats.chunks,
        cpu_s=times.user + times.system + finals_cpu_s,
        threads=thread_cpu_seconds(),
        finals_cpu_s=finals_cpu_s,
        machine_busy_s=machine_busy_seconds(),
    )


async def sample_every(service: Service, samples: list[Sample], period_s: float = 0.25) -> None:
    """Append a ``take_sample`` every ``period_s`` until cancelled."""
    while True:
        samples.append(take_sample(service))
        await asyncio.sleep(period_s)


def bracket(samples: list[Sample], window: tuple[float, float]) -> tuple[Sample, Sample]:
    """The last sample at or before the window's start and the first at or after its end
    (the first and last sample where there is none)."""
    start = max((s for s in samples if s.at <= window[0]), default=samples[0], key=lambda s: s.at)
    end = min((s for s in samples if s.at >= window[1]), default=samples[-1], key=lambda s: s.at)
    return start, end


def cpu_figures(start: Sample, end: Sample) -> dict[str, Any]:
    """CPU per wall second from ``start`` to ``end``: ``cpu_percent``, ``cores_used`` (this
    process and the finals processes), ``machine_cores_busy`` (None without ``/proc/stat``) and
    ``cores_by_thread`` (threads that ended meanwhile left out; the finals processes together)."""
    wall = max(1e-9, end.at - start.at)
    cores = (end.cpu_s - start.cpu_s) / wall
    by_thread = {name: (busy - start.threads.get(name, 0.0)) / wall for name, busy in end.threads.items()}
    by_thread["finals processes"] = (end.finals_cpu_s - start.finals_cpu_s) / wall
    machine = (
        round((end.machine_busy_s - start.machine_busy_s) / wall, 2)
        if end.machine_busy_s is not None and start.machine_busy_s is not None
        else None
    )
    return {
        "cpu_percent": round(100 * cores, 1),
        "cores_used": round(cores, 2),
        "machine_cores_busy": machine,
        # Threads under 0.005 cores are left out; the finals processes are always named (with
        # WeNet's rescoring, the default, two short calls' finals take under that).
        "cores_by_thread": {
            name: round(value, 3 if name == "finals processes" else 2)
            for name, value in sorted(by_thread.items())
            if value >= 0.005 or name == "finals processes"
        },
    }
