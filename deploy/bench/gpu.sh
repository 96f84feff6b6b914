#!/usr/bin/env bash
# GPU capacity run on a machine that already has Python 3.12 with a CUDA build of torch (and
# numpy, PyYAML, threadpoolctl) and no network: installs the folder made by gpu_pack.sh, checks
# the GPU, runs the torch and torch-cudagraph backends in bf16/fp16 at increasing stream counts
# inside a time budget, and prints ONE JSON summary on stdout (also OUT/gpu_summary.json).
#
#   deploy/bench/gpu.sh --pack DIR --out OUT [--python PY] [--skip-install] [--dry-run]
#                       [--device cuda] [--streams "1000 4000 10000"] [--backends "torch torch-cudagraph"]
#                       [--dtypes "bfloat16 float16"] [--seconds 8] [--budget-s 420] [--arch aishell]
#                       [--batch1-streams "16 32 64 128"] [--engine-args "..."] [--dry-run-gpu]
#
# --pack DIR: wheels from deploy/bench/gpu_pack.sh, installed with pip --no-index --no-deps into
#   a folder on PYTHONPATH (the machine's own torch stays in use). --skip-install: this checkout's
#   code with the current python. --dry-run: print the steps only. --dry-run-gpu: rehearse on a
#   machine without a GPU (with --device cpu). The remaining options go to deploy/bench/gpu_run.py
#   (its --help). TensorRT backends are optional (--backends tensorrt-fp16 needs tensorrt and
#   cuda-python, which the pack does not carry).
set -euo pipefail

PACK=""
OUT=""
PY="${PYTHON:-python3}"
SKIP_INSTALL=0
DRY_RUN=0
DRIVER_ARGS=()

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --pack) PACK="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --python) PY="$2"; shift 2 ;;
        --skip-install) SKIP_INSTALL=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        --dry-run-gpu) DRIVER_ARGS+=("$1"); shift ;;
        --device|--streams|--backends|--dtypes|--seconds|--budget-s|--arch|--batch1-streams|--engine-args|\
        --trial-timeout-s|--max-batch|--max-wait-ms)
            [ $# -ge 2 ] || { echo "gpu.sh: $1 needs a value" >&2; exit 2; }
            DRIVER_ARGS+=("$1" "$2"); shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ -z "$OUT" ]; then
    echo "gpu.sh: --out DIR is required (the summary and logs go there)" >&2
    exit 2
fi
if [ "$SKIP_INSTALL" -eq 0 ] && [ -z "$PACK" ]; then
    echo "gpu.sh: --pack DIR is required (a folder made by deploy/bench/gpu_pack.sh), or pass --skip-install" >&2
    exit 2
fi
if [ "$SKIP_INSTALL" -eq 0 ] && [ "$DRY_RUN" -eq 0 ] && ! ls "$PACK"/hotline_asr-*.whl >/dev/null 2>&1; then
    echo "gpu.sh: $PACK holds no hotline_asr wheel; build the folder with deploy/bench/gpu_pack.sh" >&2
    exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/hotline-asr-gpu.XXXXXX")"
LOG="$OUT/gpu_run.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG" >&2; }

run() {
    say "+ $*"
    if [ "$DRY_RUN" -eq 0 ]; then "$@" 2>&1 | tee -a "$LOG" >&2; fi
}

if [ "$SKIP_INSTALL" -eq 1 ]; then
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
else
    PACK="$(cd "$PACK" && pwd)"
    SITE="$WORK/site"
    # --no-deps: the pack holds exactly what the machine lacks; torch and numpy are the machine's.
    run "$PY" -m pip install -q --no-index --find-links "$PACK" --no-deps --no-compile --no-cache-dir \
        --target "$SITE" "$PACK"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
say "== $(date -u +%FT%TZ) python: $("$PY" -c 'import sys; print(sys.version.split()[0])')"
# Run outside the checkout so that the installed package (C extensions included) is the one imported.
cd "$WORK"
run "$PY" -c 'import asr_core, torch; from asr_core import ctc_search as c
print("hotline-asr from", asr_core.__file__, "| torch", torch.__version__, "| cuda", torch.cuda.is_available(),
      "| C prefix search:", c._native_prefix_beam_search is not None)'
if command -v nvidia-smi >/dev/null; then run nvidia-smi; else say "nvidia-smi: not found"; fi

if [ "$DRY_RUN" -eq 1 ]; then
    say "+ $PY -m deploy.bench.gpu_run --out $OUT ${DRIVER_ARGS[*]+"${DRIVER_ARGS[*]}"}"
    echo "{\"dry_run\": true, \"out\": \"$OUT\", \"workdir\": \"$WORK\"}"
    exit 0
fi
set +e
"$PY" -m deploy.bench.gpu_run --out "$OUT" ${DRIVER_ARGS[@]+"${DRIVER_ARGS[@]}"} 2> >(tee -a "$LOG" >&2) \
    | tee -a "$LOG"
status=${PIPESTATUS[0]}
set -e
say "== $(date -u +%FT%TZ) gpu_run exit $status; summary: $OUT/gpu_summary.json"
exit "$status"
