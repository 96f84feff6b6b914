"""The bridge's table of calls: each call's state, which call a leg and an incoming call (a
door's call; SIP: an INVITE) belong to, the join of partner calls (``calls.join.Joiner``) and the
door that watches a call.

The event loop adds legs and incoming calls; the bridge's worker reads them and ends calls. One
lock guards the table and the ``CallState`` fields both threads touch, and only this module
takes it, each time for a few dictionary operations: never while anything is published, so the
event loop never waits for the worker. The clock is passed in (``now``, monotonic seconds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calls.call import CallInfo, CallSource
from calls.join import Joiner
from kb_hooks.types import CallContext, Participant

EventListener = Callable[[dict[str, Any]], None]
"""Takes one published event of a watched call (the v1 JSON object, ``docs/events.md``) on the
bridge's worker thread, after the publisher took it; must not block and must not change it."""


@dataclass
class CallState:
    """One call. Set when made and never changed: ``ctx``, ``metadata``, ``source``. Under the
    table's lock, read and written only by ``CallTable`` while it holds it (the event loop and the
    worker both touch them): ``participants``, ``open_legs``, ``members``, ``ended_members``,
    ``join_key``, ``waiting``, ``ended_reason``. The worker's own (only the worker thread touches
    them, no lock): ``started``, ``audio_ms``, ``dtmf``."""

    ctx: CallContext
    metadata: dict[str, str]  # call.started.metadata: From/To, dialled number, listed headers
    source: CallSource  # the front door of the call's first leg (call.started.source)
    participants: dict[str, Participant] = field(default_factory=dict)  # leg_id -> participant
    open_legs: set[str] = field(default_factory=set)
    members: set[str] = field(default_factory=set)  # ids of the incoming calls joined here
    ended_members: set[str] = field(default_factory=set)
    join_key: str | None = None  # open for a partner call while set
    waiting: bool = False  # call.started held back for the partner
    ended_reason: str | None = None
    started: bool = False
    audio_ms: dict[str, int] = field(default_factory=dict)
    dtmf: dict[str, int] = field(default_factory=dict)  # leg_id -> key presses (route dtmf: count/publish)


class CallTable:
    """The calls in progress (``len``) and everything that points at them. Thread-safe."""

    def __init__(self) -> None:
        self._calls: dict[str, CallState] = {}
        self._leg_call: dict[str, str] = {}  # stream/leg id -> call id
        self._member_call: dict[str, str] = {}  # incoming call id -> call id it was joined to
        self._joiner = Joiner()  # join key -> call id waiting for its partner
        self._listeners: dict[str, EventListener] = {}  # call id -> the watching door's listener
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def empty(self) -> bool:
        """No call, leg, incoming call, join or watcher left: nothing of an ended call stays behind."""
        with self._lock:
            return not (self._calls or self._leg_call or self._member_call or self._joiner or self._listeners)

    # -- the event loop: legs, incoming calls, watchers ---------------------------------------

    def add_leg(
        self,
        call: CallInfo,
        leg_id: str,
        participant: Participant,
        context: Callable[[CallInfo], CallContext],
        now: float,
    ) -> tuple[str, CallState, bool]:
        """Record a leg of ``call``: (call id, its state, whether the leg opened a new call that
        waits for its join partner). ``call`` joins a call waiting with its join key (the partner
        stops waiting); a new call's context is ``context(call)``."""
        with self._lock:
            call_id = self._member_call.get(call.call_id)
            if call_id is None:
                call_id = self._join(call, now)
                self._member_call[call.call_id] = call_id
            state = self._calls.get(call_id)
            fresh = state is None
            if state is None:
                state = CallState(context(call), call.metadata.as_map(), call.source)
                if call.join_key is not None:
                    state.join_key = call.join_key
                    state.waiting = True
                    self._joiner.wait(call.join_key, call_id, now, call.profile.join_timeout_s)
                self._calls[call_id] = state
            state.members.add(call.call_id)
            state.participants[leg_id] = participant
            state.open_legs.add(leg_id)
            self._leg_call[leg_id] = call_id
            return call_id, state, fresh and state.waiting

    def _join(self, call: CallInfo, now: float) -> str:
        """The call that incoming call ``call`` becomes part of: a partner waiting with its join
        key and not ended, else a call of its own. Under the lock."""
        partner = self._joiner.take(call.join_key, now) if call.join_key is not None else None
        partner_state = self._calls.get(partner) if partner is not None else None
        if partner is None or partner_state is None or partner_state.ended_reason is not None:
            return call.call_id
        partner_state.join_key = None
        partner_state.waiting = False
        return partner

    def stop_waiting(self, state: CallState) -> None:
        """Announce the call without waiting for a partner (a leg opened without an event loop)."""
        with self._lock:
            state.waiting = False

    def leg_updated(self, call: CallInfo, leg_id: str, participant: Participant) -> None:
        with self._lock:
            state = self._calls.get(self._member_call.get(call.call_id, call.call_id))
            if state is not None:
                state.participants[leg_id] = participant

    def watch(self, call_id: str, listener: EventListener) -> None:
        with self._lock:
            self._listeners[call_id] = listener

    def unwatch(self, call_id: str) -> None:
        with self._lock:
            self._listeners.pop(call_id, None)

    # -- the worker -------------------------------------------------------------------------

    def get(self, call_id: str) -> CallState | None:
        with self._lock:
            return self._calls.get(call_id)

    def of_leg(self, leg_id: str) -> CallState | None:
        with self._lock:
            call_id = self._leg_call.get(leg_id)
            return self._calls.get(call_id) if call_id is not None else None

    def listener(self, call_id: str) -> EventListener | None:
        with self._lock:
            return self._listeners.get(call_id)

    def participant(self, state: CallState, leg_id: str) -> Participant:
        with self._lock:
            return state.participants.get(leg_id, Participant("mixed"))

    def to_announce(self, state: CallState, *, now: bool = False) -> list[Participant] | None:
        """The participants of ``call.started`` when the call is to be announced: not yet and not
        waiting for its partner (``now``: it stops waiting first); else None."""
        with self._lock:
            if now:
                state.waiting = False
            if state.started or state.waiting:
                return None
            return list(state.participants.values())

    def close_join(self, state: CallState) -> None:
        """The call waits for no partner any longer."""
        with self._lock:
            if state.join_key is not None:
                self._joiner.close(state.join_key, state.ctx.call_id)
            state.join_key = None
            state.waiting = False

    def leg_ended(self, state: CallState, leg_id: str) -> None:
        with self._lock:
            state.open_legs.discard(leg_id)
            self._leg_call.pop(leg_id, None)

    def member_ended(self, member: str, reason: str) -> CallState | None:
        """Incoming call ``member`` ended: the state of its call when that was the call's last
        incoming call (the call's join closed, ``reason`` its end's); None while another is up."""
        with self._lock:
            state = self._calls.get(self._member_call.pop(member, member))
            if state is None:
                return None
            state.ended_members.add(member)
            if state.members - state.ended_members:
                return None
            state.ended_reason = reason
        self.close_join(state)
        return state

    def take_ended(self, state: CallState) -> str | None:
        """The reason the call ended, taking it out of the table, once it has ended and its last
        leg sent its last event; None before."""
        with self._lock:
            reason = state.ended_reason
            if reason is None or state.open_legs:
                return None
            self._calls.pop(state.ctx.call_id, None)
            return reason
