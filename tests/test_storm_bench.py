"""``asr-bench storm``: the trials' order (surge off and on alternated at each load), the JSON it
prints from the trials' e2e reports, the target check, and one real tiny storm on pinned cores."""

from __future__ import annotations

import os
from typing import Any

import pytest

from deploy.bench.storm import FIGURES, Trial, meets_target, parser, plan, storm, summarize
from tests.bench_json import run_bench_module
from tests.tool_marks import needs_redis_server, needs_sipp


def report(calls: int, surge: bool, refused: int = 0, partial_p95: float = 400.0, missing: int = 0) -> dict[str, Any]:
    """An ``asr-bench e2e`` report with the fields the storm reads."""
    placed = 2 * calls
    return {
        "model": "demo",
        "calls_placed": placed,
        "calls_started": placed - refused,
        "calls_refused": refused,
        "behind_realtime_fraction": 0.0 if surge else 0.3,
        "partial_latency_ms": {"p50": 100.0, "p95": partial_p95, "p99": partial_p95 + 100},
        "final_latency_ms": {"p50": 300.0, "p95": 900.0},
        "finals_missing": missing,
        "cores_used": 1.9,
        "service_core_share": 0.95,
        "service_cores_busy_when_full": 1.0 if refused else None,
        "full_s": 12.5 if refused else 0.0,
        "degraded_streams_peak": calls if surge else 0,
        "degraded_stream_seconds": 50.0 if surge else 0.0,
        "reduced_finals": 0,
        "reduced_finals_saturated": 0,
        "realtime_ok": surge,
        "cpus_seen": {"service": [1], "generators": [0]},
        "cer": 0.0,
    }


def test_surge_off_and_on_alternate_at_each_load_within_each_period() -> None:
    trials = plan(144, [1.0, 1.5, 2.0], repeats=2)
    labels = [trial.label for trial in trials]
    assert labels == ["1x off", "1x on", "1.5x off", "1.5x on", "2x off", "2x on"] * 2
    assert [trial.calls for trial in trials[:6:2]] == [144, 216, 288]
    assert [trial.repeat for trial in trials] == [0] * 6 + [1] * 6


def test_the_storm_json_groups_trials_by_load_and_setting_and_judges_surge_on_at_the_top_load() -> None:
    trials = plan(10, [1.0, 2.0], repeats=2)
    reports = [
        report(t.calls, t.surge, refused=3 if t.load == 2 and not t.surge else 0, partial_p95=400.0 + t.repeat)
        for t in trials
    ]
    result = summarize(trials, reports)
    assert list(result["loads"]) == ["1x", "2x"]
    top = result["loads"]["2x"]
    assert top["calls"] == 20 and set(top) == {"calls", "off", "on"}
    assert [set(figures) for figures in top["on"]["trials"]] == [set(FIGURES)] * 2
    assert [t["calls_refused"] for t in top["off"]["trials"]] == [3, 3]
    assert top["on"]["median"]["partial_p95_ms"] == 400.5 and top["off"]["median"]["calls_refused"] == 3
    assert result["target"] == {"rule": result["target"]["rule"], "load": "2x", "trials": [True, True], "met": True}


@pytest.mark.parametrize(
    ("change", "met"),
    [({}, True), ({"refused": 1}, False), ({"partial_p95": 1501.0}, False), ({"missing": 1}, False)],
)
def test_the_target_wants_no_refusal_partials_within_1_5_s_and_every_final(change: dict[str, Any], met: bool) -> None:
    trials = [Trial(2.0, 4, True, 0)]
    result = summarize(trials, [report(4, True, **change)])
    assert result["target"]["met"] is met
    assert meets_target({"error": "no report"}) is False


def test_a_trial_without_a_report_is_named_and_fails_the_target() -> None:
    """Each trial's e2e options and the ``--surge`` of the on trials come from the storm's own."""
    args = parser().parse_args(["--base-calls", "4", "--loads", "1,2", "--seconds", "6", "--attention-beam", "0"])
    seen: list[tuple[str, list[str]]] = []

    def run(trial: Trial, options: list[str], timeout_s: float) -> dict[str, Any]:
        seen.append((trial.label, options))
        if trial.load == 2 and trial.surge:
            return {"error": "2x on: no report within 300 s"}
        return report(trial.calls, trial.surge)

    result = storm(args, run)
    assert result["order"] == [label for label, _ in seen] == ["1x off", "1x on", "2x off", "2x on"]
    assert seen[0][1] == ["--seconds", "6", "--threads", "1", "--steady", "1", "--attention-beam", "0"]
    assert result["loads"]["2x"]["on"]["trials"] == [{"error": "2x on: no report within 300 s"}]
    assert result["loads"]["2x"]["on"]["median"]["calls_refused"] is None
    assert result["target"]["met"] is False and result["model"] == "demo"
    assert result["machine"]["machine_cores"] == os.cpu_count()


@needs_sipp
@needs_redis_server
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_a_tiny_storm_runs_each_trial_as_a_fresh_service_on_its_cores() -> None:
    """Two calls of 4 s, surge off then on, the service on one core and sipp and redis-server
    on another: nothing refused or missing at this load, and each side stayed on its core."""
    cores = sorted(os.sched_getaffinity(0))
    service, generators = str(cores[1]), str(cores[0])
    args = ("storm", "--base-calls", "2", "--loads", "1", "--seconds", "4", "--steady", "0")
    result = run_bench_module("deploy.bench.cli", *args, "--service-cpus", service, "--generator-cpus", generators,
                              timeout=420)  # fmt: skip
    assert result["order"] == ["1x off", "1x on"] and result["service_cpus"] == [cores[1]]
    for setting in ("off", "on"):
        (figures,) = result["loads"]["1x"][setting]["trials"]
        assert figures["calls_refused"] == 0 and figures["finals_missing"] == 0, figures
        assert figures["calls_started"] == figures["calls_placed"] == 2, figures
        assert figures["cpus_seen"] == {"service": [cores[1]], "generators": [cores[0]]}, figures
        assert 0 < figures["service_core_share"] <= 1.05, figures
    assert result["target"]["met"], result["target"]
