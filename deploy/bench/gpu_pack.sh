#!/usr/bin/env bash
# Build the folder deploy/bench/gpu.sh installs on a GPU machine that has no network: our
# package as a wheel (C extensions compiled for the given Python, or left out where they do not
# compile: the Python fallbacks run) and the runtime dependencies that machine lacks, as cp312
# manylinux wheels. torch, numpy, onnxruntime and the other packages of the machine's image are
# NOT packed. Prints the folder's size and fails above --max-mib.
#
#   deploy/bench/gpu_pack.sh [--python PY312] [--out DIR] [--max-mib 44]
#
# --python: a Python 3.12 interpreter that builds our wheel (default: python3.12 on PATH).
# --out: the folder (default: gpu_pack in the repository root; it is ignored by git).
# Needs a package index here (pip download); the GPU machine needs none.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$(command -v python3.12 || true)"
OUT="$REPO/gpu_pack"
MAX_MIB=44
PYVER=3.12

# In the GPU machine's image already (its package list): not packed.
IMAGE_PACKAGES="numpy torch triton onnx onnxruntime threadpoolctl pyyaml uvloop prometheus-client
typing-extensions packaging setuptools filelock sympy mpmath networkx jinja2 markupsafe fsspec"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --max-mib) MAX_MIB="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_pack.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ -z "$PY" ] || ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    echo "gpu_pack.sh: --python must name a Python 3.12 interpreter (the GPU machine's version); got '${PY:-none}'" >&2
    exit 2
fi

rm -rf "$OUT"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
DL="$(mktemp -d "${TMPDIR:-/tmp}/hotline-asr-pack.XXXXXX")"
trap 'rm -rf "$DL"' EXIT

echo "== our wheel ($("$PY" --version))" >&2
rm -rf "$REPO"/build/lib.* "$REPO"/build/bdist.*  # no stale build output in the wheel
"$PY" -m pip wheel -q --no-deps -w "$OUT" "$REPO" >&2

echo "== dependencies the GPU image lacks" >&2
# The package names, one word each:
# shellcheck disable=SC2086
REQS="$("$PY" "$REPO/deploy/bench/runtime_requirements.py" "$REPO/setup.cfg" $IMAGE_PACKAGES)"
echo "$REQS" > "$DL/requirements.txt"
"$PY" -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DL" -r "$DL/requirements.txt" >&2
for wheel in "$DL"/*.whl; do
    name="$(basename "$wheel" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')"
    case " $(echo "$IMAGE_PACKAGES" | tr '\n' ' ') " in
        *" $name "*) continue ;;
    esac
    cp "$wheel" "$OUT/"
done

KIB="$(du -sk "$OUT" | cut -f1)"
MIB="$(awk "BEGIN { printf \"%.1f\", $KIB / 1024 }")"
echo "== $OUT: $(ls "$OUT" | wc -l) wheels, ${MIB} MiB" >&2
ls -1 "$OUT" >&2
echo "{\"pack\": \"$(basename "$OUT")\", \"wheels\": $(ls "$OUT" | wc -l), \"size_mib\": $MIB}"
if [ "$KIB" -gt $(( MAX_MIB * 1024 )) ]; then
    echo "gpu_pack.sh: the folder is ${MIB} MiB, over --max-mib $MAX_MIB (the device call carries 64 MiB with the checkout)" >&2
    exit 1
fi
