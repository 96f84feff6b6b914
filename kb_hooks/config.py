"""Settings of kb_hooks: the Redis publisher and the KB/tag files; the service config embeds them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from kb_hooks.types import RedactionMode


class RedisSettings(BaseModel):
    """Where and how events are published.

    ``url`` accepts ``redis://[:password@]host:port/db``, ``rediss://`` (TLS; add
    ``?ssl_ca_certs=/path/ca.pem`` or ``ssl_cert_reqs=none``), ``unix:///path/redis.sock`` and
    ``redis+sentinel://[:password@]host:port[,host2:port2]/service_name/db`` (``rediss+sentinel://``
    for TLS to the master; ``?sentinel_password=...`` when the sentinels require AUTH).
    """

    model_config = ConfigDict(extra="forbid")

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field("asr", min_length=1, pattern=r"^[^\s{}]+$")
    stream_maxlen: int = Field(10_000, ge=100, description="approximate max entries of one call's stream")
    firehose_maxlen: int = Field(1_000_000, ge=1_000, description="approximate max entries of {prefix}:events")
    call_ttl_s: int = Field(86_400, ge=1, description="lifetime of a call's stream after call.ended")
    orphan_ttl_s: int = Field(7 * 86_400, ge=1, description="lifetime of a call's stream if call.ended never comes")
    partials_to_stream: bool = False
    partials_to_pubsub: bool = True
    firehose_groups: list[str] = Field(
        default_factory=list, description="consumer groups created on the firehose at start (from its beginning)"
    )
    queue_size: int = Field(10_000, ge=10, description="journaled events also held in memory for sending")
    max_batch: int = Field(500, ge=1, description="events per pipeline round trip")
    spool_dir: Path = Path("spool")
    spool_max_bytes: int = Field(1 << 30, ge=1 << 16)
    spool_fsync: Literal["batch", "never"] = "batch"
    journal_audit_file: Path | None = Field(
        None, description="append 'event_id call_id event_type seq' of every journaled event (crash tests, audits)"
    )
    connect_timeout_s: float = Field(2.0, gt=0)
    op_timeout_s: float = Field(2.0, gt=0)
    retry_initial_s: float = Field(0.05, gt=0)
    retry_max_s: float = Field(2.0, gt=0)


class KbHooksSettings(BaseModel):
    """Knowledge bases and tag rule sets by name (routes refer to them), and the redaction policy."""

    model_config = ConfigDict(extra="forbid")

    kb_sets: dict[str, Path] = Field(default_factory=dict)
    tag_rule_sets: dict[str, Path] = Field(default_factory=dict)
    default_redaction: RedactionMode = RedactionMode.MASK
    hash_key: SecretStr = Field(
        SecretStr(""), description="HMAC key for redaction mode 'hash'; set it so hashes cannot be brute-forced"
    )
    mask_digit_runs: int = Field(
        7, ge=0, description="also redact any run of at least this many spoken or written digits (0 = off)"
    )
    max_suggestions_per_utterance: int = Field(3, ge=1)
    tags_on_partials: bool = False
