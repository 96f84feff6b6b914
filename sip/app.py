"""The boundary between SIP and the application: the ``CallHandler`` protocol and call records.

The SIP side decides *whether* a call is taken (routing, admission, SDP) and tells the
application about calls and legs; the application hands back a ``PcmSink`` per leg, into
which the RTP side writes 16 kHz PCM.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Protocol

from asr_common.errors import CapacityError
from rtp.sink import CountingSink, PcmSink
from sip.call_metadata import CallMetadata
from sip.routing import Profile
from sip.siprec import Role


class LegsExhausted(CapacityError):
    """A handler's own limit on open legs is reached (``CountingCallHandler``)."""


@dataclass(frozen=True)
class LegInfo:
    leg_id: str
    label: str | None
    role: Role
    aor: str | None
    codec: str
    name: str | None = None
    """Display name of the party sending the leg (From display name; SIPREC participant name)."""


@dataclass(frozen=True)
class CallInfo:
    call_id: str
    sip_call_id: str
    from_aor: str
    from_name: str | None
    to_aor: str
    to_name: str | None
    source: tuple[str, int, str]
    route: str | None
    profile: Profile
    siprec: bool
    legs: tuple[LegInfo, ...] = field(default=())
    metadata: CallMetadata = field(default_factory=CallMetadata)
    join_key: str | None = None
    """Plain calls only: INVITEs with the same key are one call to the application
    (``Profile.join_by``, ``sip.cucm``); None: the call stands alone."""

    def with_legs(self, legs: tuple[LegInfo, ...]) -> CallInfo:
        return replace(self, legs=legs)


class CallHandler(Protocol):
    """The application behind the UAS; ``open_leg`` raises a ``CapacityError`` (any of the
    family in ``asr_common.errors``) when no stream can be opened, and the INVITE gets 503."""

    def has_capacity(self, legs: int) -> bool: ...

    def open_leg(self, call: CallInfo, leg: LegInfo) -> PcmSink: ...

    def leg_updated(self, call: CallInfo, leg: LegInfo) -> None: ...

    def call_ended(self, call: CallInfo, reason: str) -> None: ...


class CountingCallHandler:
    """A ``CallHandler`` for tests and benchmarks: admits up to ``capacity`` legs and records events."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self.open_legs = 0
        self.sinks: dict[str, CountingSink] = {}
        self.calls: dict[str, CallInfo] = {}
        self.legs: dict[str, LegInfo] = {}
        self.updates: list[LegInfo] = []
        self.ended: dict[str, str] = {}
        self._lock = threading.Lock()

    def has_capacity(self, legs: int) -> bool:
        return self.open_legs + legs <= self.capacity

    def open_leg(self, call: CallInfo, leg: LegInfo) -> CountingSink:
        with self._lock:
            if self.open_legs >= self.capacity:
                raise LegsExhausted(f"all {self.capacity} legs are busy")
            self.open_legs += 1
            sink = CountingSink()
            self.sinks[leg.leg_id] = sink
            self.calls[call.call_id] = call
            self.legs[leg.leg_id] = leg
            return sink

    def leg_updated(self, call: CallInfo, leg: LegInfo) -> None:
        self.calls[call.call_id] = call
        self.legs[leg.leg_id] = leg
        self.updates.append(leg)

    def call_ended(self, call: CallInfo, reason: str) -> None:
        with self._lock:
            self.open_legs -= sum(1 for leg in call.legs if leg.leg_id in self.sinks)
            self.ended[call.call_id] = reason
            self.calls[call.call_id] = call
