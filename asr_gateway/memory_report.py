"""The SIGUSR2 memory report: what holds this process's memory, logged on demand.

RSS, the most numerous Python object types, and, when the process was started with
``python -X tracemalloc``, the code lines holding the most Python memory.
"""

from __future__ import annotations

import collections
import gc
import logging
import tracemalloc

from asr_core import memtrim

log = logging.getLogger(__name__)


def memory_report(top: int = 15) -> dict[str, object]:
    """RSS (MB), the ``top`` object types by count, and the ``top`` allocation sites (kB) when
    tracemalloc is tracing."""
    types = collections.Counter(type(o).__name__ for o in gc.get_objects())
    report: dict[str, object] = {"rss_mb": memtrim.rss_mb() or 0.0, "objects": dict(types.most_common(top))}
    if tracemalloc.is_tracing():
        stats = tracemalloc.take_snapshot().statistics("lineno")[:top]
        report["tracemalloc_kb"] = {str(stat.traceback): round(stat.size / 1024, 1) for stat in stats}
    return report


def log_memory_report() -> None:
    log.warning("memory report %s", memory_report())
