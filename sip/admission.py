"""Admission control at the SIP edge: who may send (ACL), how fast (per-source INVITE rate)
and whether there is room for another call (503 with Retry-After when full or draining).

Sans-IO like the rest of ``sip/``: the caller passes ``now`` (seconds) and acts on the answers.
Only real capacity errors count as "full": ``CAPACITY_ERRORS`` names them, so a bug in the
application is never mistaken for a busy node.
"""

from __future__ import annotations

import ipaddress

from rtp.ports import PortsExhausted
from sip.app import CallHandler, CapacityError
from sip.config import SipSettings
from sip.responses import HeaderPairs

MAX_RATE_SOURCES = 4096
"""Sources whose INVITE token bucket is remembered; the least recent is forgotten beyond this."""

CAPACITY_ERRORS: tuple[type[Exception], ...] = (CapacityError, PortsExhausted)
"""What opening a leg raises when the node is full (no engine slot, no RTP port): 503, not 500."""


class Admission:
    """The ACL, the per-source INVITE token buckets and the capacity checks of one UAS."""

    def __init__(self, settings: SipSettings, handler: CallHandler) -> None:
        self.settings = settings
        self.handler = handler
        self.draining = False
        self._acl = list(settings.acl_cidrs)
        self._buckets: dict[str, tuple[float, float]] = {}  # host -> (tokens, last refill s)

    def allowed(self, host: str) -> bool:
        """Whether ``host`` (an IP address) is inside the ACL; an empty ACL allows everyone."""
        if not self._acl:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._acl)

    def rate_ok(self, host: str, now: float) -> bool:
        """Token bucket per source IP; the table keeps the most recent sources only."""
        burst = float(self.settings.invite_burst)
        tokens, last = self._buckets.pop(host, (burst, now))
        tokens = min(burst, tokens + max(0.0, now - last) * self.settings.invite_rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[host] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > MAX_RATE_SOURCES:
            del self._buckets[next(iter(self._buckets))]
        return allowed

    def has_room(self, active_calls: int, legs: int) -> bool:
        """Room for a call of ``legs`` legs beside ``active_calls``: our call limit and the application's."""
        return active_calls < self.settings.max_calls and self.handler.has_capacity(legs)

    def accepting(self, active_calls: int, legs: int) -> bool:
        """Whether a new call (or an OPTIONS probe) would be taken now: not draining and room left."""
        return not self.draining and self.has_room(active_calls, legs)

    def retry_after(self) -> HeaderPairs:
        """The ``Retry-After`` header of a 503 for "full" or "draining"."""
        return (("Retry-After", str(self.settings.retry_after_s)),)
