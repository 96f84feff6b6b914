"""GPU capacity run: the torch backends at increasing stream counts, inside a time budget.

    python -m deploy.bench.gpu_run --out DIR [--device cuda] [--streams "1000 4000 10000"]
        [--backends "torch torch-cudagraph"] [--dtypes "bfloat16 float16"] [--seconds 8]
        [--budget-s 420] [--arch aishell] [--dry-run-gpu]

``deploy/bench/gpu.sh`` installs the packed wheels and runs this. It checks the GPU
(``nvidia-smi`` and ``torch.cuda``), then runs ``asr-bench engine``
(``deploy.bench.engine_bench``, without the service's imports) once per trial, each in its own
process with a timeout (160 ms chunks, 8 left chunks, the random-weight model of ``--arch`` with
the calibrated CTC head): every backend x dtype at the first stream count, then a batch-1 search
(``--max-batch 1``) for the batching gain, then the next stream count for the configurations
that passed the previous one. A trial passes by ``engine_bench.meets_latency_rule`` (partial p95
<= 300 ms, no chunk later than 1 s) and its feeder kept real-time pace. A trial that would end
past ``--budget-s`` is skipped and listed. While a trial runs, ``nvidia-smi`` is sampled twice a
second for GPU utilization and memory. The ONE JSON summary (max real-time streams per
configuration, partial p50/p95 at the best, batching gain vs batch 1, GPU memory per stream, GPU
utilization) is printed and written to ``DIR/gpu_summary.json``; each trial's JSON goes to
``DIR/trials.jsonl`` and its stderr to ``DIR/trials.log``.

``--device cpu --dry-run-gpu`` rehearses the whole run without a GPU: the GPU check reports what
it found instead of failing, CUDA-only backends (``torch-cudagraph``, TensorRT) and GPU dtypes
are listed as skipped, and the torch backend runs in float32.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

CUDA_ONLY_BACKENDS = ("torch-cudagraph", "tensorrt", "tensorrt-fp16", "tensorrt-int8")
GPU_DTYPES = ("float16", "bfloat16")
TRIAL_KEYS = (
    "backend", "dtype", "streams", "max_batch", "passed", "tail_partial_latency_ms", "final_latency_ms",
    "batch_size_mean", "forward_ms_mean", "cores_used", "gpu_mb_per_stream", "gpu_sampled", "feed_lag_s", "error",
    "wall_s",
)  # fmt: skip
SUMMARY_FILE = "gpu_summary.json"
TRIALS_FILE = "trials.jsonl"
LOG_FILE = "trials.log"
FEED_LAG_LIMIT_S = 1.0
"""A trial whose feeder (one Python thread) ended later than this past its audio's length offered
less than real-time load: it does not count as passed, whatever its latencies."""
SETUP_S = 25.0
"""Estimated seconds a trial spends outside its measured audio (model, calibration, warm-up, drain)."""


def _nvidia_smi(query: str) -> list[list[str]] | None:
    """Rows of ``nvidia-smi --query-gpu=QUERY`` (csv, no units), or None where it is missing or fails."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [[cell.strip() for cell in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]


def check_gpu() -> dict[str, Any]:
    """What this machine offers: nvidia-smi's view and torch's."""
    import torch

    rows = _nvidia_smi("name,memory.total,driver_version")
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nvidia_smi": [{"name": r[0], "memory_total_mb": r[1], "driver": r[2]} for r in rows] if rows else None,
    }
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info["device_name"] = props.name
        info["device_memory_gb"] = round(props.total_memory / 2**30, 1)
        info["multiprocessors"] = props.multi_processor_count
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
    return info


class GpuSampler:
    """Samples GPU utilization (%) and memory used (MiB) with nvidia-smi while a trial runs."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            rows = _nvidia_smi("utilization.gpu,memory.used")
            if rows:
                try:
                    self.samples.append((float(rows[0][0]), float(rows[0][1])))
                except (ValueError, IndexError):
                    continue

    def summary(self) -> dict[str, float] | None:
        if not self.samples:
            return None
        util = [s[0] for s in self.samples]
        return {
            "utilization_mean_percent": round(sum(util) / len(util), 1),
            "utilization_max_percent": max(util),
            "memory_used_max_mb": max(s[1] for s in self.samples),
        }


@dataclass
class Plan:
    """The trials' settings and the budget they share."""

    device: str
    arch: str
    seconds: float
    max_batch: int
    max_wait_ms: float
    budget_s: float
    trial_timeout_s: float
    extra: list[str]
    started: float = field(default_factory=time.monotonic)
    last_duration_s: float = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def fits(self) -> bool:
        """Whether one more trial ends inside the budget (estimated from the last trial)."""
        estimate = max(self.last_duration_s, self.seconds + SETUP_S)
        return self.elapsed() + estimate <= self.budget_s


