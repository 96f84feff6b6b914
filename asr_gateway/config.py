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

from asr_common.yamlconf import ConfigError, read_yaml, validate_data
from asr_core.engine_options import per_core, usable_cores
from asr_core.surge import SurgeSettings
from asr_gateway.state_dir import default_state_dir
from audiosocket.config import AudioSocketSettings
from kb_hooks.config import KbHooksSettings, RedisSettings
from rtp.latch import LatchName
from sip.config import SipSettings
from wsaudio.config import WebSocketSettings

CHUNK_SIZES_MS = (160, 240, 320, 640)
ENV_PREFIX = "ASR_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_chunk_ms(value: int) -> int:
    if value not in CHUNK_SIZES_MS:
        allowed = ", ".join(str(ms) for ms in CHUNK_SIZES_MS)
        raise ValueError(f"{value} is not one of {allowed}")
    return value


class RtpSettings(_Section):
    """Media sockets. (Per-leg packet handling -- reorder window, inactivity timeout -- is in ``sip``.)"""

    host: str = Field("0.0.0.0", description="address the RTP sockets bind to")
    port_min: int = Field(20000, ge=1024, le=65534)
    port_max: int = Field(39999, ge=1025, le=65535)
    resample_batch_ms: int = Field(
        80, ge=20, le=640, multiple_of=20,
        description="decoded audio is resampled and handed to the engine in pieces of this length (average "
        "added wait: half of it); 80 ms costs ~2 us less CPU per packet than 40 at 1000 calls",
    )  # fmt: skip
    resampler: Literal["halfband", "soxr"] = Field(
        "halfband",
        description="8 -> 16 kHz: halfband upsamples all legs' batches together (2.5 ms lag); soxr: one soxr "
        "HQ stream per leg (63 ms average lag, more CPU at 1000 calls)",
    )
    c_receive_path: bool = Field(
        True,
        description="read RTP with the C extension rtp._fastrtp where it was built (about half the CPU per packet); "
        "false: always in Python",
    )
    latch: LatchName = Field(
        "address",
        description="which sources a call's RTP is taken from: strict = the SDP's address and port; address = "
        "its IP, any port (a new port only with a new SSRC); first = the first source to send (risky: for peers "
        "behind NAT whose SDP address is wrong); a routing profile's rtp_latch overrides it",
    )
    poll_interval_ms: float = Field(
        20.0, ge=0, le=100,
        description="all legs' sockets are read together this often (adds up to this much delay); 0: read each "
        "datagram as it arrives (one event-loop wake-up per packet)",
    )  # fmt: skip

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
    energy_gate_db: float = Field(
        10.0,
        ge=0.0,
        description="a frame counts as silence when its audio is within this many dB of the call's noise floor "
        "and the model hears no token in it (blank its best label, whatever P(blank)); louder audio never "
        "counts (0 = WeNet's rule alone: P(blank) above blank_threshold)",
    )
    check_every_frame: bool = Field(
        True,
        description="trailing_silence_ms ends an utterance wherever it is reached, also inside a chunk with "
        "speech after it (the rest of the chunk is decoded again); false: at chunk ends only, as WeNet's "
        "runtime, where a pause up to one chunk longer can pass unnoticed",
    )


