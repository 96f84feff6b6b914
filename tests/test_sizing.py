"""`asr-bench sizing`: the engine bench's search per (arch, chunk) pair under a time budget, one
JSON object and a Markdown table. Only the bundled demo model runs here, with a tiny budget."""

from __future__ import annotations

import math

import pytest

from deploy.bench.sizing import SizingRow, engine_argv_for, markdown_table, parse_args
from tests.bench_json import run_bench_module

pytestmark = pytest.mark.timeout(200)


def row(**changes: object) -> SizingRow:
    values: dict[str, object] = {
        "arch": "aishell",
        "model": "random weights, CTC head calibrated",
        "parameters": 48_347_803,
        "d_model": 256,
        "chunk_ms": 160,
        "left_chunks": 8,
        "max_realtime_streams": 72,
        "cores_used": 1.57,
        "streams_per_core": 45.9,
        "partial_p95_ms": 210.5,
        "final_p95_ms": 900.0,
        "trials": 7,
        "search_s": 120.0,
        "cut_short": False,
        "command": "asr-bench engine --arch aishell --find-max --chunk-ms 160",
    }
    values.update(changes)
    return SizingRow(**values)  # type: ignore[arg-type]


def test_engine_arguments_take_the_defaults_unless_given_again() -> None:
    argv = engine_argv_for("aishell", 320, ["--seconds", "4", "--start=3"])
    assert argv[:5] == ["--arch", "aishell", "--find-max", "--chunk-ms", "320"]
    assert "--backend" in argv and argv[argv.index("--backend") + 1] == "torch-int8"
    assert argv.count("--seconds") == 1 and argv[argv.index("--seconds") + 1] == "4"
    # A later chunk of the same model starts from the shorter chunk's count.
    later = engine_argv_for("demo", 640, ["--start", "3"], start=40)
    assert later[:2] == ["--model", "asr_core/demo_model"]
    assert later.count("--start") == 1 and later[-2:] == ["--start", "40"]


def test_table_marks_searches_the_budget_cut_short() -> None:
    table = markdown_table(
        [row(), row(arch="demo", cut_short=True, max_realtime_streams=16, streams_per_core=None, final_p95_ms=math.nan)]
    )
    lines = table.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| model |")
    assert "| 72 | 1.57 | 45.9 | 210.5 ms | 900 ms |" in lines[2] and "48.3 M" in lines[2]
    assert "| ≥ 16 |" in lines[3] and lines[3].endswith("| — | 210.5 ms | — |")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arch", "demo,large"], "unknown large"),
        (["--chunk-ms", "160,fast"], "whole milliseconds"),
        (["--budget-s", "0"], "must be positive"),
        (["--fast"], "drop --fast"),
        (["--hotwords-ab", "10"], "drop --hotwords-ab"),
    ],
)
def test_bad_options_are_refused_before_any_model_loads(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        parse_args(argv)


def test_demo_model_with_a_tiny_budget() -> None:
    report = run_bench_module(
        "deploy.bench.sizing",
        *("--arch", "demo", "--chunk-ms", "320", "--budget-s", "12", "--seconds", "1", "--start", "2"),
        timeout=190,
    )
    (only,) = report["rows"]
    assert only["arch"] == "demo" and only["chunk_ms"] == 320 and only["d_model"] == 144
    assert only["trials"] >= 1 and only["max_realtime_streams"] >= 0
    assert only["command"].startswith("asr-bench engine --model asr_core/demo_model --find-max --chunk-ms 320")
    assert "--backend torch-int8" in only["command"]
    if only["cut_short"]:
        assert only["streams_per_core"] is None and "≥" in report["markdown"]
    assert report["machine"]["cpus"] >= 1 and report["markdown"].count("\n") == 2
