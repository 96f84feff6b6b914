"""``asr-bench e2e`` end to end: real sipp calls into the service with two scheduler threads,
and the CPU report by thread that shows where the cores go."""

from __future__ import annotations

import shutil

import pytest

from tests.bench_json import run_bench_module

pytestmark = pytest.mark.skipif(
    shutil.which("sipp") is None or shutil.which("redis-server") is None, reason="needs sipp and redis-server"
)


def test_two_schedulers_share_the_calls_and_the_cpu_is_reported_by_thread() -> None:
    args = ("e2e", "--calls", "2", "--seconds", "4", "--threads", "1", "--schedulers", "2")
    report = run_bench_module("deploy.bench.cli", *args, timeout=240)
    assert report["realtime_ok"] and report["calls_ended"] == 2 and report["cer"] == 0.0
    assert report["schedulers"] == 2 and report["torch_threads"] == 1
    by_thread = report["cores_by_thread"]
    # one call per scheduler thread: both decoded chunks; the loop handled SIP and RTP
    assert by_thread.get("asr-engine-0", 0) > 0 and by_thread.get("asr-engine-1", 0) > 0, by_thread
    assert by_thread.get("MainThread", 0) > 0 and by_thread.get("finals processes", 0) > 0, by_thread
    assert sum(by_thread.values()) <= report["cores_used"] + 0.05, (by_thread, report["cores_used"])
    assert report["cores_used"] <= report["machine_cores_busy"] + 0.05 <= report["machine_cores"] + 0.1, report


def test_steady_arrivals_replace_each_ended_call_and_judge_the_steady_stretch() -> None:
    """``--steady 1``: 4 calls up at once, each replaced once when it ends (8 calls in all,
    started evenly over a call's length); latencies over the stretch from the first hang-up to
    the last start; two finals workers, each a process of its own."""
    args = ("e2e", "--calls", "4", "--seconds", "4", "--threads", "1", "--steady", "1", "--finals-workers", "2")
    report = run_bench_module("deploy.bench.cli", *args, timeout=240)
    assert report["calls_ended"] == 8 and report["cer"] == 0.0 and not report["calls_failed"], report
    assert report["finals_workers"] == 2 and report["realtime_ok"] and report["finals_ok"], report
    assert 0 < report["steady_window_s"] < 2 * report["seconds"], report
    assert report["partial_latency_ms"]["p95"] is not None and report["final_latency_ms"]["p50"] is not None
