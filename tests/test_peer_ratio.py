"""``asr-bench peer-ratio``: the shared harness run as its README runs it, rounds alternated,
ratios on each harness (the measurements themselves are benchmarks, not tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from asr_common import allocator
from deploy.bench import peer_ratio

FAKE_HARNESS = """
import json, sys
argv = sys.argv[1:]
out = argv[argv.index("--out") + 1]
streams = 9 if "--rule" in argv and argv[argv.index("--rule") + 1] == "p95" else 0
with open(out, "w") as f:
    json.dump({"argv": argv, "max_realtime_streams": streams, "trials": [{}, {}],
               "confirm": {"lag_ms_p95": 120.0, "worker_utilisation": 0.9,
                           "decode_ms_per_chunk_mean": 5.0, "cpu_busy_pct": 97.0}}, f)
print("the harness's stdout is not parsed")
"""


def _settings(harness: Path) -> peer_ratio.Settings:
    return peer_ratio.Settings(harness, 4, 8, 2, 8.0, 16.0, 8.0, 16, 8)


def test_shared_harness_runs_as_its_readme_says(tmp_path: Path) -> None:
    harness = tmp_path / "sherpa_bench.py"
    harness.write_text(FAKE_HARNESS, encoding="utf-8")
    result = peer_ratio.run_shared_harness(_settings(harness), tmp_path / "sherpa", tmp_path, 0)
    assert result["max_realtime_streams"] == 9 and result["trials"] == 2
    assert result["lag_ms_p95_at_max"] == 120.0 and result["machine_cpu_busy_pct_at_max"] == 97.0
    argv = json.loads((tmp_path / "shared_round0.json").read_text(encoding="utf-8"))["argv"]
    assert argv[argv.index("--model-dir") + 1] == str(tmp_path / "sherpa")
    assert "--int8" in argv and "--find-max" in argv
    for option, value in {"--chunk-size": "4", "--left-chunks": "8", "--pool": "2", "--threads": "1"}.items():
        assert argv[argv.index(option) + 1] == value
    assert "--max-batch" not in argv  # the harness's own default (3, as sherpa-onnx's server)


def test_a_harness_without_a_result_stops_the_run(tmp_path: Path) -> None:
    harness = tmp_path / "broken.py"
    harness.write_text("import sys; sys.exit(3)\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="exited 3"):
        peer_ratio.run_shared_harness(_settings(harness), tmp_path, tmp_path, 0)


def test_the_shared_harness_gets_a_shells_allocator() -> None:
    environ = {
        "LD_PRELOAD": f"{allocator.LIBRARY} libother.so",
        "MALLOC_CONF": allocator.CONF,
        "PATH": "/usr/bin",
    }
    assert peer_ratio.new_user_environment(environ) == {"LD_PRELOAD": "libother.so", "PATH": "/usr/bin"}
    assert peer_ratio.new_user_environment({"LD_PRELOAD": allocator.LIBRARY, "MALLOC_CONF": "narenas:1"}) == {
        "MALLOC_CONF": "narenas:1"  # a user's own setting stays
    }


def test_rounds_alternate_and_later_rounds_start_near_the_last_figure() -> None:
    calls: list[tuple[str, int, int]] = []

    def figure(name: str, value: int) -> Any:
        def measure(index: int, start: int) -> dict[str, Any]:
            calls.append((name, index, start))
            return {"max_realtime_streams": value + index}

        return measure

    measure = {"shared": figure("shared", 10), "ours": figure("ours", 40), "sherpa_peer": figure("sherpa_peer", 8)}
    rounds = peer_ratio.run_rounds(_settings(Path(sys.executable)), 2, measure)
    assert [name for name, _, _ in calls] == ["shared", "ours", "sherpa_peer"] * 2
    assert calls[1] == ("ours", 0, 16) and calls[2] == ("sherpa_peer", 0, 8)
    assert calls[4] == ("ours", 1, 30) and calls[5] == ("sherpa_peer", 1, 6)
    summary = peer_ratio.summarise(rounds)
    assert summary["per_round"][0] == {
        "shared": 10,
        "ours": 40,
        "sherpa_peer": 8,
        "ratio_on_shared_harness": 4.0,
        "ratio_on_sherpa_peer_harness": 5.0,
        "peer_shared_over_sherpa_peer": 1.25,
    }
    assert summary["median"]["ours"] == 40.5
    assert summary["median"]["ratio_on_shared_harness"] == pytest.approx((4.0 + 3.73) / 2, abs=0.006)


def test_a_peer_of_zero_streams_has_no_ratio() -> None:
    rounds = [{"shared": {"max_realtime_streams": 0}, "ours": {"max_realtime_streams": 4},
               "sherpa_peer": {"max_realtime_streams": 2}}]  # fmt: skip
    summary = peer_ratio.summarise(rounds)
    assert summary["per_round"][0]["ratio_on_shared_harness"] is None
    assert summary["median"]["ratio_on_shared_harness"] is None
    assert summary["median"]["ratio_on_sherpa_peer_harness"] == 2.0


def test_where_ours_stops_shows_the_first_failing_count() -> None:
    def trial(streams: int, final_p95: float) -> dict[str, Any]:
        return {
            "streams": streams, "cores_used": 1.5, "rtf": 0.02, "finals_rtf": 0.008, "forward_ms_mean": 30.0,
            "batch_size_mean": 12.0, "tail_partial_latency_ms": {"p50": 90.0, "p95": 200.0},
            "final_latency_ms": {"p50": 500.0, "p95": final_p95},
        }  # fmt: skip

    trials = [trial(16, 600.0), trial(32, 3000.0), trial(24, 2500.0), trial(20, 900.0)]
    stops = peer_ratio.where_ours_stops(trials, 20)
    assert stops["at_max"]["streams"] == 20 and stops["first_fail"]["streams"] == 24
    assert stops["first_fail"]["final_latency_ms"]["p95"] == 2500.0
    assert peer_ratio.where_ours_stops([], 0) == {"at_max": None, "first_fail": None}


def test_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        peer_ratio.parse_args(["--shared-harness", str(tmp_path / "missing.py")])
    harness = tmp_path / "sherpa_bench.py"
    harness.write_text("", encoding="utf-8")
    with pytest.raises(SystemExit):
        peer_ratio.parse_args(["--shared-harness", str(harness), "--rounds", "0"])
    args = peer_ratio.parse_args(["--shared-harness", str(harness)])
    argv = peer_ratio.engine_argv(args)
    assert argv[argv.index("--backend") + 1] == "torch-int8" and "--no-rescore" not in argv
