"""The application behind every front door: the ``CallHandler`` protocol, and a counting one.

A door tells the handler about calls and legs; the handler hands back a ``PcmSink`` per leg,
into which the door writes 16 kHz PCM.
"""

from __future__ import annotations

import threading
from typing import Protocol

from asr_common.audio import CountingPcmSink, PcmSink
from asr_common.errors import CapacityError
from calls.call import CallInfo, LegInfo


class LegsExhausted(CapacityError):
    """A handler's own limit on open legs is reached (``CountingCallHandler``)."""


class CallHandler(Protocol):
    """The application behind the doors; ``open_leg`` raises a ``CapacityError`` (any of the
    family in ``asr_common.errors``) when no stream can be opened, and the door refuses the
    call as busy (SIP: 503)."""

    def has_capacity(self, legs: int) -> bool: ...

    def open_leg(self, call: CallInfo, leg: LegInfo) -> PcmSink: ...

    def leg_updated(self, call: CallInfo, leg: LegInfo) -> None: ...

    def call_ended(self, call: CallInfo, reason: str) -> None: ...


class CountingCallHandler:
    """A ``CallHandler`` for tests and benchmarks: admits up to ``capacity`` legs and records events."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self.open_legs = 0
        self.sinks: dict[str, CountingPcmSink] = {}
        self.calls: dict[str, CallInfo] = {}
        self.legs: dict[str, LegInfo] = {}
        self.updates: list[LegInfo] = []
        self.ended: dict[str, str] = {}
        self._lock = threading.Lock()

    def has_capacity(self, legs: int) -> bool:
        return self.open_legs + legs <= self.capacity

    def open_leg(self, call: CallInfo, leg: LegInfo) -> CountingPcmSink:
        with self._lock:
            if self.open_legs >= self.capacity:
                raise LegsExhausted(f"all {self.capacity} legs are busy")
            self.open_legs += 1
            sink = CountingPcmSink()
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
