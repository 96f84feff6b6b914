"""`asr-bench engine`: one JSON object with the fields issue #4 names, and the CPU split between
the engine's process and the finals process; plus the stream-count search on its own."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.bench.engine_bench import largest_passing
from tests.bench_json import run_bench_module

pytestmark = pytest.mark.timeout(180)

FIELDS = {
    "streams",
    "chunk_ms",
    "left_chunks",
    "seconds",
    "realtime_ok",
    "rtf",
    "finals_rtf",
    "batch_size_mean",
    "batch_size_p95",
    "forward_ms_mean",
    "partial_latency_ms",
    "final_latency_ms",
    "kv_bytes_per_stream",
    "peak_rss_mb",
}


def run_bench(*args: str) -> dict[str, Any]:
    return run_bench_module("deploy.bench.engine_bench", "--arch", "small", "--threads", "1", *args, timeout=170)


@pytest.mark.parametrize(("finalizer", "piece_ms", "traced"), [("process", 80, True), ("thread", 20, False)])
def test_one_trial_reports_fields_and_cpu_split(finalizer: str, piece_ms: int, traced: bool) -> None:
    step = [] if traced else ["--eager-step"]
    report = run_bench("--streams", "3", "--seconds", "2", "--finalizer", finalizer, "--piece-ms", str(piece_ms), *step)
    assert set(report) >= FIELDS
    assert report["streams"] == 3 and report["finalizer"] == finalizer and report["piece_ms"] == piece_ms
    assert report["traced_step"] is traced
    assert report["finals"] == 3  # every stream's input ended mid-utterance: one final each
    assert report["chunks"] > 0 and report["rtf"] > 0
    assert set(report["partial_latency_ms"]) == {"p50", "p95", "p99"}
    if finalizer == "process":
        # The finals' CPU is counted once, in both numbers: rtf includes it.
        assert 0 < report["finals_rtf"] < report["rtf"]
    else:
        assert report["finals_rtf"] is None  # finals ran in this process, inside rtf


def test_largest_passing_finds_the_boundary() -> None:
    tried: list[int] = []

    def attempt(n: int) -> bool:
        tried.append(n)
        return n <= 37

    found = largest_passing(attempt, start=8)
    assert 34 <= found <= 37  # bisection stops within ~10 %
    assert found in tried
    assert 64 in tried  # doubled past the boundary before bisecting


def test_largest_passing_when_nothing_passes() -> None:
    assert largest_passing(lambda n: False, start=4) == 0
