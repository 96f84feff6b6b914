"""deploy/bench/gpu.sh and gpu_run.py: the parts that run without a GPU (options, dry run, rehearsal, summary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deploy.bench import gpu_run

SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "bench" / "gpu.sh"


def run(*args: str, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def test_syntax_and_help(tmp_path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0
    result = run("--help", tmp_path=tmp_path)
    assert result.returncode == 0 and "--pack DIR --out OUT" in result.stdout


def test_bad_options_are_refused(tmp_path: Path) -> None:
    assert run("--frobnicate", tmp_path=tmp_path).returncode == 2
    missing_out = run("--pack", str(tmp_path), tmp_path=tmp_path)
    assert missing_out.returncode == 2 and "--out DIR is required" in missing_out.stderr
    missing_pack = run("--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert missing_pack.returncode == 2 and "--pack DIR is required" in missing_pack.stderr
    empty_pack = run("--pack", str(tmp_path), "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert empty_pack.returncode == 2 and "no hotline_asr wheel" in empty_pack.stderr
    no_value = run("--pack", str(tmp_path), "--out", str(tmp_path / "out"), "--streams", tmp_path=tmp_path)
    assert no_value.returncode == 2 and "--streams needs a value" in no_value.stderr


def test_dry_run_installs_from_the_pack_alone(tmp_path: Path) -> None:
    result = run("--dry-run", "--pack", str(tmp_path), "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dry_run"] is True
    assert "pip install -q --no-index --find-links" in result.stderr and "--no-deps" in result.stderr
    assert "deploy.bench.gpu_run --out" in result.stderr


def test_configurations_on_a_cpu_skip_what_needs_cuda() -> None:
    configs, skipped = gpu_run.configurations(["torch", "torch-cudagraph"], ["bfloat16", "float16"], "cpu")
    assert configs == [("torch", "float32")]
    assert "torch-cudagraph: needs CUDA" in skipped and len(skipped) == 3
    configs, skipped = gpu_run.configurations(["torch", "torch-cudagraph"], ["bfloat16", "float16"], "cuda")
    assert len(configs) == 4 and skipped == []


def test_summary_takes_the_largest_passing_level_and_the_batching_gain() -> None:
    def trial(backend: str, streams: int, max_batch: int, passed: bool) -> dict:
        return {
            "backend": backend, "dtype": "bfloat16", "streams": streams, "max_batch": max_batch, "passed": passed,
            "tail_partial_latency_ms": {"p50": 40.0, "p95": 90.0}, "gpu_mb_per_stream": 0.5,
            "gpu_sampled": {"utilization_mean_percent": 70.0, "utilization_max_percent": 90.0},
        }  # fmt: skip

    trials = [
        trial("torch", 1000, 1024, True),
        trial("torch-cudagraph", 1000, 1024, True),
        trial("torch", 16, 1, True),
        trial("torch", 32, 1, False),
        trial("torch", 4000, 1024, False),
        trial("torch-cudagraph", 4000, 1024, True),
    ]
    configs = [("torch", "bfloat16"), ("torch-cudagraph", "bfloat16")]
    summary = gpu_run.summarize(trials, configs, {"device_name": "GPU"})
    assert summary["max_realtime_streams"] == {"torch/bfloat16": 1000, "torch-cudagraph/bfloat16": 4000}
    assert summary["best_config"] == "torch-cudagraph/bfloat16" and summary["best_streams"] == 4000
    assert summary["batch1_max_realtime_streams"] == 16 and summary["batching_gain_vs_batch1"] == 62.5
    assert summary["gpu_utilization_mean_percent_at_best"] == 70.0 and summary["gpu_name"] == "GPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_run_without_a_gpu_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_run.main(["--out", str(tmp_path), "--device", "cuda"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert "no CUDA device" in report["error"] and report["gpu"]["cuda_available"] is False
    assert json.loads((tmp_path / gpu_run.SUMMARY_FILE).read_text())["error"] == report["error"]


def test_cpu_rehearsal_prints_one_summary(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run(
        "--skip-install", "--out", str(out), "--device", "cpu", "--dry-run-gpu", "--arch", "small",
        "--streams", "2", "--batch1-streams", "", "--seconds", "1", "--budget-s", "200",
        tmp_path=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    (trial,) = summary["trials"]
    assert trial["backend"] == "torch" and trial["dtype"] == "float32" and trial["streams"] == 2
    # Two streams of the small model take about 0.2 of a core (partial p95 about 30 ms against the
    # rule's 300 ms on the 2-core development CPU): a trial that does not pass is a broken rehearsal.
    assert trial["error"] is None and trial["passed"] is True
    assert summary["max_realtime_streams"] == {"torch/float32": 2}
    assert "torch-cudagraph: needs CUDA" in summary["skipped"]
    assert json.loads((out / gpu_run.SUMMARY_FILE).read_text())["trials"] == summary["trials"]
    assert (out / gpu_run.TRIALS_FILE).read_text().count("\n") == 1 and "gpu_run exit 0" in (
        out / "gpu_run.log"
    ).read_text()
