"""The bridge worker's inbox: what it carries besides the engine's events, and the queue itself.

One FIFO for every producer, so the worker sees a call's messages in the order they happened
across threads: a key press before the leg's ``Ended``, the ``MemberEnded`` of a call after the
key presses and the legs' input end that came before it. (The worker publishes ``call.started``
before a call's first transcript and ``call.ended`` only once the call's last leg has sent its
last final and ``Ended``, whatever the order of those two messages.)

Three ways in, by who puts and what may be lost:

=====================  ========================================  =====================================
put                    who                                       when ``bound`` items are queued
=====================  ========================================  =====================================
``offer``              engine threads: partials                  dropped (the caller counts it)
``put_waiting``        engine threads: finals, stream ends       waits for room: back-pressure on the
                                                                 engine (its finals lag, the node is
                                                                 ``overloaded`` and refuses new calls)
``put``                the event loop: calls announced and       queued all the same, never waits;
                       ended, key presses, join timeouts         counted in ``over_bound``
=====================  ========================================  =====================================

So the event loop never waits for the worker, and no durable message is ever dropped. (A
message of the loop may pass an engine message still waiting for room; the worker's rules above
keep ``call.started`` first and ``call.ended`` last all the same.) What
the loop queues past the bound is small and limited by what the node admits: a few messages
per call and per key press, and a worker that falls behind soon makes the engine refuse new
calls (its finals wait past ``engine.finals_behind_ms``).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from rtp.dtmf import KeyPress

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AnnounceCall:
    """The call's legs are known: publish ``call.started``, unless it waits for a partner INVITE."""

    call_id: str


@dataclass(frozen=True, slots=True)
class JoinTimedOut:
    """The partner INVITE did not come within the profile's ``join_timeout_s``."""

    call_id: str


@dataclass(frozen=True, slots=True)
class LegKeyPress:
    """An RFC 4733 key press on a leg; ``publish``: the route sends ``dtmf`` events (else counts them)."""

    leg_id: str
    press: KeyPress
    publish: bool


@dataclass(frozen=True, slots=True)
class MemberEnded:
    """One incoming call (a door's call; SIP: an INVITE) of a call ended; the call ends with its last one."""

    member: str
    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The worker's last message: everything before it is handled."""


STOP = Stop()


class WorkQueue(Generic[T]):
    """A FIFO with a soft bound (``bound`` items; may be changed at any time). Thread-safe."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.over_bound = 0  # ``put``s that found ``bound`` items or more queued (queued all the same)
        self.waited = 0  # ``put_waiting``s that had to wait for room
        self.peak = 0  # the most items queued at once
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, item: T) -> None:
        """Queue ``item`` now, past the bound if need be: never waits (the event loop's way in)."""
        with self._lock:
            if len(self._items) >= self.bound:
                self.over_bound += 1
            self._append(item)

    def put_waiting(self, item: T) -> None:
        """Queue ``item`` once fewer than ``bound`` items are queued (an engine thread's durable events)."""
        with self._lock:
            if len(self._items) >= self.bound:
                self.waited += 1
                while len(self._items) >= self.bound:
                    self._not_full.wait()
            self._append(item)

    def offer(self, item: T) -> bool:
        """Queue ``item`` if fewer than ``bound`` items are queued; False: dropped."""
        with self._lock:
            if len(self._items) >= self.bound:
                return False
            self._append(item)
            return True

    def get(self) -> T:
        """The oldest item, waiting for one."""
        with self._lock:
            while not self._items:
                self._not_empty.wait()
            item = self._items.popleft()
            if len(self._items) < self.bound:
                self._not_full.notify()
            return item

    def _append(self, item: T) -> None:
        self._items.append(item)
        self.peak = max(self.peak, len(self._items))
        self._not_empty.notify()
