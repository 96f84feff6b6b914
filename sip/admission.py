"""Admission control at the SIP edge: who may send (ACL), how fast (per-source request and
INVITE rates), how much of the node one source may hold (transactions, connections) and
whether there is room for another call (503 with Retry-After when full or draining).

Budgets are per source IP so that one sender cannot shut out the others; trusted sources
(``trusted_cidrs`` and the routes file's trunks) get ``trusted_budget_factor`` times as much
and are exempt from the node-wide caps, which exist to bound memory against everyone else.

Behind a SIP proxy (``trusted_proxies``, e.g. Kamailio's dispatcher) every request seems to come
from the proxy; the proxy states the caller's address in ``source_header`` and ``origin`` takes
it from there, for the ACL, the INVITE rate and routing. The header is believed from a trusted
proxy only; from anyone else it is ignored (the UAS counts and logs it at debug level).

Sans-IO like the rest of ``sip/``: the caller passes ``now`` (seconds) and acts on the answers.
Only real capacity errors count as "full": ``CAPACITY_ERRORS`` names them, so a bug in the
application is never mistaken for a busy node.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from asr_common.addresses import host_inside
from asr_common.errors import CapacityError
from calls.handler import CallHandler
from rtp.ports import PortsExhausted
from sip.config import Network, SipSettings
from sip.message import Request
from sip.responses import HeaderPairs

MAX_RATE_SOURCES = 4096
"""Sources whose token buckets are remembered; the least recent is forgotten beyond this."""

CAPACITY_ERRORS: tuple[type[Exception], ...] = (CapacityError, PortsExhausted)
"""What opening a leg raises when the node is full (no engine slot, no RTP port): 503, not 500."""


class TokenBuckets:
    """One token bucket per source IP (``rate_per_s`` tokens a second, ``burst`` deep); the
    table keeps the most recent ``MAX_RATE_SOURCES`` sources only."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # host -> (tokens, last refill s)

    def take(self, host: str, now: float, scale: int = 1) -> bool:
        """Spend one token of ``host``'s bucket (rate and depth times ``scale``); False when empty."""
        burst = self.burst * scale
        tokens, last = self._buckets.pop(host, (burst, now))
        tokens = min(burst, tokens + max(0.0, now - last) * self.rate_per_s * scale)
        allowed = tokens >= 1.0
        self._buckets[host] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > MAX_RATE_SOURCES:
            del self._buckets[next(iter(self._buckets))]
        return allowed


class Admission:
    """The ACL, the per-source budgets and the capacity checks of one UAS."""

    def __init__(self, settings: SipSettings, handler: CallHandler, trusted: Iterable[Network] = ()) -> None:
        self.settings = settings
        self.handler = handler
        self.draining = False
        self._acl = settings.effective_acl()
        # Node-wide caps that bound memory; one untrusted source may hold at most half of each.
        self.max_transactions = settings.max_calls * 8 + 256
        self.max_connections = settings.max_calls * 2 + 64
        self._source_transactions = min(settings.source_max_transactions, self.max_transactions // 2)
        self._source_connections = min(settings.source_max_connections, self.max_connections // 2)
        self._proxies: tuple[Network, ...] = tuple(settings.trusted_proxies)
        self._trusted: tuple[Network, ...] = ()
        self.set_trusted_trunks(trusted)
        self._invites = TokenBuckets(settings.invite_rate_per_s, settings.invite_burst)
        self._requests = TokenBuckets(settings.source_rate_per_s, settings.source_burst)

    def set_trusted_trunks(self, trunks: Iterable[Network]) -> None:
        """Trusted sources: ``trusted_cidrs`` plus the routes file's ``trunks`` (again after a reload)."""
        self._trusted = (*self.settings.trusted_cidrs, *self._proxies, *trunks)

    def allowed(self, host: str) -> bool:
        """Whether ``host`` (an IP address) is inside the ACL (``SipSettings.effective_acl``) or a trusted proxy."""
        return host_inside(host, self._acl) or self.is_proxy(host)

    def is_proxy(self, host: str) -> bool:
        """Whether ``host`` is one of ``trusted_proxies``."""
        return bool(self._proxies) and host_inside(host, self._proxies)

    def stated_source(self, request: Request) -> str | None:
        """The raw ``source_header`` of ``request``, if it has one."""
        return request.headers.get(self.settings.source_header)

    def origin(self, request: Request, host: str) -> str:
        """Where ``request``, received from ``host``, comes from: the address a trusted proxy states in
        ``source_header``, else ``host`` (no header, an unreadable one, or a sender that is no trusted proxy)."""
        value = self.stated_source(request)
        if value is None or not self.is_proxy(host):
            return host
        return parse_source_address(value) or host

    def trusted(self, host: str) -> bool:
        """Whether ``host`` is a trusted proxy or a routing trunk."""
        return bool(self._trusted) and host_inside(host, self._trusted)

    def budget_factor(self, host: str) -> int:
        return self.settings.trusted_budget_factor if self.trusted(host) else 1

    def rate_ok(self, host: str, now: float) -> bool:
        """The per-source INVITE rate (new calls)."""
        return self._invites.take(host, now, self.budget_factor(host))

    def request_rate_ok(self, host: str, now: float) -> bool:
        """The per-source rate of all requests, retransmissions and ACKs included."""
        return self._requests.take(host, now, self.budget_factor(host))

    def transactions_ok(self, host: str, held: int) -> bool:
        """Whether ``host``, holding ``held`` server transactions, may open another."""
        return held < self._source_transactions * self.budget_factor(host)

    def connections_ok(self, host: str, held: int) -> bool:
        """Whether ``host``, holding ``held`` TCP/TLS connections, may open another."""
        return held < self._source_connections * self.budget_factor(host)

    def has_room(self, active_calls: int, legs: int) -> bool:
        """Room for a call of ``legs`` legs beside ``active_calls``: our call limit and the application's."""
        return active_calls < self.settings.max_calls and self.handler.has_capacity(legs)

    def accepting(self, active_calls: int, legs: int) -> bool:
        """Whether a new call (or an OPTIONS probe) would be taken now: not draining and room left."""
        return not self.draining and self.has_room(active_calls, legs)

    def retry_after(self) -> HeaderPairs:
        """The ``Retry-After`` header of a 503 for "full" or "draining"."""
        return (("Retry-After", str(self.settings.retry_after_s)),)


def parse_source_address(value: str) -> str | None:
    """The IP address of a ``source_header`` value (``IP``, ``IPv4:port`` or ``[IPv6]:port``); None if unreadable."""
    text = value.strip()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None
