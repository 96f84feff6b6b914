"""How the calls of a route are transcribed and published: the ``Profile`` of the routes file.

Protocol-neutral: what every front door needs (chunk size, roles, KB set, redaction, joins ...)
plus the policies of the doors that take a call's media over RTP, declared here as plain
values (``SrtpPolicy``, ``RtpLatchName``) so that the call model needs no front door; the door
that applies one checks the same words (``sip/sdp.py``, ``rtp/latch.py``; a test keeps them equal).
The flat YAML keys of today's routes files are the profile's fields.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from asr_common.punctuation import PunctuationName
from calls.join import NO_JOIN, check_join_by
from calls.metadata import check_header_names
from calls.roles import Role, RoleRule

SrtpPolicy = Literal["off", "optional", "required"]
"""Which RTP profiles a route takes (``SrtpPolicy`` of ``sip/sdp.py``): plain, plain or SDES-keyed SRTP, SRTP."""
RtpLatchName = Literal["strict", "address", "first"]
"""Which sources an RTP leg takes (``LatchName`` of ``rtp/latch.py``)."""

_DEFAULT_ORDER: tuple[Role, ...] = ("caller", "agent")
_ALL_ROLES: tuple[Role, ...] = ("caller", "agent", "mixed")


def check_regex(value: str | None) -> str | None:
    """``value`` if it is None or compiles as a regular expression, else ValueError."""
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
    return value


class RoleRuleModel(BaseModel):
    """Recording role mapping (SIPREC): an AOR matching ``agent_aor`` is the agent, ``caller_aor``
    the caller; other streams take roles from ``label_order`` by their position in the offer."""

    model_config = ConfigDict(extra="forbid")
    agent_aor: str | None = None
    caller_aor: str | None = None
    label_order: list[Role] = Field(default_factory=lambda: list(_DEFAULT_ORDER))

    _regex = field_validator("agent_aor", "caller_aor")(check_regex)

    def to_rule(self) -> RoleRule:
        return RoleRule(self.agent_aor, self.caller_aor, tuple(self.label_order))


ChunkMs = Literal[160, 240, 320, 640]


class SurgeProfile(BaseModel):
    """How a route's calls give way when the node falls behind (the engine's ``surge``): their
    streams may move to longer chunks up to ``max_chunk_ms`` (equal to the route's ``chunk_ms``:
    never), keeping the same attention window; routes of lower ``priority`` move first and
    move back last. Only sizes the engine allows (``engine.allowed_chunk_ms``) whose chunk
    divides the window are used: 160 ms x 8 moves to 320 x 4 and 640 x 2, 240 is skipped."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_chunk_ms: ChunkMs = 640
    priority: int = 0


class WorkorderSection(BaseModel):
    """A route's work-order draft (``kb_hooks.workorder``): the form filled in as the call goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    streets: str | None = None
    """Name of a ``kb_hooks.street_lists`` file that addresses are normalized against."""
    fillers: list[str] | None = None
    """Words dropped from the caller's statement; unset: 嗯 呃 啊 那个 就是 然后 这个."""
    webhook_url: str | None = Field(None, pattern=r"^https?://\S+$")
    """The ticket system's URL: the console POSTs each confirmed work order there (``console.webhooks``)."""
    webhook_secret_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Environment variable (of the console) holding the webhook's HMAC-SHA256 key; unset: unsigned."""

    @field_validator("webhook_url")
    @classmethod
    def _usable_url(cls, url: str | None) -> str | None:
        """A URL the console's HTTP client can POST to: a host, and a port in 1..65535 (the
        pattern alone lets ``http://[::1/x`` and ``:99999`` through, and the sender cannot use them)."""
        if url is None:
            return None
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{url!r} is not a usable URL ({exc}): write it as https://host[:port]/path") from None
        if not parts.hostname or port == 0:
            raise ValueError(f"{url!r} names no host, or port 0: write it as https://host[:port]/path")
        return url


