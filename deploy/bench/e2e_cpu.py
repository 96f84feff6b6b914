"""The CPU figures of ``asr-bench e2e``: samples of the engine's chunk counts, the SIP calls
answered and ended, and the CPU used (this process by thread, the finals processes, the whole
machine); the steady stretch they show, and CPU per wall second between two of them
(``deploy/bench/e2e_bench.py`` has the run)."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Collection, Mapping
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


def busy_seconds() -> dict[int | None, float]:
    """CPU seconds each core (by number) and the whole machine (``None``) have been busy since
    boot, the kernel's work on them included (Linux ``/proc/stat``; {} elsewhere)."""
    busy: dict[int | None, float] = {}
    try:
        with open("/proc/stat") as stat:
            lines = [line.split() for line in stat if line.startswith("cpu")]
    except OSError:
        return busy
    tick = os.sysconf("SC_CLK_TCK")
    for name, *values in lines:
        try:
            fields = [int(value) for value in values]
            cpu = None if name == "cpu" else int(name[3:])
        except ValueError:
            continue
        idle = fields[3] + fields[4]  # idle + iowait
        busy[cpu] = (sum(fields[:8]) - idle) / tick  # without guest time (counted in user)
    return busy


class Sample(NamedTuple):
    """The engine's chunk counts, the SIP calls so far and the CPU used so far, at one moment
    (``time.monotonic()``)."""

    at: float
    behind_chunks: int
    chunks: int
    cpu_s: float  # this process (user + system) and the finals processes
    threads: dict[str, float]  # thread_cpu_seconds()
    finals_cpu_s: float
    machine_busy_s: float | None
    calls_answered: int = 0  # INVITEs the SIP layer accepted (admission passed)
    calls_hung_up: int = 0  # calls the caller ended with a BYE
    cores_busy_s: Mapping[int, float] = {}  # busy_seconds() by core
    full: bool = False  # the engine had no room for another call (``Engine.overloaded``): behind


def sip_calls(counters: Mapping[str, int]) -> tuple[int, int]:
    """(calls answered, calls hung up by the caller) from the SIP layer's counters."""
    return counters.get("invites.accepted", 0), counters.get("calls.ended.bye", 0)


def steady_window(samples: list[Sample]) -> tuple[float, float] | None:
    """The steady stretch as the SIP layer saw it: from the first sample that counts a caller's
    hang-up to the first that counts the last call answered (None: no hang-up before it).

    Taken from the SIP counters, not from the events the subscriber got: a call's
    ``call.ended`` follows its last final, which lags by seconds once the finals fall behind,
    and a window drawn from those events slides into the drain after the load."""
    first_end = next((s.at for s in samples if s.calls_hung_up > 0), None)
    answered = max((s.calls_answered for s in samples), default=0)
    last_start = next((s.at for s in samples if s.calls_answered == answered), None)
    if first_end is None or last_start is None or last_start <= first_end:
        return None
    return first_end, last_start


def take_sample(service: Service) -> Sample:
    """The ``Sample`` of now."""
    times, stats = os.times(), service.engine.stats
    finals_cpu_s = service.engine.finalizer_cpu_seconds() or 0.0
    answered, hung_up = sip_calls(service.sip.counters)
    busy = busy_seconds()
    return Sample(
        at=time.monotonic(),
        behind_chunks=stats.behind_realtime_chunks,
        chunks=stats.chunks,
        cpu_s=times.user + times.system + finals_cpu_s,
        threads=thread_cpu_seconds(),
        finals_cpu_s=finals_cpu_s,
        machine_busy_s=busy.get(None),
        calls_answered=answered,
        calls_hung_up=hung_up,
        cores_busy_s={cpu: seconds for cpu, seconds in busy.items() if cpu is not None},
        full=service.engine.overloaded,
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


def cores_busy_between(start: Sample, end: Sample, cores: Collection[int]) -> float | None:
    """CPU seconds ``cores`` were busy together from ``start`` to ``end`` (None: a core without
    figures in either sample)."""
    if any(cpu not in start.cores_busy_s or cpu not in end.cores_busy_s for cpu in cores):
        return None
    return sum(end.cores_busy_s[cpu] - start.cores_busy_s[cpu] for cpu in cores)


def cores_busy_when_full(samples: list[Sample], service_cores: Collection[int]) -> tuple[float | None, float]:
    """(how busy ``service_cores`` were, as a share of their time, over the intervals between
    samples that began with the engine full, i.e. behind on its chunks or its finals; the
    seconds those intervals add up to). None when it never was, or a core has no figures."""
    busy = wall = 0.0
    for start, end in itertools.pairwise(samples):
        if not start.full:
            continue
        interval = cores_busy_between(start, end, service_cores)
        if interval is None:
            return None, 0.0
        busy += interval
        wall += end.at - start.at
    if wall <= 0 or not service_cores:
        return None, 0.0
    return round(busy / (wall * len(service_cores)), 3), round(wall, 1)


def cpu_figures(start: Sample, end: Sample, service_cores: Collection[int] = ()) -> dict[str, Any]:
    """CPU per wall second from ``start`` to ``end``: ``cpu_percent``, ``cores_used`` (this
    process and the finals processes), ``machine_cores_busy`` (None without ``/proc/stat``),
    ``cores_by_thread`` (threads that ended meanwhile left out; the finals processes together)
    and, with ``service_cores``, ``service_cores_busy``: how busy those cores were, whoever used
    them (the kernel included), as a share of their time (None without ``/proc/stat``)."""
    wall = max(1e-9, end.at - start.at)
    used = (end.cpu_s - start.cpu_s) / wall
    by_thread = {name: (busy - start.threads.get(name, 0.0)) / wall for name, busy in end.threads.items()}
    by_thread["finals processes"] = (end.finals_cpu_s - start.finals_cpu_s) / wall
    machine = (
        round((end.machine_busy_s - start.machine_busy_s) / wall, 2)
        if end.machine_busy_s is not None and start.machine_busy_s is not None
        else None
    )
    figures: dict[str, Any] = {
        "cpu_percent": round(100 * used, 1),
        "cores_used": round(used, 2),
        "machine_cores_busy": machine,
        # Threads under 0.005 cores are left out; the finals processes are always named (with
        # WeNet's rescoring, the default, two short calls' finals take under that).
        "cores_by_thread": {
            name: round(value, 3 if name == "finals processes" else 2)
            for name, value in sorted(by_thread.items())
            if value >= 0.005 or name == "finals processes"
        },
    }
    if service_cores:
        busy = cores_busy_between(start, end, service_cores)
        figures["service_cores_busy"] = None if busy is None else round(busy / (wall * len(service_cores)), 3)
    return figures
