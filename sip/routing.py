"""Routing of an incoming call to a ``Profile``: the admins' routes file.

Rules are tried in file order and the first whose every condition holds wins. A rule may
match the source address (CIDRs or a named trunk), the To user / DID and the From user
(regular expressions, searched), request headers (``X-Queue: ^sales``) and whether the call
is a SIPREC recording. No match gives ``default_profile``, or when that is unset the call is
rejected with ``reject_code``. Load files with ``load_routes``: errors name file:line and key.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from asr_common.yamlconf import ConfigError, read_yaml, validate_data
from rtp.latch import LatchName
from sip.call_metadata import HEADER_NAME, MAX_METADATA_HEADERS
from sip.cucm import check_join_by
from sip.sdp import SrtpPolicy
from sip.siprec import Role, RoleRule

_DEFAULT_ORDER: tuple[Role, ...] = ("caller", "agent")
_ALL_ROLES: tuple[Role, ...] = ("caller", "agent", "mixed")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _check_regex(value: str | None) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
    return value


class RoleRuleModel(BaseModel):
    """SIPREC role mapping: an AOR matching ``agent_aor`` is the agent, ``caller_aor`` the caller;
    other streams take roles from ``label_order`` by their position in the offer."""

    model_config = ConfigDict(extra="forbid")
    agent_aor: str | None = None
    caller_aor: str | None = None
    label_order: list[Role] = Field(default_factory=lambda: list(_DEFAULT_ORDER))

    _regex = field_validator("agent_aor", "caller_aor")(_check_regex)

    def to_rule(self) -> RoleRule:
        return RoleRule(self.agent_aor, self.caller_aor, tuple(self.label_order))


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
    redaction: Literal["mask", "keep", "hash"] = "mask"
    key_prefix: str = "asr"
    roles: RoleRuleModel = Field(default_factory=RoleRuleModel)
    srtp: SrtpPolicy = "off"
    """SRTP policy of the routes using this profile (``sip.sdp``): ``off`` takes plain RTP/AVP
    only and refuses an SRTP-only offer (488 with a Warning), ``optional`` takes plain RTP/AVP
    and SDES-keyed RTP/SAVP (RFC 4568), ``required`` RTP/SAVP only (a plain offer: 488)."""
    dtmf: Literal["off", "count", "publish"] = "count"
    """RFC 4733 key presses of the routes using this profile: ``count`` (per leg, in
    ``call.ended.stats.dtmf_events``), ``publish`` (also one ``dtmf`` event each, the key
    masked unless ``redaction: keep``) or ``off``. Never decoded as audio in any mode."""
    rtp_latch: LatchName | None = None
    """RTP source policy of the routes using this profile, instead of the service's ``rtp.latch``
    (``rtp.latch`` module): ``first`` for peers behind NAT whose SDP names the wrong address."""
    metadata_headers: list[str] = Field(default_factory=list)
    """INVITE headers (``X-Agent-Id``, ``X-UCID``, ``User-to-User`` ...) whose values go into
    ``call.started.metadata`` under the name as listed; matched case-insensitively, values
    cleaned and cut (``sip.call_metadata``)."""
    role: Role = "mixed"
    """Role of a plain (non-SIPREC) call's stream: ``mixed`` (both parties on one stream),
    or ``caller``/``agent`` when the recorder sends one party only."""
    join_by: str | None = None
    """Join two plain INVITEs into one call (``sip.cucm``): ``cucm`` (built-in-bridge From URI
    ``x-nearend``/``x-farend`` = agent/caller, paired by ``x-refci``), ``header:NAME`` or
    ``uri-param:NAME`` (From URI parameter); INVITEs with the same value become one call."""
    join_timeout_s: float = Field(5.0, gt=0, le=60)
    """How long (s) the first INVITE of a pair waits for its partner before the call is
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
        if len(value) > MAX_METADATA_HEADERS:
            raise ValueError(f"at most {MAX_METADATA_HEADERS} metadata headers, got {len(value)}")
        seen: set[str] = set()
        for name in value:
            if not HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not a header name (letters, digits and '-', at most 64)")
            if name.lower() in seen:
                raise ValueError(f"{name!r} is listed twice")
            seen.add(name.lower())
        return value


