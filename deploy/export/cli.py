"""``asr-export``: model export commands.

asr-export sherpa-onnx --model DIR --out DIR   the layout sherpa-onnx's WeNet CTC recognizer loads
asr-export onnx --model DIR --out DIR          our batched chunk step + decoder (+ INT8)
asr-export onnx check --model DIR --out DIR    ONNX Runtime vs torch, max abs errors as JSON
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from deploy.export import onnx_export, sherpa

COMMANDS = {"sherpa-onnx": sherpa.main, "onnx": onnx_export.main}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