class SurgeConfig(_Section):
    """Graceful degradation (asr_core/surge.py): while the engine falls behind, streams whose
    route allows it (the profile's ``surge.max_chunk_ms``) move to longer chunks, which cost less
    per second of audio, lowest ``surge.priority`` first, and move back once it has caught up."""

    enabled: bool = Field(False, description="move streams to longer chunks while the engine is behind")
    degrade_ms: float = Field(300.0, gt=0, description="engine lag (ms) at or past which more streams move up")
    degrade_after_s: float = Field(
        1.0, ge=0, description="the lag at or past degrade_ms this long (s) before each move up: spikes move nothing"
    )
    restore_ms: float = Field(100.0, ge=0, description="engine lag (ms) at or under which streams move back")
    restore_after_s: float = Field(10.0, ge=0, description="calm this long (s) before each move back")
    step_interval_s: float = Field(2.0, ge=0, description="at least this long (s) between two moves")
    step_share: float = Field(0.25, gt=0, le=1, description="share of the streams one move takes")
    finals_reduce_ms: float = Field(
        1500.0,
        ge=0,
        description="a final waiting this long (ms) is searched the cheaper way (finals_beam, no decoder "
        "proposals), so finals catch up before finals_behind_ms refuses calls",
    )
    finals_beam: int = Field(4, ge=1, description="the finals' CTC beam while they catch up or the engine is saturated")
    finals_reduce_when_saturated: bool = Field(
        True,
        description="while the engine is saturated (behind with every call at its longest chunk) search every final "
        "the cheaper way too, however short its wait, so the partials get the finals' CPU back; false: only finals "
        "that waited finals_reduce_ms",
    )

    @model_validator(mode="after")
    def _thresholds(self) -> SurgeConfig:
        if self.restore_ms >= self.degrade_ms:
            raise ValueError(f"restore_ms ({self.restore_ms}) must be below degrade_ms ({self.degrade_ms})")
        return self

    def settings(self) -> SurgeSettings | None:
        """The engine's surge settings; None while disabled."""
        if not self.enabled:
            return None
        return SurgeSettings(
            degrade_ms=self.degrade_ms,
            degrade_after_s=self.degrade_after_s,
            restore_ms=self.restore_ms,
            restore_after_s=self.restore_after_s,
            step_interval_s=self.step_interval_s,
            step_share=self.step_share,
            finals_reduce_ms=self.finals_reduce_ms,
            finals_beam=self.finals_beam,
            finals_reduce_when_saturated=self.finals_reduce_when_saturated,
        )


