"""RFC 3261 section 17 transactions (with RFC 6026's Accepted state), sans-IO.

A transaction keeps the last response it sent and the timers that retransmit it (over UDP)
or end it. The owner feeds events (``send_response``, ``retransmitted_request``, ``ack``,
``on_timer``) and gets back the messages to put on the wire; states move only along the
tables below, anything else raises ``LocalProtocolError``/``RemoteProtocolError`` naming the
event, the role and the state.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field

from sip.errors import LocalProtocolError, RemoteProtocolError, SipParseError
from sip.header_values import NameAddr, Via, parse_cseq
from sip.message import Address, Message, Request, Response

TimerKey = tuple[str, Hashable]


@dataclass(frozen=True)
class TimerConfig:
    """RFC 3261 timer base values, seconds."""

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0


class TxState(enum.Enum):
    TRYING = "Trying"
    PROCEEDING = "Proceeding"
    COMPLETED = "Completed"
    ACCEPTED = "Accepted"
    CONFIRMED = "Confirmed"
    TERMINATED = "Terminated"


S = TxState
# (state, event) -> next state. Events: what we send ("1xx", "2xx", "final" = 300-699),
# what the peer sends ("ack", "retransmit", "response"), timers ("timeout", "expire").
INVITE_SERVER: dict[tuple[TxState, str], TxState] = {
    (S.PROCEEDING, "1xx"): S.PROCEEDING,
    (S.PROCEEDING, "2xx"): S.ACCEPTED,
    (S.PROCEEDING, "final"): S.COMPLETED,
    (S.PROCEEDING, "retransmit"): S.PROCEEDING,
    (S.ACCEPTED, "retransmit"): S.ACCEPTED,
    (S.ACCEPTED, "ack"): S.CONFIRMED,
    (S.ACCEPTED, "timeout"): S.TERMINATED,
    (S.COMPLETED, "retransmit"): S.COMPLETED,
    (S.COMPLETED, "ack"): S.CONFIRMED,
    (S.COMPLETED, "timeout"): S.TERMINATED,
    (S.CONFIRMED, "retransmit"): S.CONFIRMED,
    (S.CONFIRMED, "ack"): S.CONFIRMED,
    (S.CONFIRMED, "expire"): S.TERMINATED,
}
NON_INVITE_SERVER: dict[tuple[TxState, str], TxState] = {
    (S.TRYING, "2xx"): S.COMPLETED,
    (S.TRYING, "final"): S.COMPLETED,
    (S.TRYING, "retransmit"): S.TRYING,
    (S.COMPLETED, "retransmit"): S.COMPLETED,
    (S.COMPLETED, "expire"): S.TERMINATED,
}
NON_INVITE_CLIENT: dict[tuple[TxState, str], TxState] = {
    (S.TRYING, "1xx"): S.PROCEEDING,
    (S.TRYING, "response"): S.TERMINATED,
    (S.TRYING, "timeout"): S.TERMINATED,
    (S.PROCEEDING, "1xx"): S.PROCEEDING,
    (S.PROCEEDING, "response"): S.TERMINATED,
    (S.PROCEEDING, "timeout"): S.TERMINATED,
}


def server_key(request: Request) -> tuple[str, str, str]:
    """The key of the server transaction ``request`` belongs to (RFC 3261 17.2.3: top Via's
    branch and sent-by, method; an ACK belongs to its INVITE's), after checking the headers
    every request must carry. ``SipParseError`` (400) when one is missing or malformed."""
    headers = request.headers
    vias = headers.get_all("Via")
    if not vias:
        raise SipParseError("request without a Via header")
    via = Via.parse(vias[0])
    for name in ("From", "To", "Call-ID"):
        if not headers.get(name):
            raise SipParseError(f"request without a {name} header")
    NameAddr.parse(headers.get("From") or "")
    NameAddr.parse(headers.get("To") or "")
    _, method = parse_cseq(headers.get("CSeq"))
    if method != request.method:
        raise SipParseError(f"CSeq method {method!r} differs from the request method {request.method!r}")
    method_key = "INVITE" if request.method == "ACK" else request.method
    return (via.branch or headers.get("Call-ID") or "", f"{via.host}:{via.port}", method_key)


def _response_event(status: int) -> str:
    if status < 200:
        return "1xx"
    return "2xx" if status < 300 else "final"


@dataclass
class _Transaction:
    key: Hashable
    reliable: bool
    timers: TimerConfig
    state: TxState
    role: str
    table: dict[tuple[TxState, str], TxState]
    retransmit_at: float | None = None
    interval: float = 0.0
    deadline: float | None = None
    peer: Address | None = None
    owner: str | None = None

    def _move(self, event: str, remote: bool) -> TxState:
        new = self.table.get((self.state, event))
        if new is None:
            error = RemoteProtocolError if remote else LocalProtocolError
            raise error(f"event {event!r} is illegal for the {self.role} in state {self.state.value}", 500)
        self.state = new
        return new

    def next_deadline(self) -> float | None:
        times = [t for t in (self.retransmit_at, self.deadline) if t is not None]
        return min(times) if times else None

    def _stop_timers(self) -> None:
        self.retransmit_at = None
        self.deadline = None

    def _start_retransmit(self, now: float) -> None:
        if not self.reliable:
            self.interval = self.timers.t1
            self.retransmit_at = now + self.interval

    def _backoff(self, now: float) -> None:
        self.interval = min(self.interval * 2, self.timers.t2)
        self.retransmit_at = now + self.interval


@dataclass
class ServerTransaction(_Transaction):
    """INVITE or non-INVITE server transaction; ``last_response`` is what a retransmission gets."""

    method: str = "INVITE"
    last_response: Response | None = None
    ack_timed_out: bool = False

    @classmethod
    def create(cls, key: Hashable, request: Request, reliable: bool, timers: TimerConfig) -> ServerTransaction:
        if request.method == "INVITE":
            return cls(key, reliable, timers, S.PROCEEDING, "INVITE server", INVITE_SERVER, method="INVITE")
        return cls(key, reliable, timers, S.TRYING, "non-INVITE server", NON_INVITE_SERVER, method=request.method)

    def send_response(self, response: Response, now: float) -> Response:
        """Record a response we send and arm the timers its kind needs."""
        new = self._move(_response_event(response.status), remote=False)
        self.last_response = response
        if new is S.ACCEPTED or (new is S.COMPLETED and self.method == "INVITE"):
            self._start_retransmit(now)
            self.deadline = now + 64 * self.timers.t1
        elif new is S.COMPLETED:
            self.deadline = now + (0.0 if self.reliable else 64 * self.timers.t1)
        return response

    def retransmitted_request(self) -> Response | None:
        """The peer repeated its request: answer with what we last sent (if anything)."""
        self._move("retransmit", remote=True)
        return self.last_response

    def ack(self, now: float) -> bool:
        """An ACK for our final response; True the first time (the one that confirms)."""
        first = self.state is not S.CONFIRMED
        self._move("ack", remote=True)
        if first:
            self.retransmit_at = None
            self.deadline = now + (0.0 if self.reliable else self.timers.t4)
        return first

    def on_timer(self, now: float) -> Response | None:
        """Run due timers; returns a response to retransmit, if one is due."""
        if self.deadline is not None and now >= self.deadline:
            self._stop_timers()
            if self.state is S.ACCEPTED:
                self.ack_timed_out = True
            waiting_for_ack = self.method == "INVITE" and self.state in (S.ACCEPTED, S.COMPLETED)
            self._move("timeout" if waiting_for_ack else "expire", remote=False)
            return None
        if self.retransmit_at is not None and now >= self.retransmit_at:
            self._backoff(now)
            return self.last_response
        return None


@dataclass
class ClientTransaction(_Transaction):
    """Non-INVITE client transaction for the requests we send (BYE)."""

    request: Request | None = None
    final_status: int | None = None

    @classmethod
    def create(
        cls, key: Hashable, request: Request, reliable: bool, timers: TimerConfig, now: float
    ) -> ClientTransaction:
        tx = cls(key, reliable, timers, S.TRYING, "non-INVITE client", NON_INVITE_CLIENT, request=request)
        tx._start_retransmit(now)
        tx.deadline = now + 64 * timers.t1
        return tx

    def receive_response(self, response: Response) -> bool:
        """True when the response is final and ends the transaction."""
        if self.state is S.TERMINATED:
            return False
        event = "1xx" if response.status < 200 else "response"
        self._move(event, remote=True)
        if event == "response":
            self.final_status = response.status
            self._stop_timers()
            return True
        return False

    def on_timer(self, now: float) -> Message | None:
        """Timer E retransmits the request, timer F gives up (``final_status`` stays None)."""
        if self.deadline is not None and now >= self.deadline:
            self._stop_timers()
            self._move("timeout", remote=False)
            return None
        if self.retransmit_at is not None and now >= self.retransmit_at:
            self._backoff(now)
            return self.request
        return None


@dataclass
class TimerQueue:
    """Deadlines by owner key; rescheduling replaces the owner's previous deadline."""

    _heap: list[tuple[float, int, TimerKey]] = field(default_factory=list)
    _due: dict[TimerKey, float] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def schedule(self, key: TimerKey, deadline: float | None) -> None:
        if deadline is None:
            self._due.pop(key, None)
            return
        if self._due.get(key) == deadline:
            return
        self._due[key] = deadline
        heapq.heappush(self._heap, (deadline, next(self._counter), key))

    def pop_due(self, now: float) -> list[TimerKey]:
        keys: list[TimerKey] = []
        while self._heap and self._heap[0][0] <= now:
            deadline, _, key = heapq.heappop(self._heap)
            if self._due.get(key) == deadline:
                del self._due[key]
                keys.append(key)
        return keys

    def next_deadline(self) -> float | None:
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._due)
