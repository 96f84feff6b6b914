"""What the console checks before it serves, each problem as one line an operator can act on.

``asr-console check-config FILE`` runs the file checks (the console's config, the service
config it names, the users file, TLS files, the state directory); starting the console runs
them too and then asks Redis for a PING. Every line names the file (``file:line`` where a key
is at fault) or the URL, and says what to do: a traceback from deep inside uvicorn says neither.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import ssl
from pathlib import Path

from redis.exceptions import RedisError

from archive.store import ArchiveError, open_store
from asr_common.yamlconf import ConfigError, read_yaml
from asr_gateway.config import ServiceConfig, load_config
from asr_gateway.state_dir import writable_problems
from console.settings import ConsoleSettings, load_settings
from console.users import Users
from kb_hooks.connection import make_client, shown

CONSOLE_EXAMPLE = "deploy/config/console.example.yaml"
USERS_EXAMPLE = "deploy/config/users.example.yaml"
REDIS_PING_TIMEOUT_S = 5.0


class StartupError(Exception):
    """Problems that keep the console from starting; ``lines`` holds one line per problem."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


def _file_not_found(lines: list[str]) -> bool:
    return len(lines) == 1 and lines[0].endswith(": file not found")


def load_console_settings(path: Path) -> ConsoleSettings:
    """``path`` as the console's config, or StartupError saying what kind of file it is instead."""
    try:
        data, _ = read_yaml(path)
    except ConfigError as exc:
        if _file_not_found(exc.errors):
            raise StartupError([f"{path}: file not found; the console needs its own config file: "
                                f"copy {CONSOLE_EXAMPLE} there and edit it"]) from None  # fmt: skip
        raise StartupError(exc.errors) from None
    if isinstance(data, dict) and "service_config" not in data and set(data) & set(ServiceConfig.model_fields):
        raise StartupError([f"{path}: this is a gateway (service) config, not the console's; the console wants "
                            "its own file whose service_config names this one: start from "
                            f"{CONSOLE_EXAMPLE}"])  # fmt: skip
    try:
        return load_settings(path)
    except ConfigError as exc:
        raise StartupError(exc.errors) from None


def _service_config(settings: ConsoleSettings, console_file: Path) -> tuple[ServiceConfig | None, list[str]]:
    try:
        return load_config(settings.service_config), []
    except ConfigError as exc:
        if _file_not_found(exc.errors):
            return None, [f"{settings.service_config}: file not found; set service_config in {console_file} to "
                          "the gateways' config file (the one `asr-gateway serve --config` reads)"]  # fmt: skip
        return None, exc.errors


def _users(settings: ConsoleSettings) -> list[str]:
    try:
        Users(settings.users_file)
    except ConfigError as exc:
        return exc.errors
    except FileNotFoundError:
        return [f"{settings.users_file}: file not found; copy {USERS_EXAMPLE} there and put password hashes "
                "in it (`asr-console hash-password`)"]  # fmt: skip
    except OSError as exc:
        return [f"{settings.users_file}: cannot read: {exc.strerror}; check the file and its permissions"]
    return []


def _tls(settings: ConsoleSettings, console_file: Path) -> list[str]:
    cert, key = settings.tls_certfile, settings.tls_keyfile
    if cert is None and key is None:
        return []
    if cert is None or key is None:
        return [f"{console_file}: tls_certfile and tls_keyfile go together; set both, or neither for plain HTTP"]
    unreadable = [str(p) for p in (cert, key) if not os.access(p, os.R_OK)]
    if unreadable:
        return [f"{p}: TLS file not found or not readable; fix tls_certfile/tls_keyfile in {console_file}, "
                "or comment both out for plain HTTP" for p in unreadable]  # fmt: skip
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        return [f"{cert}: not a certificate matching {key} ({exc.reason or exc}); check both PEM files"]
    return []


def _state_dir(settings: ConsoleSettings, console_file: Path) -> list[str]:
    return [f"{console_file}: {line}" for line in writable_problems(settings.state_dir, "state_dir")]


def _archive(settings: ConsoleSettings, console_file: Path) -> list[str]:
    """The archive database opens (as the console will open it: a new SQLite file is created and
    any store's schema brought to the newest version)."""
    if not settings.archive_db:
        return []
    try:
        open_store(settings.archive_db).close()
    except (ArchiveError, sqlite3.Error, OSError) as exc:
        reason = " ".join(str(exc).split())  # a driver's message may span lines
        return [f"{console_file}: archive_db: {reason}; fix the URL, or comment it out to run without the archive"]
    return []


def check_files(console_file: Path) -> tuple[ConsoleSettings, ServiceConfig]:
    """Every file check ``check-config`` makes; StartupError with all their lines."""
    settings = load_console_settings(console_file)
    service, problems = _service_config(settings, console_file)
    problems += _users(settings) + _tls(settings, console_file) + _state_dir(settings, console_file)
    problems += _archive(settings, console_file)
    if problems or service is None:
        raise StartupError(problems)
    return settings, service


def check_redis(service: ServiceConfig, service_file: Path) -> None:
    """PING the service config's Redis; StartupError naming the URL (password hidden) when it does not answer."""
    url = service.redis.url

    async def ping() -> None:
        client = make_client(url, min(service.redis.connect_timeout_s, REDIS_PING_TIMEOUT_S), REDIS_PING_TIMEOUT_S)
        try:
            await client.ping()
        finally:
            await client.aclose()

    try:
        asyncio.run(ping())
    except (RedisError, OSError) as exc:
        raise StartupError([f"{shown(url)}: Redis does not answer ({exc}); start it, or fix redis.url in "
                            f"{service_file} (ASR_REDIS_URL overrides it)"]) from None  # fmt: skip