class EngineSettings(_Section):
    """The shared batched recognizer."""

    model_dir: Path | None = Field(None, description="WeNet model directory; default: the bundled demo model")
    device: str = "cpu"
    backend: str = Field(
        "auto",
        description="auto: torch-int8 on a CPU (1.75x the real-time streams of torch fp32 on random weights; "
        "demo-model CER within about 1 point of fp32, docs/BENCHMARKS.md), torch on a GPU; or torch, torch-int8, "
        "onnxruntime, onnxruntime-int8, tensorrt-fp16, ...",
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="float16 on GPUs; bfloat16 on GPUs and CPUs with AVX512-BF16/AMX"
    )
    threads: int = Field(0, ge=0, description="intra-op threads on CPU; 0 = torch's default")
    finalizer: Literal["thread", "process"] = Field(
        "process",
        description="where finals are searched and rescored: a child process (CPU; keeps that work off the "
        "GIL the engine and the RTP loop share) or a thread",
    )
    traced_step: bool = Field(
        True,
        description="torch backends on a CPU: run full chunks as frozen TorchScript graphs, which do not wait "
        "for the GIL between operations (false: eager)",
    )
    traced_rescoring: bool = Field(
        True,
        description="on a CPU: run the finals' rescoring decoder as frozen TorchScript graphs, without Python "
        "between its operations (false: eager)",
    )
    step_threads: int = Field(
        1,
        ge=1,
        description="traced steps of 16+ streams are split into this many parts run at once, one core each; "
        "lowers partial latency where cores are free, but on a saturated node it takes CPU from the finals",
    )
    schedulers: int = Field(
        0,
        ge=0,
        description="engine scheduler threads, each batching its own share of the streams, so that chunk steps "
        "run on several cores at once; 0 (default) = one per CPU core this process may use (1 on a GPU); "
        "1 = a single engine thread, which on a 2-core node fell behind with a core idle",
    )
    finals_niceness: int = Field(
        15,
        ge=0,
        le=19,
        description="nice value added to the finals process: high = finals use only CPU the engine threads "
        "leave idle (starves them once those fill every core), 0 = an equal share",
    )
    finals_behind_ms: float = Field(
        4000.0,
        gt=0,
        description="an ended utterance waiting this long for its final makes the node refuse new calls (503) "
        "until the finals catch up",
    )
    finals_workers: int = Field(
        0,
        ge=0,
        description="finals searched at once, each by its own thread and (finalizer: process) child process; "
        "0 (the default) = one per CPU core this process may use (1 on a GPU)",
    )
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
    attention_beam: int = Field(
        0,
        ge=0,
        description="finals: hypotheses the attention decoder's own beam search adds to the CTC n-best before "
        "rescoring ('joint', e.g. 4); 0 = WeNet's attention rescoring of the CTC n-best, the default: with "
        "proposals the demo model's finals were worse than its partials on unseen sentences "
        "(docs/BENCHMARKS.md). A route's attention_beam overrides it for its calls",
    )
    endpoint: EndpointSettings = EndpointSettings()
    surge: SurgeConfig = SurgeConfig()

    @field_validator("chunk_ms")
    @classmethod
    def _chunk(cls, value: int) -> int:
        return _check_chunk_ms(value)

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        from asr_core.backends import BACKENDS

        if value != "auto" and value not in BACKENDS:
            raise ValueError(f"{value!r} is not one of auto, {', '.join(BACKENDS)}")
        return value

    @property
    def resolved_backend(self) -> str:
        """The backend ``auto`` stands for on this device, else the configured one."""
        if self.backend != "auto":
            return self.backend
        return "torch" if self.device.startswith("cuda") else "torch-int8"

    @property
    def resolved_schedulers(self) -> int:
        """The scheduler threads ``0`` stands for: one per usable core on a CPU, one on a GPU."""
        return per_core(self.schedulers, self.device)

    @property
    def resolved_finals_workers(self) -> int:
        """The finals workers ``0`` stands for: one per usable core on a CPU, one on a GPU."""
        return per_core(self.finals_workers, self.device)

    @property
    def resolved_threads(self) -> int:
        """torch intra-op threads to set (0: leave torch's default): with several schedulers on a
        CPU, the usable cores shared between them, so their steps do not oversubscribe the cores."""
        if self.threads or self.device.startswith("cuda") or self.resolved_schedulers == 1:
            return self.threads
        return max(1, usable_cores() // self.resolved_schedulers)

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


class LoggingSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = Field("auto", description="auto: console on a TTY, else JSON lines")


class MetricsSettings(_Section):
    host: str = Field("127.0.0.1", description="address of /metrics; it has no auth, so keep it on loopback")
    enabled: bool = True
    port: int = Field(9108, ge=0, le=65535, description="/metrics and the /health probes; 0 picks a free port")

    def open_settings(self) -> list[str]:
        """A warning when /metrics (no auth) listens beyond loopback."""
        if not self.enabled or self.host == "localhost":
            return []
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = False
        return [] if loopback else [f"metrics.host {self.host} serves /metrics without auth beyond loopback"]


class ServiceConfig(_Section):
    """Everything the service reads. File paths are relative to the config file."""

    sip: SipSettings = Field(default_factory=SipSettings)
    rtp: RtpSettings = Field(default_factory=RtpSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    kb_hooks: KbHooksSettings = Field(default_factory=KbHooksSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    audiosocket: AudioSocketSettings = Field(default_factory=AudioSocketSettings)
    websocket: WebSocketSettings = Field(default_factory=WebSocketSettings)
    routes: Path | None = Field(None, description="routing rules file (YAML); none: all calls get the default profile")


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
    spool_set = "spool_dir" in config.redis.model_fields_set
    if path is not None:
        config = _resolve_paths(config, Path(path).resolve().parent)
    if not spool_set:  # not beside the config file: /etc is read-only under systemd (state_dir.py)
        spool = default_state_dir(environ) / "spool"
        config = config.model_copy(update={"redis": config.redis.model_copy(update={"spool_dir": spool})})
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

    updates: dict[str, Any] = {}
    if config.routes is not None:
        updates["routes"] = resolve(config.routes)
    engine = config.engine
    if engine.model_dir is not None:
        engine = engine.model_copy(update={"model_dir": resolve(engine.model_dir)})
    redis = config.redis.model_copy(update={"spool_dir": resolve(config.redis.spool_dir)})
    hooks = config.kb_hooks.model_copy(
        update={
            "kb_sets": {name: resolve(p) for name, p in config.kb_hooks.kb_sets.items()},
            "tag_rule_sets": {name: resolve(p) for name, p in config.kb_hooks.tag_rule_sets.items()},
            "analytics_rule_sets": {name: resolve(p) for name, p in config.kb_hooks.analytics_rule_sets.items()},
            "street_lists": {name: resolve(p) for name, p in config.kb_hooks.street_lists.items()},
        }
    )
    return config.model_copy(update={**updates, "engine": engine, "redis": redis, "kb_hooks": hooks})
