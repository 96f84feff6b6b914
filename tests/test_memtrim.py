"""asr_core.memtrim gives freed heap pages back to the OS (what keeps a long soak's RSS flat)."""

from __future__ import annotations

import numpy as np
import pytest

from asr_core import memtrim

pytestmark = pytest.mark.skipif(not memtrim.available(), reason="malloc_trim needs glibc")


def rss_mb() -> float:
    rss = memtrim.rss_mb()
    assert rss is not None, "no VmRSS in /proc/self/status"
    return rss


def test_trim_returns_freed_heap_pages() -> None:
    memtrim.trim()
    # 100 KB blocks stay below glibc's mmap threshold, so they come from the heap; keeping every
    # 16th alive pins the heap top, so free() alone cannot shrink it: only malloc_trim can.
    blocks = [np.ones(100_000 // 8) for _ in range(3000)]
    kept = blocks[::16]
    del blocks
    before = rss_mb()
    assert memtrim.trim() is True
    after = rss_mb()
    assert before - after > 100, (before, after)
    assert len(kept) == 188


def test_periodic_trims_once_per_interval_and_never_at_zero() -> None:
    now = [100.0]
    trim = memtrim.Periodic(60.0, clock=lambda: now[0])
    turns = []
    for now[0] in (100.0, 159.9, 160.0, 200.0, 219.9, 220.0, 500.0):
        turns.append(trim())
    assert turns == [False, False, True, False, False, True, True]
    never = memtrim.Periodic(0.0, clock=lambda: now[0])
    now[0] += 1e6
    assert never() is False
