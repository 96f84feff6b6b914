#!/usr/bin/env bash
# Run the CUDA-free tests under another torch release (default 2.11.0, the GPU machine's) in a
# Python 3.12 venv, and print a one-line JSON summary (also written to OUT/torch_compat.json).
#
#   deploy/bench/torch_compat.sh [--python PY312] [--torch 2.11.0] [--venv DIR] [--out DIR]
#                                [--tests "tests/test_x.py ..."]
#
# The venv is created if missing and reused after; the project's runtime dependencies and the
# test tools are installed into it, our code runs from this checkout (the C extensions are not
# built: the Python fallbacks run). Where only a CUDA build of that torch release can be
# installed, it runs on the CPU here the same way.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$(command -v python3.12 || true)"
TORCH=2.11.0
VENV="${TMPDIR:-/tmp}/hotline-asr-torch-compat"
OUT="$REPO/build/torch_compat"
TESTS="tests/test_model_batched.py tests/test_model_fast_paths.py tests/test_model_loader.py
tests/test_backend_traced.py tests/test_backend_gpu.py tests/test_engine.py tests/test_finals.py
tests/test_rescoring.py tests/test_ctc_search.py tests/test_frontend.py tests/test_kv_ring_model.py
tests/test_engine_bench.py tests/test_deploy_gpu_script.py"

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY="$2"; shift 2 ;;
        --torch) TORCH="$2"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --tests) TESTS="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "torch_compat.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ -z "$PY" ] || ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    echo "torch_compat.sh: --python must name a Python 3.12 interpreter; got '${PY:-none}'" >&2
    exit 2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import sys, torch; sys.exit(not torch.__version__.startswith('$TORCH'))" 2>/dev/null; then
    echo "== installing torch $TORCH into $VENV" >&2
    "$VENV/bin/pip" install -q "torch==$TORCH" >&2
fi
REQS="$("$VENV/bin/python" - "$REPO/setup.cfg" <<'PYTHON'
import configparser, sys

config = configparser.ConfigParser()
config.read(sys.argv[1])
for line in config["options"]["install_requires"].strip().splitlines():
    if not line.strip().startswith("torch"):
        print(line.strip())
PYTHON
)"
echo "$REQS" > "$OUT/requirements.txt"
echo "== runtime dependencies and test tools" >&2
"$VENV/bin/pip" install -q -r "$OUT/requirements.txt" pytest pytest-timeout hypothesis jsonschema kaldi-native-fbank >&2

cd "$REPO"
set +e
# shellcheck disable=SC2086
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --junitxml "$OUT/junit.xml" $TESTS 2>&1 | tee "$OUT/pytest.log" >&2
status=${PIPESTATUS[0]}
set -e
"$VENV/bin/python" - "$OUT/junit.xml" "$status" "$OUT/torch_compat.json" <<'PYTHON'
import json, platform, sys
import xml.etree.ElementTree as ET

import torch

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
failed = [
    f"{case.get('classname')}::{case.get('name')}"
    for case in suite.iter("testcase")
    if case.find("failure") is not None or case.find("error") is not None
]
summary = {
    "python": platform.python_version(),
    "torch": torch.__version__,
    "tests": int(suite.get("tests")),
    "failed": int(suite.get("failures")) + int(suite.get("errors")),
    "skipped": int(suite.get("skipped")),
    "seconds": round(float(suite.get("time")), 1),
    "pytest_exit": int(sys.argv[2]),
    "failures": failed,
}
summary["passed"] = summary["tests"] - summary["failed"] - summary["skipped"]
open(sys.argv[3], "w").write(json.dumps(summary) + "\n")
print(json.dumps(summary))
PYTHON
exit "$status"
