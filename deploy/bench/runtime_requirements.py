"""Print setup.cfg's install_requires, one a line, without the packages named after it (names
compared the way pip compares them: case and ``-_.`` runs ignored). gpu_pack.sh and
torch_compat.sh use it for what a machine lacks.

    python deploy/bench/runtime_requirements.py setup.cfg [NAME ...]

Standard library only: it runs under whatever Python the shell scripts were given.
"""

from __future__ import annotations

import configparser
import re
import sys


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements(setup_cfg: str, skip: list[str]) -> list[str]:
    config = configparser.ConfigParser()
    if not config.read(setup_cfg):
        raise SystemExit(f"runtime_requirements.py: cannot read {setup_cfg}")
    skipped = {canonical(name) for name in skip}
    kept = []
    for line in config["options"]["install_requires"].strip().splitlines():
        name = canonical(re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0])
        if name and name not in skipped:
            kept.append(line.strip())
    return kept


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print("\n".join(runtime_requirements(sys.argv[1], sys.argv[2:])))
