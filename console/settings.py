"""The console's own config file (YAML): where the gateways' config is, users, state, listening."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from asr_common.yamlconf import load_yaml_model
from asr_gateway.state_dir import default_state_dir


class ConsoleSettings(BaseModel):
    """``console.yaml``; relative paths are relative to that file."""

    model_config = ConfigDict(extra="forbid")

    service_config: Path = Field(description="the gateways' config file: Redis, routes, KB and tag rule files")
    listen: str = Field("127.0.0.1:8088", pattern=r"^\[?[^\s]+\]?:\d+$", description="HOST:PORT")
    users_file: Path = Field(description="users, roles and argon2 password hashes (docs/console.md)")
    state_dir: Path = Field(
        default_factory=lambda: default_state_dir(os.environ) / "console",
        description="kept versions, audit log, session key (default: STATE/console, asr_gateway/state_dir.py)",
    )
    key_prefixes: list[str] = Field(
        default_factory=list, description="Redis key prefixes to read (default: the service's redis.key_prefix)"
    )
    agent_id_key: str = Field("X-Agent-Id", description="call.started metadata key naming the call's agent")
    proxy_header: str | None = Field(None, description="trusted reverse-proxy header carrying the user name")
    trusted_proxies: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = Field(
        default_factory=lambda: [ipaddress.ip_network("127.0.0.1/32")],
        description="peers whose proxy_header is believed",
    )
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    session_max_age_s: int = Field(12 * 3600, ge=60)
    bootstrap_events: int = Field(20_000, ge=0, description="firehose entries read at start to find open calls")
    ended_keep_s: int = Field(600, ge=0, description="how long ended calls stay on the calls page")
    speak_url: str | None = Field(
        None,
        pattern=r"^wss?://[^\s]+$",
        description="the gateway's WebSocket stream URL for the Speak page, as the browser reaches it "
        "(default: the host the console was reached at, the gateway's websocket.port, /v1/stream; console/speak.py)",
    )

    archive_db: str | None = Field(
        None,
        pattern=r"^(sqlite:///|postgres(ql)?://)[^\s]+$",
        description="the call archive that asr-archive writes (sqlite:///path or postgresql://...): "
        "its search page and archived calls' pages (docs/archive.md); none by default",
    )

    webhook_retry_first_s: float = Field(
        1.0, gt=0, description="seconds before a work order's webhook is tried again after its first failure"
    )
    webhook_retry_max_s: float = Field(
        300.0, gt=0, description="the most seconds between tries; the wait doubles from webhook_retry_first_s"
    )

    @field_validator("webhook_retry_max_s")
    @classmethod
    def _not_below_first(cls, max_s: float, info: ValidationInfo) -> float:
        first_s = info.data.get("webhook_retry_first_s")
        if first_s is not None and max_s < first_s:
            raise ValueError(f"{max_s} is below webhook_retry_first_s ({first_s}): raise it, or lower that")
        return max_s

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def secure_cookies(self) -> bool:
        return self.tls_certfile is not None


def load_settings(path: Path | str) -> ConsoleSettings:
    """Load and validate ``path``; ConfigError with ``file:line`` messages on bad input."""
    path = Path(path)
    settings = load_yaml_model(path, ConsoleSettings)
    base = path.resolve().parent

    def resolve(p: Path) -> Path:
        return p if p.is_absolute() else base / p

    updates: dict[str, object] = {
        "service_config": resolve(settings.service_config),
        "users_file": resolve(settings.users_file),
        "state_dir": resolve(settings.state_dir),
    }
    for name in ("tls_certfile", "tls_keyfile"):
        value = getattr(settings, name)
        if value is not None:
            updates[name] = resolve(value)
    return settings.model_copy(update=updates)
