"""`asr_common.proc_cpu`: another process's CPU time, finer than clock ticks where the kernel keeps
per-thread run times, and None for a process that is gone."""

from __future__ import annotations

import os
import subprocess
import sys

from asr_common.proc_cpu import process_cpu_seconds


def test_a_running_process_reads_its_cpu_time_and_a_gone_one_none() -> None:
    script = "import sys; sum(range(3_000_000)); print('busy', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"busy\n"  # it has run
        first = process_cpu_seconds(child.pid)
        assert first is not None and first > 0
        if os.path.exists("/proc/self/schedstat"):  # nanoseconds, not 10 ms ticks
            assert first * 100 != int(first * 100)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    assert process_cpu_seconds(child.pid) is None  # reaped: no /proc entry
