"""``asr-bench``: capacity and accuracy benchmarks, each printing one JSON object."""

from __future__ import annotations

import argparse
import sys

from deploy.bench import e2e_bench, engine_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asr-bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    engine = sub.add_parser("engine", help="streams one engine sustains in real time (batched vs unbatched)")
    engine_bench.add_arguments(engine)
    engine.set_defaults(func=engine_bench.run)
    e2e = sub.add_parser("e2e", help="real sipp calls through the whole service: latency, CER, CPU, memory")
    e2e_bench.add_arguments(e2e)
    e2e.set_defaults(func=e2e_bench.run)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