class Match(BaseModel):
    """Conditions of a rule; all given ones must hold. Regexes are searched (anchor with ^...$)."""

    model_config = ConfigDict(extra="forbid")
    source_cidrs: list[Network] = Field(default_factory=list)
    trunk: str | None = None
    to_user: str | None = None
    from_user: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    siprec: bool | None = None

    _regex = field_validator("to_user", "from_user")(_check_regex)

    @field_validator("headers")
    @classmethod
    def _header_regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            _check_regex(pattern)
        return value


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    match: Match = Field(default_factory=Match)
    profile: str


class RoutesFile(BaseModel):
    """The routes file. ``profiles`` by name; ``trunks`` name groups of source CIDRs."""

    model_config = ConfigDict(extra="forbid")
    profiles: dict[str, Profile] = Field(default_factory=lambda: {"default": Profile()})
    trunks: dict[str, list[Network]] = Field(default_factory=dict)
    routes: list[Route] = Field(default_factory=list)
    default_profile: str | None = "default"
    reject_code: int = Field(404, ge=400, le=699)

    def reference_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Names that point nowhere, as (key path, message) pairs."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        known = ", ".join(sorted(self.profiles)) or "none"
        for i, route in enumerate(self.routes):
            if route.profile not in self.profiles:
                errors.append((("routes", i, "profile"), f"unknown profile {route.profile!r} (known: {known})"))
            if route.match.trunk is not None and route.match.trunk not in self.trunks:
                trunks = ", ".join(sorted(self.trunks)) or "none"
                errors.append(
                    (("routes", i, "match", "trunk"), f"unknown trunk {route.match.trunk!r} (known: {trunks})")
                )
        if self.default_profile is not None and self.default_profile not in self.profiles:
            errors.append((("default_profile",), f"unknown profile {self.default_profile!r} (known: {known})"))
        return errors


@dataclass(frozen=True)
class CallFacts:
    """What a rule can look at."""

    source_ip: str
    to_user: str
    from_user: str
    headers: dict[str, str]
    siprec: bool


@dataclass(frozen=True)
class RouteDecision:
    route: str | None
    profile: Profile | None
    reject_code: int | None


class Router:
    def __init__(self, routes: RoutesFile | None = None) -> None:
        self.routes = routes or RoutesFile()
        problems = self.routes.reference_errors()
        if problems:
            raise ValueError("; ".join(message for _, message in problems))
        self._profiles = {
            name: profile.model_copy(update={"name": name}) for name, profile in self.routes.profiles.items()
        }

    def decide(self, facts: CallFacts) -> RouteDecision:
        for route in self.routes.routes:
            if self._matches(route.match, facts):
                return RouteDecision(route.name, self._profiles[route.profile], None)
        if self.routes.default_profile is not None:
            return RouteDecision(None, self._profiles[self.routes.default_profile], None)
        return RouteDecision(None, None, self.routes.reject_code)

    def _matches(self, match: Match, facts: CallFacts) -> bool:
        try:
            address = ipaddress.ip_address(facts.source_ip)
        except ValueError:
            return False
        if match.source_cidrs and not any(address in net for net in match.source_cidrs):
            return False
        if match.trunk is not None and not any(address in net for net in self.routes.trunks[match.trunk]):
            return False
        if match.to_user is not None and not re.search(match.to_user, facts.to_user):
            return False
        if match.from_user is not None and not re.search(match.from_user, facts.from_user):
            return False
        lowered = {name.lower(): value for name, value in facts.headers.items()}
        for name, pattern in match.headers.items():
            value = lowered.get(name.lower())
            if value is None or not re.search(pattern, value):
                return False
        return match.siprec is None or match.siprec == facts.siprec


def load_routes(path: Path | str) -> Router:
    """Load and validate a routes file; raise ``ConfigError`` whose lines read ``file:line key: message``."""
    data, index = read_yaml(path)
    routes = validate_data(path, data, RoutesFile, index)
    problems = routes.reference_errors()
    if problems:
        raise ConfigError(
            [f"{path}:{_line_of(index, loc)} {'.'.join(map(str, loc))}: {message}" for loc, message in problems]
        )
    return Router(routes)


def _line_of(index: dict[tuple[str | int, ...], int], loc: tuple[str | int, ...]) -> int:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in index:
            return index[loc[:cut]]
    return 1
