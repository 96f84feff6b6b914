"""CPU time another process has used, read from Linux's ``/proc``.

Each of its threads' ``schedstat`` gives run time in nanoseconds; where the kernel keeps none
(schedstat off: every reading 0) the process's ``stat`` gives user + system time in clock
ticks, 10 ms each, too coarse for a few short pieces of work (they round to none).
"""

from __future__ import annotations

import os


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used so far; None when unknown (gone, or not Linux)."""
    try:
        total_ns = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total_ns += int(f.read().split()[0])
        if total_ns:
            return total_ns / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