def run_trial(
    plan: Plan, backend: str, dtype: str, streams: int, max_batch: int, log: TextIO
) -> dict[str, Any]:  # fmt: skip
    """One ``asr-bench engine`` trial in a child process; its JSON plus the GPU samples."""
    argv = [
        sys.executable, "-m", "deploy.bench.engine_bench", "--arch", plan.arch, "--device", plan.device,
        "--backend", backend, "--dtype", dtype, "--streams", str(streams), "--seconds", str(plan.seconds),
        "--max-batch", str(max_batch), "--max-wait-ms", str(plan.max_wait_ms), *plan.extra,
    ]  # fmt: skip
    print(f"== {backend} {dtype} streams={streams} max_batch={max_batch} ({plan.elapsed():.0f}s elapsed)", file=log)
    log.flush()
    timeout = max(30.0, min(plan.trial_timeout_s, plan.budget_s + 60 - plan.elapsed()))
    started = time.monotonic()
    record: dict[str, Any] = {"backend": backend, "dtype": dtype, "streams": streams, "max_batch": max_batch}
    with GpuSampler() as sampler:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
            stderr = out.stderr
        except subprocess.TimeoutExpired as exc:
            out = None
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
    log.write(stderr)
    log.flush()
    record["wall_s"] = round(time.monotonic() - started, 1)
    plan.last_duration_s = record["wall_s"]
    record["gpu_sampled"] = sampler.summary()
    last_error = stderr.strip().splitlines()[-1][-300:] if stderr.strip() else ""
    if out is None:
        return {**record, "error": f"timeout after {timeout:.0f} s: {last_error}", "passed": False}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {**record, "error": f"exit {out.returncode}: {last_error}", "passed": False}
    result = json.loads(lines[-1])
    keys = (
        "realtime_ok", "latency_rule_ok", "partial_latency_ms", "tail_partial_latency_ms", "final_latency_ms",
        "batch_size_mean", "forward_ms_mean", "throughput_x_realtime", "cores_used", "kv_bytes_per_stream",
        "gpu_peak_allocated_mb", "gpu_weights_mb", "gpu_mb_per_stream", "behind_realtime_chunks", "ctc_calibration",
        "feed_lag_s",
    )  # fmt: skip
    record.update({key: result.get(key) for key in keys})
    # A trial counts only where the feeder kept real-time pace (within FEED_LAG_LIMIT_S).
    record["passed"] = bool(result.get("latency_rule_ok")) and (result.get("feed_lag_s") or 0.0) <= FEED_LAG_LIMIT_S
    return record


