"""Run a benchmark module (``python -m deploy.bench.X``) and return the one JSON object it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_bench_module(module: str, *args: str, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line, got: {done.stdout[-2000:]}"
    report: dict[str, Any] = json.loads(lines[0])
    return report
