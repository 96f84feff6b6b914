"""Give freed heap memory back to the OS: jemalloc's purge where the process runs on it
(``asr_common.allocator``), else glibc's ``malloc_trim``.

A long-running engine allocates tensors of many shapes (batch size and chunk length change every
tick) from several threads. glibc keeps the freed blocks in per-thread arenas, so the process's
resident size creeps up for hours although nothing leaks. ``malloc_trim(0)`` returns the free
pages at the top of every arena and the unused pages inside them; calling it about once a
minute keeps RSS flat at a cost of a few milliseconds. jemalloc, as this project configures it,
keeps every freed page for reuse (faster steps); purging all its arenas
(``mallctl("arena.<all>.purge")``) once a minute gives them back instead. Elsewhere (musl,
macOS) it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from collections.abc import Callable

from asr_common import allocator


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


JEMALLOC_ALL_ARENAS = 4096  # MALLCTL_ARENAS_ALL: "arena.4096.purge" purges every arena


@functools.cache
def _jemalloc_purge() -> Callable[[], int] | None:
    """jemalloc's purge of all arenas, where jemalloc is this process's malloc (preloaded)."""
    if not allocator.jemalloc_loaded():
        return None
    try:
        mallctl = ctypes.CDLL(None).mallctl
    except (OSError, AttributeError):
        return None
    mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    mallctl.restype = ctypes.c_int
    command = f"arena.{JEMALLOC_ALL_ARENAS}.purge".encode()
    return lambda: int(mallctl(command, None, None, None, 0))


def available() -> bool:
    return _jemalloc_purge() is not None or _malloc_trim() is not None


def trim() -> bool:
    """Release free heap memory to the OS; True when the allocator did (jemalloc: the purge
    succeeded; glibc: it gave some back)."""
    purge = _jemalloc_purge()
    if purge is not None:
        return purge() == 0
    function = _malloc_trim()
    return bool(function(0)) if function is not None else False


DEFAULT_INTERVAL_S = 60.0
"""How often a long-running loop trims (the engine threads' ``EngineOptions.trim_interval_s``,
the finals process)."""


class Periodic:
    """:func:`trim` at most once per ``interval_s`` (0: never), for a loop to call every turn."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._due = clock() + interval_s

    def __call__(self) -> bool:
        """Trim if the interval has passed since the last trim (or the start); whether it did."""
        if self.interval_s <= 0:
            return False
        now = self._clock()
        if now < self._due:
            return False
        trim()
        self._due = now + self.interval_s
        return True


def rss_mb(pid: int | str = "self") -> float | None:
    """Resident set size of a process in MB, from /proc (Linux); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None
