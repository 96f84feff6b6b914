"""Routing of an incoming call to a ``Profile``: the admins' routes file.

Rules are tried in file order and the first whose every condition holds wins. A rule may
match what any front door can state (``CallFacts``): the source address (CIDRs or a named
trunk), the called and calling numbers (``to_user``, ``from_user``: regular expressions,
searched), headers or the door's key-value attributes (``X-Queue: ^sales``) and whether the
call is a SIPREC recording. No match gives ``default_profile``, or when that is unset the call
is rejected with ``reject_code``. Load files with ``load_routes``: errors name file:line and key.

A source address that does not parse (a proxy's header that is no address) fails the rules
with an address condition (``source_cidrs``, ``trunk``) and no others: rules on users, headers
or SIPREC still match it. ``Router.unparsable_sources`` counts such decisions; each such
address is logged once.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from asr_common.addresses import Address, Network, inside, parse_address
from asr_common.yamlconf import ConfigError, locate, read_yaml, validate_data
from calls.profile import Profile, check_regex

log = logging.getLogger(__name__)

MAX_LOGGED_UNPARSABLE = 256
"""Distinct unparsable source addresses a ``Router`` remembers having logged; later ones are
counted but not logged (a peer that invents addresses cannot fill the memory or the log)."""


class Match(BaseModel):
    """Conditions of a rule; all given ones must hold. Regexes are searched (anchor with ^...$)."""

    model_config = ConfigDict(extra="forbid")
    source_cidrs: list[Network] = Field(default_factory=list)
    trunk: str | None = None
    to_user: str | None = None
    from_user: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    siprec: bool | None = None

    _regex = field_validator("to_user", "from_user")(check_regex)

    @field_validator("headers")
    @classmethod
    def _header_regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            check_regex(pattern)
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
    """What a rule can look at, as a front door states it; named after the ``Match`` keys."""

    source_ip: str
    """The caller's address (SIP: the peer's, or the one a trusted proxy states)."""
    to_user: str
    """The called number or user (SIP: the To URI's user part); empty when unknown."""
    from_user: str
    """The calling number or user (SIP: the From URI's user part); empty when unknown."""
    headers: dict[str, str]
    """Named values the ``headers`` conditions match, names case-insensitive (SIP: the ``X-``
    headers; other doors: their key-value attributes)."""
    siprec: bool
    """A SIPREC recording session (RFC 7866); False from every other door."""


@dataclass(frozen=True)
class RouteDecision:
    route: str | None
    profile: Profile | None
    reject_code: int | None


class Router:
    """Decides routes; thread-safe (every door's event loop may call ``decide``).

    ``unparsable_sources``: decisions made for a source address that did not parse, since this
    routes file was loaded (a metric)."""

    def __init__(self, routes: RoutesFile | None = None) -> None:
        self.routes = routes or RoutesFile()
        problems = self.routes.reference_errors()
        if problems:
            raise ValueError("; ".join(message for _, message in problems))
        self._profiles = {
            name: profile.model_copy(update={"name": name}) for name, profile in self.routes.profiles.items()
        }
        self.unparsable_sources = 0
        self._logged_unparsable: set[str] = set()
        self._lock = threading.Lock()

    def decide(self, facts: CallFacts) -> RouteDecision:
        address = parse_address(facts.source_ip)
        if address is None:
            self._note_unparsable(facts.source_ip)
        for route in self.routes.routes:
            if self._matches(route.match, facts, address):
                return RouteDecision(route.name, self._profiles[route.profile], None)
        if self.routes.default_profile is not None:
            return RouteDecision(None, self._profiles[self.routes.default_profile], None)
        return RouteDecision(None, None, self.routes.reject_code)

    def _note_unparsable(self, source: str) -> None:
        with self._lock:
            self.unparsable_sources += 1
            first = source not in self._logged_unparsable and len(self._logged_unparsable) < MAX_LOGGED_UNPARSABLE
            if first:
                self._logged_unparsable.add(source)
        if first:
            log.warning(
                "routing: source address %r is no IP address; rules on source_cidrs or trunk do not match it",
                source,
            )

    def _matches(self, match: Match, facts: CallFacts, address: Address | None) -> bool:
        """Whether every condition of ``match`` holds; ``address`` is ``facts.source_ip`` parsed
        (None: unparsable, and then an address condition does not hold)."""
        if match.source_cidrs and (address is None or not inside(address, match.source_cidrs)):
            return False
        if match.trunk is not None and (address is None or not inside(address, self.routes.trunks[match.trunk])):
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
        raise ConfigError([f"{locate(path, index, loc)}: {message}" for loc, message in problems])
    return Router(routes)
