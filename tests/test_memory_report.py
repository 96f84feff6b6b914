"""The SIGUSR2 memory report: RSS, object counts, and allocation sites when tracemalloc traces."""

from __future__ import annotations

import tracemalloc

from asr_gateway.memory_report import memory_report


def test_memory_report_names_what_holds_memory() -> None:
    report = memory_report(top=5)
    assert isinstance(report["rss_mb"], float) and report["rss_mb"] > 10
    objects = report["objects"]
    assert isinstance(objects, dict) and len(objects) == 5 and all(n > 0 for n in objects.values())
    assert "tracemalloc_kb" not in report

    tracemalloc.start()
    try:
        held = [bytearray(1024) for _ in range(2000)]  # ~2 MB from one line
        sites = memory_report(top=3)["tracemalloc_kb"]
    finally:
        tracemalloc.stop()
    assert isinstance(sites, dict)
    site, kb = next(iter(sites.items()))
    assert "test_memory_report.py" in site and kb >= 2000
    assert len(held) == 2000
