"""``asr-bench e2e`` end to end: real sipp calls into the service with two scheduler threads,
and the CPU report by thread that shows where the cores go; the steady window's CPU arithmetic
without sipp."""

from __future__ import annotations

from typing import Any

from asr_gateway.dev.demo import Received
from deploy.bench.e2e_cpu import Sample, bracket, cores_busy_when_full, cpu_figures, sip_calls, steady_window
from deploy.bench.e2e_events import calls_admitted, finals_missing
from tests.bench_json import run_bench_module
from tests.tool_marks import needs_redis_server, needs_sipp


def sample(at: float, cpu_s: float, threads: dict[str, float], finals_cpu_s: float, machine: float | None) -> Sample:
    return Sample(at, 0, int(100 * at), cpu_s, threads, finals_cpu_s, machine)


def test_cpu_over_the_steady_window_comes_from_the_samples_around_it() -> None:
    """Ramp up (0-1 s) and down (3-4 s) at 0.5 cores, the steady stretch at 1.8: the window's
    figures are the steady ones, the whole run's lower; a thread started within the window counts
    from zero, one that ended before its end is left out."""
    samples = [
        sample(0.0, 0.0, {"MainThread": 0.0, "asr-engine-0": 0.0}, 0.0, 10.0),
        sample(1.0, 0.5, {"MainThread": 0.1, "asr-engine-0": 0.3, "gone": 0.05}, 0.1, 10.7),
        sample(2.0, 2.3, {"MainThread": 0.4, "asr-engine-0": 1.3, "kb-hooks": 0.1}, 0.6, 12.7),
        sample(3.0, 4.1, {"MainThread": 0.7, "asr-engine-0": 2.3, "kb-hooks": 0.2}, 1.1, 14.7),
        sample(4.0, 4.6, {"MainThread": 0.8, "asr-engine-0": 2.6, "kb-hooks": 0.2}, 1.2, 15.4),
    ]
    start, end = bracket(samples, (1.2, 2.9))
    assert (start.at, end.at, end.chunks - start.chunks) == (1.0, 3.0, 200)
    assert cpu_figures(start, end) == {
        "cpu_percent": 180.0,
        "cores_used": 1.8,
        "machine_cores_busy": 2.0,
        "cores_by_thread": {"MainThread": 0.3, "asr-engine-0": 1.0, "finals processes": 0.5, "kb-hooks": 0.1},
    }
    whole = cpu_figures(samples[0], samples[-1])
    assert (whole["cores_used"], whole["machine_cores_busy"]) == (1.15, 1.35)
    # a window reaching past the samples takes the first and the last; no /proc/stat: no machine figure
    assert bracket(samples, (-1.0, 9.0)) == (samples[0], samples[-1])
    assert cpu_figures(samples[0]._replace(machine_busy_s=None), samples[1])["machine_cores_busy"] is None
    # the service's cores: busy 1.9 of 2 core-seconds over the window; a core without figures: None
    start, end = start._replace(cores_busy_s={0: 5.0, 1: 5.0}), end._replace(cores_busy_s={0: 7.0, 1: 6.8})
    assert cpu_figures(start, end, [0, 1])["service_cores_busy"] == 0.95
    assert cpu_figures(start, end, [0, 1, 2])["service_cores_busy"] is None
    assert "service_cores_busy" not in cpu_figures(start, end)


def test_the_steady_window_runs_from_the_first_hang_up_to_the_last_answer_the_sip_layer_counted() -> None:
    """Calls answered 0-2 s, the first BYE counted at 1.5 s, the last call answered at 2.5 s:
    the window is 1.5-2.5 s whatever the subscriber's events say (their ``call.ended`` waits for
    the finals); no hang-up before the last answer, or none at all: no steady stretch."""

    def at(t: float, answered: int, hung_up: int) -> Sample:
        return sample(t, 0.0, {}, 0.0, None)._replace(calls_answered=answered, calls_hung_up=hung_up)

    samples = [at(0.0, 0, 0), at(0.5, 4, 0), at(1.0, 8, 0), at(1.5, 10, 1), at(2.0, 12, 3), at(2.5, 14, 5),
               at(3.0, 14, 9), at(3.5, 14, 14)]  # fmt: skip
    assert steady_window(samples) == (1.5, 2.5)
    assert steady_window([at(0.0, 0, 0), at(1.0, 8, 0), at(2.0, 8, 3)]) is None  # all answered before a hang-up
    assert steady_window([at(0.0, 0, 0), at(1.0, 8, 0)]) is None
    # the SIP layer's counters: refusals and our own hang-ups are not the caller's BYE
    counters = {"invites.accepted": 7, "calls.ended.bye": 2, "calls.ended.error": 4, "responses.503": 9}
    assert sip_calls(counters) == (7, 2)


