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

from pydantic import BaseModel, ConfigDict, Field, field_validator

from calls.join import check_join_by
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


class Profile(BaseModel):
    """How the calls of a route are transcribed and published."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "default"
    chunk_ms: Literal[160, 240, 320, 640] = 320
    left_chunks: int = Field(4, ge=1, le=64)
    transcribe: list[Role] = Field(default_factory=lambda: list(_ALL_ROLES))
    kb_set: str | None = None
    hotwords: str | None = None
    """Phrase file (one phrase per line, optional `` :BOOST``) biasing the finals' CTC search;
    relative to the routes file. Reloaded with the KB sets."""
    itn: bool = False
    """Finals' spoken numbers in digits (``text``), the spoken form kept in ``text_raw``."""
    tag_rules: str | None = None
    analytics_rules: str | None = None
    """Name of a ``kb_hooks.analytics_rule_sets`` file: each call of the route ends with
    ``call.analytics`` (talk, silence, overlaps, speaking rate, the file's checks and categories)."""
    workorder: WorkorderSection | None = None
    """Set (``workorder: {}`` at least): ``workorder.updated`` events as the call fills in the form."""
    redaction: Literal["mask", "keep", "hash"] = "mask"
    key_prefix: str = "asr"
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
    ``uri-param:NAME`` (From URI parameter); calls with the same value become one call."""
    join_timeout_s: float = Field(5.0, gt=0, le=60)
    """How long (s) the first call of a pair waits for its partner before the call is
    announced alone; a partner later than that is a call of its own."""

    @field_validator("join_by")
    @classmethod
    def _join_rule(cls, value: str | None) -> str | None:
        return None if value is None else check_join_by(value)

    @field_validator("srtp", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        """YAML 1.1 reads a bare ``off`` as false; take it as the word the admin wrote."""
        return "off" if value is False else value

    @field_validator("metadata_headers")
    @classmethod
    def _header_names(cls, value: list[str]) -> list[str]:
        check_header_names(value)
        return value
