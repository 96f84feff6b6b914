"""``asr-gateway``: the service's command line (serve, check-config, tail, demo)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr_gateway.config import ServiceConfig, load_config
from asr_gateway.yamlconf import ConfigError


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


def check_referenced_files(config: ServiceConfig) -> list[str]:
    """Validate the files the config points at; one line per problem."""
    problems: list[str] = []
    for path in [config.routes, *config.kb, *config.tags]:
        if path is not None and not Path(path).is_file():
            problems.append(f"{path}: file not found")
    model_dir = config.engine.model_dir
    if model_dir is not None and not Path(model_dir).is_dir():
        problems.append(f"{model_dir}: engine.model_dir is not a directory")
    return problems


def _not_yet(name: str) -> int:
    print(f"asr-gateway {name}: not available in this build yet", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check-config", help="validate a service config file and the files it references")
    check.add_argument("file", type=Path)
    check.set_defaults(func=_check_config)
    serve = sub.add_parser("serve", help="run the service")
    serve.add_argument("--config", type=Path)
    serve.set_defaults(func=lambda _args: _not_yet("serve"))
    demo = sub.add_parser("demo", help="run the whole pipeline once on this machine")
    demo.set_defaults(func=lambda _args: _not_yet("demo"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
