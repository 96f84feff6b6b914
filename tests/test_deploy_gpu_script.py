"""deploy/bench/gpu.sh: the parts that run without a GPU (syntax, options, dry run, summary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "bench" / "gpu.sh"


def run(*args: str, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def test_syntax_and_help(tmp_path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0
    result = run("--help", tmp_path=tmp_path)
    assert result.returncode == 0 and "--wheels DIR" in result.stdout


def test_unknown_option_and_missing_wheels(tmp_path: Path) -> None:
    assert run("--frobnicate", tmp_path=tmp_path).returncode == 2
    result = run(tmp_path=tmp_path)
    assert result.returncode == 2 and "--wheels DIR is required" in result.stderr


def test_dry_run_lists_every_backend_and_level(tmp_path: Path) -> None:
    result = run("--dry-run", "--wheels", str(tmp_path), "--streams", "64 512", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dry_run"] is True
    assert "pip install --no-index --find-links" in result.stderr
    for backend in ("torch", "torch-cudagraph", "tensorrt-fp16", "tensorrt-int8"):
        for streams in ("64", "512"):
            assert f"--backend {backend} --streams {streams} " in result.stderr


def test_cpu_smoke_run_prints_one_summary(tmp_path: Path) -> None:
    result = run(
        "--skip-install",
        "--device",
        "cpu",
        "--arch",
        "small",
        "--backends",
        "torch",
        "--streams",
        "2",
        "--seconds",
        "1",
        "--budget-s",
        "60",
        tmp_path=tmp_path,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    (trial,) = summary["trials"]
    assert trial["backend"] == "torch" and trial["streams"] == 2 and trial["error"] is None
    assert summary["skipped"] == []
    assert len(list((tmp_path).glob("hotline-asr-gpu.*/calibration/*.wav"))) == 8
