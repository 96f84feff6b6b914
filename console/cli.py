"""``asr-console`` (also ``asr-gateway console``): run the console, check its config, or hash a password.

asr-console --config console.yaml [--listen HOST:PORT]
asr-console check-config console.yaml   # file:line problems, or "ok"; exit 1 on problems
asr-console hash-password               # prints an argon2 hash for the users file

A problem found at start (a missing or unreadable file, the gateway's config given instead of
the console's, Redis not answering) is one line each on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import uvicorn
from pydantic import ValidationError

from console.settings import ConsoleSettings
from console.startup import StartupError, check_files, check_redis


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


def check_config_main(argv: list[str]) -> int:
    """``asr-console check-config FILE``: the file checks of a start, without Redis."""
    parser = argparse.ArgumentParser(prog="asr-console check-config", description=check_files.__doc__)
    parser.add_argument("file", type=Path, help="console config (YAML)")
    args = parser.parse_args(argv)
    try:
        check_files(args.file)
    except StartupError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return 1
    print("ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hash-password"]:
        from console.users import hash_password_main

        return hash_password_main(argv[1:])
    if argv[:1] == ["check-config"]:
        return check_config_main(argv[1:])
    args = build_parser().parse_args(argv)
    from console.app import build_app

    try:
        settings, service = check_files(args.config)
        if args.listen:
            settings = type(settings).model_validate({**settings.model_dump(), "listen": args.listen})
        check_redis(service, settings.service_config)
        app = build_app(settings)
    except StartupError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"--listen {args.listen}: {exc.errors()[0]['msg']}; give HOST:PORT", file=sys.stderr)
        return 2
    uvicorn.Server(server_config(app, settings, args.log_level)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
