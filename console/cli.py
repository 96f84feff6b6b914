"""``asr-console`` (also ``asr-gateway console``): run the console, or hash a password.

asr-console --config console.yaml [--listen HOST:PORT]
asr-console hash-password            # prints an argon2 hash for the users file
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import uvicorn

from asr_common.yamlconf import ConfigError
from console.settings import ConsoleSettings, load_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr-gateway console", description="The agent-assist console (docs/console.md)."
    )
    parser.add_argument("--config", type=Path, required=True, help="console config (YAML)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="override the config's listen address")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def server_config(app: Any, settings: ConsoleSettings, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's settings for the console: listen address, TLS, no forwarded-for rewriting."""
    host, port = settings.host_port
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(settings.tls_certfile) if settings.tls_certfile else None,
        ssl_keyfile=str(settings.tls_keyfile) if settings.tls_keyfile else None,
        proxy_headers=False,  # the peer address is what trusted_proxies is checked against
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,  # live SSE streams never end by themselves
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hash-password"]:
        from console.users import hash_password_main

        return hash_password_main(argv[1:])
    args = build_parser().parse_args(argv)
    from console.app import build_app

    try:
        settings = load_settings(args.config)
        if args.listen:
            settings = settings.model_copy(update={"listen": args.listen})
            settings = type(settings).model_validate(settings.model_dump())
        app = build_app(settings)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return 1
    uvicorn.Server(server_config(app, settings, args.log_level)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
