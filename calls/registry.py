"""The node's calls, whatever front door they came in through.

``CallRegistry`` stands between every door and the application (it is itself a
``calls.handler.CallHandler``): a call is counted from its first opened leg until the door says
it ended. Drain, readiness and the node's call limit, the metrics (by door) and the heartbeat all
read this one count, so a draining node waits for AudioSocket and WebSocket calls as it waits
for SIP ones, and a dashboard sees every call the node carries.

Thread-safe: doors call it on the event loop, readers on the metrics thread.
"""

from __future__ import annotations

import threading
from collections import Counter

from asr_common.audio import PcmSink
from asr_common.errors import CapacityError
from calls.call import CallInfo, CallSource, LegInfo
from calls.handler import CallHandler

SOURCES: tuple[CallSource, ...] = ("sip", "audiosocket", "websocket", "audio_fork")
"""Every door's name, in the order metrics list them."""


class CallsExhausted(CapacityError):
    """The node holds its ``max_calls`` calls already."""


class NodeDraining(CapacityError):
    """The node is draining: it takes no new call (a new leg of a call it holds is still taken)."""


class CallRegistry:
    """Counts the node's calls by door and holds the node-wide limits; passes everything on to
    ``handler`` (the application)."""

    def __init__(self, handler: CallHandler, max_calls: int) -> None:
        self.handler = handler
        self.max_calls = max_calls
        self._draining = False
        self._calls: dict[str, CallSource] = {}  # call id -> the door it came in through
        self._lock = threading.Lock()

    # -- what the node reads ------------------------------------------------------------

    @property
    def active(self) -> int:
        """Calls in progress, every door together."""
        with self._lock:
            return len(self._calls)

    def by_source(self) -> dict[CallSource, int]:
        """Calls in progress per door; every door is listed, with 0 where it has none."""
        with self._lock:
            counts = Counter(self._calls.values())
        return {source: counts.get(source, 0) for source in SOURCES}

    @property
    def draining(self) -> bool:
        return self._draining

    def set_draining(self) -> None:
        """From now on no new call is taken; the calls in progress go on."""
        with self._lock:
            self._draining = True

    # -- calls.handler.CallHandler ------------------------------------------------------

    def has_capacity(self, legs: int) -> bool:
        """Room for one more call of ``legs`` legs: not draining, under ``max_calls``, and the
        application's own room."""
        if self._draining or self.active >= self.max_calls:
            return False
        return self.handler.has_capacity(legs)

    def open_leg(self, call: CallInfo, leg: LegInfo) -> PcmSink:
        """Pass the leg on; a new call is counted before the application opens its first leg
        (so two doors' calls cannot both take the last place) and forgotten again when that fails."""
        with self._lock:
            new_call = call.call_id not in self._calls
            if new_call:
                if self._draining:
                    raise NodeDraining("this node is draining; try another")
                if len(self._calls) >= self.max_calls:
                    raise CallsExhausted(f"all {self.max_calls} calls of this node are in progress")
                self._calls[call.call_id] = call.source
        try:
            return self.handler.open_leg(call, leg)
        except BaseException:
            if new_call:
                with self._lock:
                    self._calls.pop(call.call_id, None)
            raise

    def leg_updated(self, call: CallInfo, leg: LegInfo) -> None:
        self.handler.leg_updated(call, leg)

    def call_ended(self, call: CallInfo, reason: str) -> None:
        with self._lock:
            self._calls.pop(call.call_id, None)
        self.handler.call_ended(call, reason)