class Profile(BaseModel):
    """How the calls of a route are transcribed and published."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "default"
    chunk_ms: ChunkMs = 320
    left_chunks: int = Field(4, ge=1, le=64)
    transcribe: list[Role] = Field(default_factory=lambda: list(_ALL_ROLES))
    kb_set: str | None = None
    hotwords: str | None = None
    """Phrase file (one phrase per line, optional `` :BOOST``) biasing the finals' CTC search;
    relative to the routes file. Reloaded with the KB sets."""
    itn: bool = False
    """Finals' spoken numbers in digits (``text``), the spoken form kept in ``text_raw``."""
    attention_beam: int | None = Field(None, ge=0, le=16)
    """Finals of this route's calls: the attention decoder's proposals added to the CTC n-best
    (``joint``, e.g. 4) or 0 (WeNet's attention rescoring); unset: ``engine.attention_beam``
    (0 by default)."""
    punctuation: PunctuationName = "off"
    """Finals' punctuation (``asr_common.punctuation``): ``pauses`` adds commas and full stops
    where the speaker paused and question marks after 吗/呢/吧 and question words; the text
    without them is kept in ``text_raw``. Applied after ``itn``."""
    tag_rules: str | None = None
    analytics_rules: str | None = None
    """Name of a ``kb_hooks.analytics_rule_sets`` file: each call of the route ends with
    ``call.analytics`` (talk, silence, overlaps, speaking rate, the file's checks and categories)."""
    workorder: WorkorderSection | None = None
    """Set (``workorder: {}`` at least): ``workorder.updated`` events as the call fills in the form."""
    redaction: Literal["mask", "keep", "hash"] | None = None
    """How phone and ID numbers appear in what is published (``kb_hooks.redact``); unset: the
    node's ``kb_hooks.default_redaction`` (``mask`` unless configured)."""
    key_prefix: str | None = None
    """Redis key prefix of the route's calls' streams and channels; unset: the node's
    ``redis.key_prefix`` (a set default here would override every node's own)."""
    roles: RoleRuleModel = Field(default_factory=RoleRuleModel)
    srtp: SrtpPolicy = "off"
    """SRTP policy of the routes using this profile (``sip/sdp.py``): ``off`` takes plain RTP/AVP
    only and refuses an SRTP-only offer (488 with a Warning), ``optional`` takes plain RTP/AVP
    and SDES-keyed RTP/SAVP (RFC 4568), ``required`` RTP/SAVP only (a plain offer: 488)."""
    dtmf: Literal["off", "count", "publish"] = "count"
    """Key presses (RFC 4733) of the routes using this profile: ``count`` (per leg, in
    ``call.ended.stats.dtmf_events``), ``publish`` (also one ``dtmf`` event each, the key
    masked unless ``redaction: keep``) or ``off``. Never decoded as audio in any mode."""
    rtp_latch: RtpLatchName | None = None
    """RTP source policy of the routes using this profile, instead of the service's ``rtp.latch``
    (``rtp.latch`` module): ``first`` for peers behind NAT whose SDP names the wrong address."""
    metadata_headers: list[str] = Field(default_factory=list)
    """Headers (``X-Agent-Id``, ``X-UCID``, ``User-to-User`` ...) whose values go into
    ``call.started.metadata`` under the name as listed; matched case-insensitively, values
    cleaned and cut (``calls.metadata``)."""
    role: Role = "mixed"
    """Role of a plain (non-SIPREC) call's stream: ``mixed`` (both parties on one stream),
    or ``caller``/``agent`` when the recorder sends one party only."""
    join_by: str | None = None
    """Join two plain calls into one (``calls.join``; SIP: ``sip/cucm.py``): ``cucm`` (built-in-bridge
    From URI ``x-nearend``/``x-farend`` = agent/caller, paired by ``x-refci``), ``header:NAME`` or
    ``uri-param:NAME`` (From URI parameter), or ``uuid-prefix:N`` (AudioSocket: the first N hex
    digits of the connection's UUID); calls with the same value become one call. Unset: a CUCM
    built-in-bridge INVITE (one end named and an ``x-refci``) is joined as under ``cucm``, other
    calls stand alone; ``none`` (or YAML ``off``/``false``) joins nothing."""
    join_timeout_s: float = Field(5.0, gt=0, le=60)
    """How long (s) the first call of a pair waits for its partner before the call is
    announced alone; a partner later than that is a call of its own."""
    surge: SurgeProfile = Field(default_factory=SurgeProfile)
    """Longer chunks while the node is behind (``SurgeProfile``; the engine's ``surge.enabled``)."""

    @model_validator(mode="after")
    def _surge_not_below_chunk(self) -> Profile:
        if self.surge.max_chunk_ms < self.chunk_ms:
            raise ValueError(
                f"surge.max_chunk_ms {self.surge.max_chunk_ms} is below chunk_ms {self.chunk_ms}; "
                f"set it to {self.chunk_ms} for a route that never degrades"
            )
        return self

    bearer_token: SecretStr | None = Field(None, min_length=16)
    """WebSocket door: the token a client of the routes using this profile must present
    (``Authorization: Bearer <token>``, or ``?token=`` where a browser cannot set headers);
    None asks for none. Kept out of logs and reprs (``SecretStr``). Other doors have no way to
    present one and ignore it."""
    send_events: bool = False
    """WebSocket door, ``mod_audio_fork`` streams: send the call's events back as text frames
    (FreeSWITCH hands them to the dialplan as events). Application streams always get theirs."""

    @field_validator("join_by", mode="before")
    @classmethod
    def _join_rule(cls, value: object) -> object:
        """YAML 1.1 reads a bare ``off``/``no``/``false`` as false: the admin turned joins off."""
        if value is False:
            return NO_JOIN
        return check_join_by(value) if isinstance(value, str) else value

    @field_validator("srtp", "punctuation", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        """YAML 1.1 reads a bare ``off`` as false; take it as the word the admin wrote."""
        return "off" if value is False else value

    @field_validator("metadata_headers")
    @classmethod
    def _header_names(cls, value: list[str]) -> list[str]:
        check_header_names(value)
        return value
