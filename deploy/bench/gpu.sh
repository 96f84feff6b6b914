#!/usr/bin/env bash
# GPU capacity run: torch fp16, torch fp16 + CUDA graphs, TensorRT fp16 and INT8, at increasing
# stream counts; prints ONE JSON summary on stdout (progress goes to stderr). Offline: our
# package and its dependencies come from a folder of wheels carried to the machine.
#
#   deploy/bench/gpu.sh --wheels DIR [--venv DIR] [--streams "256 1024 4096"] [--seconds 6]
#                       [--budget-s 420] [--backends "torch torch-cudagraph tensorrt-fp16 tensorrt-int8"]
#                       [--arch aishell] [--device cuda] [--skip-install] [--dry-run]
#
# Fill the wheels folder on a connected machine with the target's Python version, e.g.
#   pip wheel . -w wheels/  &&  pip download 'torch' 'tensorrt' 'cuda-python' onnx onnxruntime -d wheels/
# (a CUDA build of torch). The whole run stays under --budget-s plus one trial: once the budget is
# spent, remaining trials are skipped and listed in the summary.
set -euo pipefail

WHEELS=""
VENV="${TMPDIR:-/tmp}/hotline-asr-gpu-venv"
STREAMS="256 1024 4096"
SECONDS_PER_TRIAL=6
BUDGET_S=420
BACKENDS="torch torch-cudagraph tensorrt-fp16 tensorrt-int8"
ARCH=aishell
DEVICE=cuda
SKIP_INSTALL=0
DRY_RUN=0

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) WHEELS="$2"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        --streams) STREAMS="$2"; shift 2 ;;
        --seconds) SECONDS_PER_TRIAL="$2"; shift 2 ;;
        --budget-s) BUDGET_S="$2"; shift 2 ;;
        --backends) BACKENDS="$2"; shift 2 ;;
        --arch) ARCH="$2"; shift 2 ;;
        --device) DEVICE="$2"; shift 2 ;;
        --skip-install) SKIP_INSTALL=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/hotline-asr-gpu.XXXXXX")"
RESULTS="$WORK/results.jsonl"
: > "$RESULTS"
START=$(date +%s)

run() {
    echo "+ $*" >&2
    if [ "$DRY_RUN" -eq 0 ]; then "$@"; fi
}

if [ "$SKIP_INSTALL" -eq 1 ]; then
    PY="$(command -v python3)"
else
    if [ -z "$WHEELS" ] && [ "$DRY_RUN" -eq 0 ]; then
        echo "gpu.sh: --wheels DIR is required (a folder of wheels: hotline-asr, torch with CUDA, tensorrt, ...)," \
             "or pass --skip-install to use the current python3" >&2
        exit 2
    fi
    run python3 -m venv "$VENV"
    run "$VENV/bin/pip" install --no-index --find-links "${WHEELS:-WHEELS}" "hotline-asr[onnx,gpu]"
    PY="$VENV/bin/python"
fi

# ONNX graphs and TensorRT plans are built on the first trial of a backend and reused after.
export ASR_ONNX_CACHE="$WORK/onnx-cache"
export ASR_TRT_CALIBRATION_DIR="$WORK/calibration"
run "$PY" - "$ASR_TRT_CALIBRATION_DIR" <<'PYTHON'
import sys, wave
from pathlib import Path
from deploy.bench.engine_bench import synthetic_speech

folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
for seed in range(8):
    with wave.open(str(folder / f"calib{seed}.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(synthetic_speech(20.0, seed=seed + 100).tobytes())
PYTHON

SKIPPED=()
for backend in $BACKENDS; do
    for streams in $STREAMS; do
        elapsed=$(( $(date +%s) - START ))
        if [ "$elapsed" -ge "$BUDGET_S" ]; then
            SKIPPED+=("$backend:$streams")
            continue
        fi
        echo "== $backend, $streams streams (${elapsed}s elapsed)" >&2
        if [ "$DRY_RUN" -eq 1 ]; then
            run "$PY" -m deploy.bench.cli engine --arch "$ARCH" --device "$DEVICE" --backend "$backend" \
                --streams "$streams" --seconds "$SECONDS_PER_TRIAL" --max-batch 1024 --max-wait-ms 10
            continue
        fi
        timeout $(( BUDGET_S + 120 - elapsed )) "$PY" -m deploy.bench.cli engine --arch "$ARCH" \
            --device "$DEVICE" --backend "$backend" --streams "$streams" --seconds "$SECONDS_PER_TRIAL" \
            --max-batch 1024 --max-wait-ms 10 >> "$RESULTS" \
            || echo "{\"backend\": \"$backend\", \"streams\": $streams, \"error\": \"exit $?\"}" >> "$RESULTS"
    done
done

if [ "$DRY_RUN" -eq 1 ]; then
    echo "{\"dry_run\": true, \"backends\": \"$BACKENDS\", \"streams\": \"$STREAMS\", \"workdir\": \"$WORK\"}"
    exit 0
fi

"$PY" - "$RESULTS" "$(( $(date +%s) - START ))" "${SKIPPED[@]+"${SKIPPED[@]}"}" <<'PYTHON'
import json, subprocess, sys

lines = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip()
except OSError:
    gpu = None
summary = {"gpu": gpu, "elapsed_s": int(sys.argv[2]), "skipped": sys.argv[3:], "max_realtime_streams": {},
           "trials": []}
for r in lines:
    latency = r.get("partial_latency_ms", {})
    summary["trials"].append({k: r.get(k) for k in ("backend", "streams", "realtime_ok", "error", "forward_ms_mean",
                                                     "batch_size_mean", "throughput_x_realtime", "kv_bytes_per_stream")}
                             | {"p95_ms": latency.get("p95"), "p99_ms": latency.get("p99")})
    if r.get("realtime_ok") and (latency.get("p95") or 1e9) <= 150:
        best = summary["max_realtime_streams"]
        best[r["backend"]] = max(best.get(r["backend"], 0), r["streams"])
print(json.dumps(summary))
PYTHON
