"""Pinned cores for the benchmarks (Linux): the service on some cores, its load generators on others.

A bench that loads the service from the same machine (sipp, redis-server) takes cores from it;
pinned apart (``--service-cpus 1 --generator-cpus 0``), the service's CPU can be judged against
the cores it was given. Affinity is per thread on Linux: ``pin`` sets it on every thread a
process has now, and threads and processes started later inherit it from the thread that
starts them. ``cpus_seen`` reads back what the running processes are allowed, so a report
shows the pinning held rather than what was asked.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection
from pathlib import Path

GENERATORS = frozenset({"sipp", "redis-server", "taskset"})
"""Process names (``/proc/PID/comm``) of the load generators a bench starts."""
PROC = Path("/proc")


class AffinityError(ValueError):
    """A core list that cannot be used; the message says which cores exist."""


def parse_cpus(text: str) -> frozenset[int]:
    """``"0,2-3"`` -> {0, 2, 3} (``taskset -c``'s list form); the cores must be ones this
    process may run on (``os.sched_getaffinity``)."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise AffinityError(f"{text!r} is not a core list: write it like 1 or 0,2-3") from None
    usable = os.sched_getaffinity(0)
    if not cpus or not cpus <= usable:
        raise AffinityError(f"cores {text!r}: this process may use only {format_cpus(usable)}; pick among those")
    return frozenset(cpus)


def cpu_list(text: str) -> frozenset[int]:
    """``parse_cpus`` as an ``argparse`` type (its message in the usage error)."""
    try:
        return parse_cpus(text)
    except AffinityError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_cpus(cpus: Collection[int]) -> str:
    """{0, 2, 3} -> ``"0,2,3"``."""
    return ",".join(str(cpu) for cpu in sorted(cpus))


def pin(pid: int, cpus: Collection[int]) -> None:
    """Run every thread ``pid`` has now on ``cpus`` only (0: this process); threads that end
    meanwhile are skipped."""
    target = os.getpid() if pid == 0 else pid
    for tid in os.listdir(PROC / str(target) / "task"):
        try:
            os.sched_setaffinity(int(tid), set(cpus))
        except ProcessLookupError:  # the thread ended meanwhile
            continue


def _children(pid: int) -> list[int]:
    """The processes ``pid``'s threads started (``/proc/PID/task/TID/children``, Linux 3.5 on)."""
    found: list[int] = []
    for tid in os.listdir(PROC / str(pid) / "task"):
        try:
            found += [int(child) for child in (PROC / str(pid) / "task" / tid / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _descendants(root: int) -> list[int]:
    """The processes started by ``root``, their children and so on."""
    found: list[int] = []
    pending = [root]
    while pending:
        try:
            children = _children(pending.pop())
        except OSError:  # ended meanwhile
            continue
        found += children
        pending += children
    return found


def _allowed(pid: int) -> tuple[str, set[int]]:
    """(process name, the cores any of its threads may run on)."""
    name = (PROC / str(pid) / "comm").read_text().strip()
    cpus: set[int] = set()
    for tid in os.listdir(PROC / str(pid) / "task"):
        try:
            cpus |= os.sched_getaffinity(int(tid))
        except ProcessLookupError:
            continue
    return name, cpus


def cpus_seen() -> dict[str, set[int]]:
    """The cores allowed to this process's threads and the processes it started, in two groups:
    ``generators`` (sipp, redis-server: ``GENERATORS``) and ``service`` (this process and the rest,
    the finals processes among them)."""
    seen: dict[str, set[int]] = {"service": set(), "generators": set()}
    for pid in [os.getpid(), *_descendants(os.getpid())]:
        try:
            name, cpus = _allowed(pid)
        except OSError:  # ended meanwhile
            continue
        seen["generators" if name in GENERATORS else "service"] |= cpus
    return seen