def configurations(backends: list[str], dtypes: list[str], device: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(backend, dtype) pairs to run on ``device``, and the ones skipped there with why."""
    on_gpu = device.startswith("cuda")
    skipped = []
    if not on_gpu:
        skipped += [f"{b}: needs CUDA" for b in backends if b in CUDA_ONLY_BACKENDS]
        skipped += [f"{d}: GPU dtype, float32 on a CPU" for d in dtypes if d in GPU_DTYPES]
        backends = [b for b in backends if b not in CUDA_ONLY_BACKENDS]
        dtypes = [d for d in dtypes if d not in GPU_DTYPES] or ["float32"]
    return [(b, d) for b in backends for d in dtypes], skipped


def summarize(trials: list[dict[str, Any]], configs: list[tuple[str, str]], gpu: dict[str, Any]) -> dict[str, Any]:
    """The summary's figures from the trials."""
    batched = [t for t in trials if t["max_batch"] > 1]
    maxima = {
        f"{b}/{d}": max(
            (t["streams"] for t in batched if (t["backend"], t["dtype"]) == (b, d) and t["passed"]), default=0
        )
        for b, d in configs
    }
    best_name = max(maxima, key=lambda k: maxima[k]) if maxima else None
    best = None
    if best_name and maxima[best_name]:
        backend, dtype = best_name.split("/")
        best = next(
            t for t in batched if (t["backend"], t["dtype"], t["streams"]) == (backend, dtype, maxima[best_name])
        )
    unbatched = [t for t in trials if t["max_batch"] == 1]
    unbatched_max = max((t["streams"] for t in unbatched if t["passed"]), default=0)
    first = f"{configs[0][0]}/{configs[0][1]}" if configs else None
    gain = round(maxima[first] / unbatched_max, 1) if first and unbatched_max and maxima.get(first) else None
    sampled = (best or {}).get("gpu_sampled") or {}
    return {
        "max_realtime_streams": maxima,
        "best_config": best_name if best else None,
        "best_streams": maxima[best_name] if best and best_name else 0,
        "partial_latency_ms_at_best": (best or {}).get("tail_partial_latency_ms"),
        "final_latency_ms_at_best": (best or {}).get("final_latency_ms"),
        "batch1_config": first,
        "batch1_max_realtime_streams": unbatched_max,
        "batching_gain_vs_batch1": gain,
        "gpu_mb_per_stream_at_best": (best or {}).get("gpu_mb_per_stream"),
        "kv_bytes_per_stream_at_best": (best or {}).get("kv_bytes_per_stream"),
        "gpu_utilization_mean_percent_at_best": sampled.get("utilization_mean_percent"),
        "gpu_utilization_max_percent_at_best": sampled.get("utilization_max_percent"),
        "cores_used_at_best": (best or {}).get("cores_used"),
        "gpu_name": gpu.get("device_name") or ((gpu.get("nvidia_smi") or [{}])[0].get("name")),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.gpu_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_summary.json, trials.jsonl, trials.log")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--streams", default="1000 4000 10000", help="stream counts, increasing (default: %(default)s)")
    parser.add_argument("--backends", default="torch torch-cudagraph", help="default: %(default)s")
    parser.add_argument("--dtypes", default="bfloat16 float16", help="default: %(default)s")
    parser.add_argument("--batch1-streams", default="16 32 64 128", help="stream counts of the batch-1 search")
    parser.add_argument("--seconds", type=float, default=8.0, help="audio per trial (default: %(default)s)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="no trial starts that would end later")
    parser.add_argument(
        "--trial-timeout-s", type=float, help="a trial's limit (default: 150 s on a GPU, 480 s on a CPU)"
    )
    parser.add_argument("--arch", choices=["aishell", "wenetspeech", "small"], default="aishell")
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    parser.add_argument("--engine-args", default="", help="more asr-bench engine options for every trial")
    parser.add_argument(
        "--dry-run-gpu", action="store_true", help="rehearsal: a missing GPU is reported, not an error"
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        args.stream_levels = sorted(int(n) for n in args.streams.split())
        args.batch1_levels = sorted(int(n) for n in args.batch1_streams.split())
    except ValueError:
        parser.error("--streams and --batch1-streams take whole numbers separated by spaces")
    if not args.stream_levels or min(args.stream_levels) < 1:
        parser.error("--streams needs at least one positive stream count")
    if args.trial_timeout_s is None:
        args.trial_timeout_s = 150.0 if args.device.startswith("cuda") else 480.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = check_gpu()
    summary: dict[str, Any] = {"device": args.device, "dry_run_gpu": args.dry_run_gpu, "gpu": gpu}
    if args.device.startswith("cuda") and not gpu["cuda_available"] and not args.dry_run_gpu:
        summary["error"] = "no CUDA device visible to torch (see gpu.nvidia_smi)"
        print(json.dumps(summary))
        (args.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
        return 2
    configs, skipped = configurations(args.backends.split(), args.dtypes.split(), args.device)
    plan = Plan(
        args.device, args.arch, args.seconds, args.max_batch, args.max_wait_ms, args.budget_s,
        args.trial_timeout_s, args.engine_args.split(),
    )  # fmt: skip
    trials: list[dict[str, Any]] = []
    failed: set[tuple[str, str]] = set()
    with (args.out / LOG_FILE).open("w") as log, (args.out / TRIALS_FILE).open("w") as jsonl:

        def attempt(backend: str, dtype: str, streams: int, max_batch: int) -> bool:
            if not plan.fits():
                skipped.append(f"{backend}/{dtype} streams={streams} max_batch={max_batch}: budget")
                return False
            record = run_trial(plan, backend, dtype, streams, max_batch, log)
            trials.append(record)
            jsonl.write(json.dumps(record) + "\n")
            jsonl.flush()
            print(json.dumps({k: record.get(k) for k in ("backend", "dtype", "streams", "max_batch", "passed",
                                                          "tail_partial_latency_ms", "error", "wall_s")}),
                  file=sys.stderr, flush=True)  # fmt: skip
            return bool(record["passed"])

        for index, streams in enumerate(args.stream_levels):
            for backend, dtype in configs:
                if (backend, dtype) in failed:
                    skipped.append(f"{backend}/{dtype} streams={streams}: failed a smaller count")
                elif not attempt(backend, dtype, streams, args.max_batch):
                    failed.add((backend, dtype))
            if index == 0 and configs:  # batch-1 capacity, for the batching gain
                for streams1 in args.batch1_levels:
                    if not attempt(configs[0][0], configs[0][1], streams1, 1):
                        break
    summary.update(summarize(trials, configs, gpu))
    summary.update(
        {
            "arch": args.arch,
            "chunk_ms": 160,
            "seconds_per_trial": args.seconds,
            "stream_levels": args.stream_levels,
            "latency_rule": "partial p95 <= 300 ms and no chunk later than 1 s, last quarter of each trial",
            "elapsed_s": round(plan.elapsed(), 1),
            "budget_s": args.budget_s,
            "skipped": skipped,
            "trials": [{k: t.get(k) for k in TRIAL_KEYS} for t in trials],
        }
    )
    text = json.dumps(summary)
    (args.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
