"""``asr-gateway``: the service's command line (serve, check-config, tail, demo, cluster, box, and the
subcommands installed packages register, such as ``console``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from asr_common import allocator
from asr_common.yamlconf import ConfigError
from asr_gateway.config import load_config
from asr_gateway.config_check import check_referenced_files


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
        problems = check_referenced_files(config)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return 1
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 1
    print("ok")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from asr_gateway.logs import configure_logging
    from asr_gateway.service import run_service

    try:
        config = load_config(args.config)
        problems = check_referenced_files(config)
    except ConfigError as exc:
        problems = exc.errors
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 1
    configure_logging(config.logging.level, config.logging.format)
    logging.getLogger(__name__).info("memory allocator: %s", allocator.describe())
    return run_service(config)


def _tail(argv: list[str]) -> int:
    from kb_hooks.tail import main as tail_main

    return tail_main(argv)


def _demo(argv: list[str]) -> int:
    if "--console" in argv:
        from asr_gateway.dev.console_demo import main as console_demo_main

        return console_demo_main(argv)
    from asr_gateway.dev.demo import main as demo_main

    return demo_main(argv)


def _box(argv: list[str]) -> int:
    from asr_gateway.box import main as box_main

    return box_main(argv)


def _cluster(argv: list[str]) -> int:
    from asr_gateway.dev.cluster import main as cluster_main

    return cluster_main(argv)


PLUGIN_GROUP = "hotline_asr.gateway_commands"


def _plugin(name: str) -> Callable[[list[str]], int] | None:
    """A subcommand another installed package registers (entry point group ``PLUGIN_GROUP``):
    ``asr-gateway console`` is the console's, which sits above this package and is not imported here."""
    for entry in entry_points(group=PLUGIN_GROUP, name=name):
        command: Callable[[list[str]], int] = entry.load()
        return command
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check-config", help="validate a service config file and the files it references")
    check.add_argument("file", type=Path)
    check.set_defaults(func=_check_config)
    serve = sub.add_parser("serve", help="run the service")
    serve.add_argument("--config", type=Path, help="service config (YAML); default: built-in defaults + ASR_* env")
    serve.set_defaults(func=_serve)
    sub.add_parser("tail", help="print live events from Redis (`asr-gateway tail --help` for its options)")
    sub.add_parser("demo", help="run the whole pipeline once on this machine (`asr-gateway demo --help`)")
    sub.add_parser("cluster", help="Kamailio + N nodes + Redis on loopback: up|status|down (`cluster --help`)")
    sub.add_parser("box", help="write and check a box's files: N pinned nodes, Kamailio, HAProxy (`box --help`)")
    for entry in entry_points(group=PLUGIN_GROUP):
        sub.add_parser(entry.name, help=f"provided by {entry.value.split(':')[0]} (`asr-gateway {entry.name} --help`)")
    return parser


ALLOCATOR_COMMANDS = ("serve", "demo")
"""The subcommands that run the engine, and so run on jemalloc where it is installed."""


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] and sys.argv[1] in ALLOCATOR_COMMANDS:
        allocator.prefer_jemalloc()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tail"]:
        return _tail(argv[1:])
    if argv[:1] == ["demo"]:
        return _demo(argv[1:])
    if argv[:1] == ["cluster"]:
        return _cluster(argv[1:])
    if argv[:1] == ["box"]:
        return _box(argv[1:])
    plugin = _plugin(argv[0]) if argv and not argv[0].startswith("-") else None
    if plugin is not None:
        return plugin(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
