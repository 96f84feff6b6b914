"""The service configuration: one validated model for every knob, loaded from YAML.

Every setting has a default that works on a single machine, so an empty file is a valid
config. Environment variables ``ASR_<SECTION>_<KEY>`` override the file (for example
``ASR_REDIS_URL``, ``ASR_SIP_PORT``, ``ASR_ENGINE_MAX_BATCH``; deeper keys join with a
double underscore: ``ASR_ENGINE_ENDPOINT__TRAILING_SILENCE_MS``). Values are read as YAML
scalars, so ``ASR_SIP_TRANSPORTS='[udp, tcp]'`` gives a list.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from asr_gateway.yamlconf import ConfigError, read_yaml, validate_data

CHUNK_SIZES_MS = (160, 240, 320, 640)
ENV_PREFIX = "ASR_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_chunk_ms(value: int) -> int:
    if value not in CHUNK_SIZES_MS:
        allowed = ", ".join(str(ms) for ms in CHUNK_SIZES_MS)
        raise ValueError(f"{value} is not one of {allowed}")
    return value


class SipSettings(_Section):
    """Where and how SIP is accepted."""

    host: str = "0.0.0.0"
    port: int = Field(5060, ge=1, le=65535)
    transports: list[Literal["udp", "tcp", "tls"]] = ["udp", "tcp"]
    tls_port: int = Field(5061, ge=1, le=65535)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    acl_cidrs: list[str] = ["0.0.0.0/0", "::/0"]
    acl_action: Literal["reject", "drop"] = "reject"
    max_calls: int = Field(1000, ge=1)
    max_message_bytes: int = Field(65535, ge=1024)
    invite_rate_per_s: float = Field(200.0, gt=0)
    session_expires_s: int = Field(1800, ge=90)
    retry_after_s: int = Field(5, ge=1)

    @field_validator("acl_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError:
                raise ValueError(f"{value!r} is not a CIDR such as 10.0.0.0/8 or 2001:db8::/32") from None
        return values

    @model_validator(mode="after")
    def _tls_files(self) -> SipSettings:
        if "tls" in self.transports and (self.tls_cert is None or self.tls_key is None):
            raise ValueError("transport tls needs both tls_cert and tls_key")
        return self


class RtpSettings(_Section):
    """Media sockets and per-leg packet handling."""

    host: str = "0.0.0.0"
    advertise_host: str | None = Field(None, description="address put in SDP answers; default: the SIP local address")
    port_min: int = Field(20000, ge=1024, le=65534)
    port_max: int = Field(39999, ge=1025, le=65535)
    reorder_ms: int = Field(60, ge=0, le=1000)
    inactivity_timeout_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _range(self) -> RtpSettings:
        if self.port_max <= self.port_min:
            raise ValueError(f"port_max ({self.port_max}) must be above port_min ({self.port_min})")
        return self


class EndpointSettings(_Section):
    """When an utterance ends (WeNet's CTC endpoint rules, telephony defaults)."""

    blank_threshold: float = Field(0.8, gt=0.0, lt=1.0, description="a frame is silence when P(blank) exceeds this")
    trailing_silence_ms: int = Field(800, ge=0, description="silence after speech that ends an utterance")
    leading_silence_ms: int = Field(5000, ge=0, description="silence with nothing decoded that ends an utterance")
    max_utterance_ms: int = Field(20000, ge=1000, description="an utterance never gets longer than this")


class EngineSettings(_Section):
    """The shared batched recognizer."""

    model_dir: Path | None = Field(None, description="WeNet model directory; default: the bundled demo model")
    device: str = "cpu"
    backend: Literal["torch", "onnxruntime", "tensorrt"] = "torch"
    dtype: Literal["float32", "float16"] = "float32"
    threads: int = Field(0, ge=0, description="intra-op threads on CPU; 0 = torch's default")
    max_streams: int = Field(256, ge=1, description="cache pool slots: the node's admission limit")
    max_batch: int = Field(64, ge=1)
    max_wait_ms: float = Field(20.0, ge=0)
    chunk_ms: int = 160
    allowed_chunk_ms: list[int] = list(CHUNK_SIZES_MS)
    left_chunks: int = Field(8, ge=1)
    beam: int = Field(10, ge=1)
    ctc_weight: float = Field(0.5, ge=0.0, le=1.0)
    reverse_weight: float = Field(0.3, ge=0.0, le=1.0)
    rescore: bool = True
    endpoint: EndpointSettings = EndpointSettings()

    @field_validator("chunk_ms")
    @classmethod
    def _chunk(cls, value: int) -> int:
        return _check_chunk_ms(value)

    @field_validator("allowed_chunk_ms")
    @classmethod
    def _allowed(cls, values: list[int]) -> list[int]:
        for value in values:
            _check_chunk_ms(value)
        return sorted(set(values))

    @model_validator(mode="after")
    def _default_allowed(self) -> EngineSettings:
        if self.chunk_ms not in self.allowed_chunk_ms:
            raise ValueError(f"chunk_ms {self.chunk_ms} is not in allowed_chunk_ms {self.allowed_chunk_ms}")
        return self


class RedisSettings(_Section):
    """Where transcripts and events go."""

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field("asr", pattern=r"^[A-Za-z0-9_.:-]+$")
    stream_maxlen: int = Field(100_000, ge=100)
    call_ttl_s: int = Field(86_400, ge=60)
    partials_to_stream: bool = False
    queue_size: int = Field(10_000, ge=100)
    spool_dir: Path = Path("spool")
    spool_max_bytes: int = Field(1 << 30, ge=1 << 20)

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: str) -> str:
        schemes = ("redis://", "rediss://", "unix://", "redis+sentinel://")
        if not value.startswith(schemes):
            raise ValueError(f"{value!r} must start with one of {', '.join(schemes)}")
        return value


class LoggingSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = Field("auto", description="auto: console on a TTY, else JSON lines")


class MetricsSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(9108, ge=0, le=65535, description="Prometheus /metrics and /health; 0 disables")


class ServiceConfig(_Section):
    """Everything the service reads. File paths are relative to the config file."""

    sip: SipSettings = SipSettings()
    rtp: RtpSettings = RtpSettings()
    engine: EngineSettings = EngineSettings()
    redis: RedisSettings = RedisSettings()
    logging: LoggingSettings = LoggingSettings()
    metrics: MetricsSettings = MetricsSettings()
    routes: Path | None = Field(None, description="routing rules file (YAML)")
    kb: list[Path] = Field(default_factory=list, description="knowledge-base files (YAML or CSV)")
    tags: list[Path] = Field(default_factory=list, description="demand tag rule files (YAML)")


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Nested dict of ``ASR_<SECTION>_<KEY>`` values, plus errors for unparsable ones."""
    sections = {name.upper(): name for name in ServiceConfig.model_fields}
    overrides: dict[str, Any] = {}
    errors: list[str] = []
    for var, raw in sorted(environ.items()):
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX) :]
        longest_first = sorted(sections, key=len, reverse=True)
        section = next((s for s in longest_first if rest.startswith(s + "_") or rest == s), None)
        if section is None:
            continue
        key_path = [sections[section]]
        tail = rest[len(section) + 1 :]
        if tail:
            key_path += [part.lower() for part in tail.split("__")]
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            errors.append(f"env {var}: cannot read value {raw!r}")
            continue
        node = overrides
        for part in key_path[:-1]:
            node = node.setdefault(part, {})
        node[key_path[-1]] = value
    return overrides, errors


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: Path | str | None, environ: Mapping[str, str] | None = None) -> ServiceConfig:
    """Read ``path`` (None: defaults only), apply environment overrides, validate.

    Raises ConfigError whose lines name ``file:line key`` (or ``env VAR``) and what is allowed.
    """
    environ = os.environ if environ is None else environ
    if path is None:
        data: Any = {}
        index: dict[tuple[str | int, ...], int] = {}
        where: Path | str = "(defaults)"
    else:
        data, index = read_yaml(path)
        where = path
        if data is not None and not isinstance(data, dict):
            raise ConfigError([f"{path}:1 (top level): expected a mapping of sections, got {type(data).__name__}"])
    overrides, errors = _env_overrides(environ)
    if errors:
        raise ConfigError(errors)
    merged = _merge(data or {}, overrides)
    try:
        config = validate_data(where, merged, ServiceConfig, index)
    except ConfigError as exc:
        raise ConfigError([_attribute_env(line, overrides) for line in exc.errors]) from None
    if path is not None:
        config = _resolve_paths(config, Path(path).resolve().parent)
    return config


def _attribute_env(line: str, overrides: Mapping[str, Any]) -> str:
    """Say so when the offending key came from the environment rather than the file."""
    _, _, rest = line.partition(" ")
    dotted = rest.split(":", 1)[0]
    node: Any = overrides
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return line
        node = node[part]
    var = ENV_PREFIX + "_".join([dotted.split(".")[0].upper(), "__".join(p.upper() for p in dotted.split(".")[1:])])
    return f"env {var.rstrip('_')}: {rest.split(':', 1)[1].strip()}"


def _resolve_paths(config: ServiceConfig, base: Path) -> ServiceConfig:
    def resolve(p: Path) -> Path:
        return p if p.is_absolute() else base / p

    updates: dict[str, Any] = {"kb": [resolve(p) for p in config.kb], "tags": [resolve(p) for p in config.tags]}
    if config.routes is not None:
        updates["routes"] = resolve(config.routes)
    engine = config.engine
    if engine.model_dir is not None:
        engine = engine.model_copy(update={"model_dir": resolve(engine.model_dir)})
    redis = config.redis.model_copy(update={"spool_dir": resolve(config.redis.spool_dir)})
    return config.model_copy(update={**updates, "engine": engine, "redis": redis})
