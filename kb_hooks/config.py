"""Settings of kb_hooks: the Redis publisher and the KB/tag files; the service config embeds them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from kb_hooks.connection import url_kind, validate_url
from kb_hooks.keys import KeyLayout
from kb_hooks.types import RedactionMode


class RedisSettings(BaseModel):
    """Where and how events are published.

    ``url`` accepts ``redis://[:password@]host:port/db``, ``rediss://`` (TLS; add
    ``?ssl_ca_certs=/path/ca.pem`` or ``ssl_cert_reqs=none``), ``unix:///path/redis.sock`` and
    ``redis+sentinel://[:password@]host:port[,host2:port2]/service_name/db`` (``rediss+sentinel://``
    for TLS to the master; ``?sentinel_password=...`` when the sentinels require AUTH) and
    ``redis+cluster://[:password@]host:port[,host2:port2]`` (``rediss+cluster://`` for TLS).
    With a Cluster URL the keys carry hash tags and the firehose is ``firehose_shards`` streams
    (``kb_hooks.keys``).
    """

    model_config = ConfigDict(extra="forbid")

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(
        "asr",
        min_length=1,
        pattern=r"^[^\s{}]*(\{[^\s{}]+\}[^\s{}]*)?$",
        description="no whitespace; at most one non-empty {hash tag} (every key of the prefix in one Cluster slot)",
    )
    stream_maxlen: int = Field(10_000, ge=100, description="approximate max entries of one call's stream")
    firehose_maxlen: int = Field(1_000_000, ge=1_000, description="approximate max entries of {prefix}:events")
    call_ttl_s: int = Field(86_400, ge=1, description="lifetime of a call's stream after call.ended")
    orphan_ttl_s: int = Field(7 * 86_400, ge=1, description="lifetime of a call's stream if call.ended never comes")
    partials_to_stream: bool = False
    partials_to_pubsub: bool = True
    firehose_groups: list[str] = Field(
        default_factory=list, description="consumer groups created on the firehose at start (from its beginning)"
    )
    firehose_shards: int = Field(
        16, ge=1, le=1024, description="Cluster URLs only: firehose streams {prefix}:{n}:events, n = crc32(call_id) % N"
    )
    replica_acks: int | None = Field(
        None,
        ge=0,
        description="replicas that must confirm a batch (WAIT) before it leaves the journal; "
        "default 1 with a Sentinel URL, else 0 (not supported with Cluster URLs)",
    )
    replica_ack_timeout_ms: int = Field(200, ge=1, description="how long one WAIT for replicas may block a batch")
    replica_ack_grace_s: float = Field(
        10.0, gt=0, description="a master with fewer replicas than replica_acks is trusted alone after this long"
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

    @field_validator("url")
    @classmethod
    def _url_is_readable(cls, url: str) -> str:
        return validate_url(url)

    @model_validator(mode="after")
    def _replica_acks_fit_the_url(self) -> RedisSettings:
        if self.replica_acks and url_kind(self.url) == "cluster":
            raise ValueError("replica_acks is not supported with a redis+cluster:// URL; leave it unset")
        return self

    @property
    def layout(self) -> KeyLayout:
        """Key names for this URL: single-Redis, or Cluster with ``firehose_shards`` shards."""
        return KeyLayout(self.firehose_shards if url_kind(self.url) == "cluster" else 0)

    @property
    def wait_replicas(self) -> int:
        """``replica_acks`` with its default resolved."""
        if self.replica_acks is not None:
            return self.replica_acks
        return 1 if url_kind(self.url) == "sentinel" else 0


class KbHooksSettings(BaseModel):
    """Knowledge bases, tag and analytics rule sets by name (routes refer to them), and the redaction policy."""

    model_config = ConfigDict(extra="forbid")

    kb_sets: dict[str, Path] = Field(default_factory=dict)
    tag_rule_sets: dict[str, Path] = Field(default_factory=dict)
    analytics_rule_sets: dict[str, Path] = Field(
        default_factory=dict, description="call.analytics checks and categories (kb_hooks.analytics_rules)"
    )
    street_lists: dict[str, Path] = Field(
        default_factory=dict, description="street names work-order addresses are normalized against, one per line"
    )
    default_redaction: RedactionMode = RedactionMode.MASK
    hash_key: SecretStr = Field(
        SecretStr(""), description="HMAC key for redaction mode 'hash'; set it so hashes cannot be brute-forced"
    )
    mask_digit_runs: int = Field(
        7, ge=0, description="also redact any run of at least this many spoken or written digits (0 = off)"
    )
    max_suggestions_per_utterance: int = Field(3, ge=1)
    tags_on_partials: bool = False
