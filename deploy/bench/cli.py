"""``asr-bench``: capacity and accuracy benchmarks, each printing one JSON object."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from asr_common import allocator


def _accuracy(argv: list[str]) -> int:
    if "--int8-change" in argv:
        from deploy.bench import int8_accuracy

        return int8_accuracy.main([arg for arg in argv if arg != "--int8-change"])
    from deploy.bench.accuracy import main as evaluate

    evaluate(argv)
    return 0


def _module_main(name: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        module = __import__(f"deploy.bench.{name}", fromlist=["main"])
        result: int = module.main(argv)
        return result

    return run


# Commands whose options belong to their own module (``asr-bench media --help`` shows them).
PASSTHROUGH: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "media": (
        _module_main("media_load"),
        "SIP calls + RTP (or --door audiosocket|websocket|all) on loopback: setup failures, loss, server CPU per 20 ms",
    ),
    "publisher": (_module_main("publisher_bench"), "events/s and publish latency to a local Redis"),
    "archive": (
        _module_main("archive_bench"),
        "the call archive, SQLite and PostgreSQL: calls archived/s, search p95 over --calls generated calls",
    ),
    "sherpa-peer": (_module_main("sherpa_peer"), "sherpa-onnx vs our engine on the same exported model"),
    "storm": (
        _module_main("storm"),
        "e2e at --loads x --base-calls, surge off and on alternated, each trial a fresh service: "
        "calls refused, partial and final latency, finals missing, CPU",
    ),
    "peer-ratio": (
        _module_main("peer_ratio"),
        "ours vs sherpa-onnx by the shared peer harness (--shared-harness) and by sherpa-peer, alternated in one run",
    ),
    "soak": (_module_main("soak"), "N calls for M minutes: RSS, FDs and threads over time"),
    "cluster": (
        _module_main("cluster_bench"),
        "calls through Kamailio to N nodes on Redis Sentinel; --drain-node | --kill-node | --kill-redis-master",
    ),
    "console-viewers": (
        _module_main("console_viewers"),
        "concurrent SSE viewers on one console: delivery latency, missed, CPU",
    ),
    "crashloop": (_module_main("crash_loop"), "SIGKILL the service N times (Redis up and down): no durable event lost"),
    "failover": (
        _module_main("failover_bench"),
        "publisher through a Redis Sentinel failover: events lost, duplicated",
    ),
    "accuracy": (
        _accuracy,
        "CER per chunk size on data dirs (wav.scp + text), data.list or WAVs + text; --compare KEY=A,B: an A/B; "
        "--backend: through the engine; --int8-change: INT8 vs fp32",
    ),
    "sizing": (
        _module_main("sizing"),
        "real-time streams per core for each --arch x --chunk-ms pair, INT8: one JSON plus a Markdown table",
    ),
    "workorder": (
        _module_main("workorder"),
        "work-order field accuracy on a labelled call set: from the reference text, or --audio through the service",
    ),
    "punctuation": (
        _module_main("punctuation_bench"),
        "punctuation F1 of the finals' pause rules on hand-punctuated sentences (synthesized token times)",
    ),
}


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a command of its own: the engine's allocator (HOTLINE_ASR_ALLOCATOR=system: glibc's)
        allocator.prefer_jemalloc()
    # Imported only now: importing torch (2 s) before the command runs itself again on jemalloc
    # would be wasted.
    from deploy.bench import e2e_bench, engine_bench

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]][0](argv[1:])
    parser = argparse.ArgumentParser(prog="asr-bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    engine = sub.add_parser("engine", help="streams one engine sustains in real time (batched vs unbatched)")
    engine_bench.add_arguments(engine)
    engine.set_defaults(func=engine_bench.run)
    e2e = sub.add_parser("e2e", help="real sipp calls through the whole service: latency, CER, CPU, memory")
    e2e_bench.add_arguments(e2e)
    e2e.set_defaults(func=e2e_bench.run)
    for name, (_, help_text) in PASSTHROUGH.items():
        sub.add_parser(name, help=help_text, add_help=False)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