def test_cores_busy_when_full_counts_only_the_stretches_that_began_full() -> None:
    """Core 1 busy 0.5 of the first second (room left), 1.0 of the next two (full), 0.6 of the
    last (full): 1.6 of 2 s full -> 0.8; never full, or a core without figures: None."""

    def at(t: float, busy: float, full: bool) -> Sample:
        return sample(t, 0.0, {}, 0.0, None)._replace(cores_busy_s={0: 0.0, 1: busy}, full=full)

    samples = [at(0.0, 0.0, False), at(1.0, 0.5, True), at(2.0, 1.5, False), at(3.0, 1.5, True), at(4.0, 2.1, True)]
    assert cores_busy_when_full(samples, [1]) == (0.8, 2.0)
    assert cores_busy_when_full([s._replace(full=False) for s in samples], [1]) == (None, 0.0)
    assert cores_busy_when_full(samples, [1, 2]) == (None, 0.0)


def event(kind: str, call_id: str, **fields: Any) -> Received:
    return Received({"event_type": kind, "call_id": call_id, **fields}, 0.0)


def test_a_call_misses_its_finals_when_it_never_ended_or_no_final_reached_its_last_sentence() -> None:
    """Last sentence's middle at 9 s: ``a`` got a final past it and ended; ``b`` ended with its
    finals short of it; ``c`` got it but never ended; ``d`` was refused (never started)."""
    received = [
        *(event("call.started", call_id) for call_id in "abc"),
        event("transcript.final", "a", end_offset_ms=4000),
        event("transcript.final", "a", end_offset_ms=11000),
        event("transcript.final", "b", end_offset_ms=4000),
        event("transcript.final", "c", end_offset_ms=11000),
        event("transcript.final", "d", end_offset_ms=11000),
        event("call.ended", "a"),
        event("call.ended", "b"),
    ]
    admitted = calls_admitted(received)
    assert admitted == {"a", "b", "c"}
    assert finals_missing(received, admitted, 9000.0) == 2


@needs_sipp
@needs_redis_server
def test_two_schedulers_share_the_calls_and_the_cpu_is_reported_by_thread() -> None:
    args = ("e2e", "--calls", "2", "--seconds", "4", "--threads", "1", "--schedulers", "2")
    report = run_bench_module("deploy.bench.cli", *args, timeout=240)
    assert report["realtime_ok"] and report["calls_ended"] == 2 and report["cer"] == 0.0
    assert report["schedulers"] == 2 and report["torch_threads"] == 1
    by_thread = report["cores_by_thread"]
    # one call per scheduler thread: both decoded chunks; the loop handled SIP and RTP
    assert by_thread.get("asr-engine-0", 0) > 0 and by_thread.get("asr-engine-1", 0) > 0, by_thread
    assert by_thread.get("MainThread", 0) > 0 and "finals processes" in by_thread, by_thread
    assert sum(by_thread.values()) <= report["cores_used"] + 0.05, (by_thread, report["cores_used"])
    assert report["cores_used"] <= report["machine_cores_busy"] + 0.05 <= report["machine_cores"] + 0.1, report
    assert report["cpu_window"] == "whole run" and "whole_run" not in report, report
    assert 0 < report["service_cores_busy"] <= 1.0, report


@needs_sipp
@needs_redis_server
def test_steady_arrivals_replace_each_ended_call_and_judge_the_steady_stretch() -> None:
    """``--steady 1``: 4 calls up at once, each replaced once when it ends (8 calls in all,
    started evenly over a call's length); latencies over the stretch from the first hang-up to
    the last start; two finals workers, each a process of its own."""
    args = ("e2e", "--calls", "4", "--seconds", "4", "--threads", "1", "--steady", "1", "--finals-workers", "2")
    report = run_bench_module("deploy.bench.cli", *args, timeout=240)
    assert report["calls_ended"] == 8 and report["cer"] == 0.0 and not report["calls_failed"], report
    assert report["finals_workers"] == 2 and report["realtime_ok"] and report["finals_ok"], report
    assert 0 < report["steady_window_s"] < 2 * report["seconds"], report
    assert report["service_cores_busy_when_full"] is None and report["full_s"] == 0.0, report  # 4 calls: room
    assert report["partial_latency_ms"]["p95"] is not None and report["final_latency_ms"]["p50"] is not None
    # the CPU over the same steady stretch, the whole run's beside it
    assert report["cpu_window"] == "steady" and report["cores_used"] > 0, report
    assert set(report["whole_run"]) == {"cores_used", "machine_cores_busy", "service_cores_busy"}, report
    assert report["whole_run"]["cores_used"] > 0
    assert report["cores_by_thread"].get("finals processes", 0) > 0, report
