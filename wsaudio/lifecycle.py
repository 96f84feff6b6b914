"""One WebSocket connection's lifecycle, sans-IO: what the door may do next, as a table.

The transport (``server``) turns what happens on the socket, and its own decisions, into
``Trigger``\\ s and asks ``Lifecycle.handle`` for the next state; a pair with no entry in
``TRANSITIONS`` raises ``PeerError`` when the peer caused it (audio before the start, or after
the end signal) and ``LifecycleError`` when the door itself asked for it (a bug).

===================  ==========================================  ===================
state                trigger                                      next state
===================  ==========================================  ===================
AWAITING_HANDSHAKE   REQUEST (upgrade accepted)                   AWAITING_START
AWAITING_HANDSHAKE   REJECT (HTTP 503: draining, source cap)      CLOSED
AWAITING_START       START (the start message, call admitted)     STREAMING
STREAMING            AUDIO, TEXT (ignored text, mod_audio_fork)   STREAMING
STREAMING            END (the end signal)                         INPUT_ENDED
INPUT_ENDED          END, TEXT (ignored)                          INPUT_ENDED
STREAMING,           CALL_ENDED (the call's last event sent:      CLOSING
INPUT_ENDED          the door closes with 1000)
AWAITING_START,      REFUSE (the door closes: bad input, a        CLOSING
STREAMING,           limit, a slow reader)
INPUT_ENDED
CLOSING              AUDIO, TEXT (read and dropped until the      CLOSING
                     peer answers the close, RFC 6455 5.5.1)
any open state       PEER_CLOSED (its close frame, or EOF)        CLOSED
any open state       ABORT (no close handshake: a deadline,       CLOSED
                     a broken transport, shutdown)
===================  ==========================================  ===================

Leaving STREAMING ends the call's input (``Transition.ends_input``: the legs are finished
and the application told, once); entering CLOSING or CLOSED stops the replies
(``Transition.stops_replies``: nothing more is written but the close frame).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from wsaudio.errors import LifecycleError, PeerError


class State(Enum):
    AWAITING_HANDSHAKE = "awaiting_handshake"
    AWAITING_START = "awaiting_start"
    STREAMING = "streaming"
    INPUT_ENDED = "input_ended"
    CLOSING = "closing"
    """The door sent its close frame and waits for the peer's."""
    CLOSED = "closed"


class Trigger(Enum):
    REQUEST = "request"
    REJECT = "reject"
    START = "start"
    AUDIO = "audio"
    TEXT = "text"
    END = "end"
    CALL_ENDED = "call_ended"
    REFUSE = "refuse"
    PEER_CLOSED = "peer_closed"
    ABORT = "abort"


OPEN_STATES = frozenset(State) - {State.CLOSED}
_WEBSOCKET_OPEN = (State.AWAITING_START, State.STREAMING, State.INPUT_ENDED)

TRANSITIONS: dict[tuple[State, Trigger], State] = {
    (State.AWAITING_HANDSHAKE, Trigger.REQUEST): State.AWAITING_START,
    (State.AWAITING_HANDSHAKE, Trigger.REJECT): State.CLOSED,
    (State.AWAITING_START, Trigger.START): State.STREAMING,
    (State.STREAMING, Trigger.AUDIO): State.STREAMING,
    (State.STREAMING, Trigger.TEXT): State.STREAMING,
    (State.STREAMING, Trigger.END): State.INPUT_ENDED,
    (State.INPUT_ENDED, Trigger.END): State.INPUT_ENDED,
    (State.INPUT_ENDED, Trigger.TEXT): State.INPUT_ENDED,
    (State.STREAMING, Trigger.CALL_ENDED): State.CLOSING,
    (State.INPUT_ENDED, Trigger.CALL_ENDED): State.CLOSING,
    **{(state, Trigger.REFUSE): State.CLOSING for state in _WEBSOCKET_OPEN},
    (State.CLOSING, Trigger.AUDIO): State.CLOSING,
    (State.CLOSING, Trigger.TEXT): State.CLOSING,
    **{(state, Trigger.PEER_CLOSED): State.CLOSED for state in OPEN_STATES},
    **{(state, Trigger.ABORT): State.CLOSED for state in OPEN_STATES},
}
"""(state, trigger) → next state; every pair not listed is illegal."""

PEER_REASONS: dict[tuple[State, Trigger], tuple[str, str]] = {
    (State.AWAITING_START, Trigger.AUDIO): ("audio_before_start", "binary message before the start message"),
    (State.INPUT_ENDED, Trigger.AUDIO): ("audio_after_end", "binary message after the end signal"),
}
"""The illegal pairs a peer can cause: (refusal reason, message) of the ``PeerError`` raised."""


@dataclass(frozen=True, slots=True)
class Transition:
    before: State
    after: State

    @property
    def ends_input(self) -> bool:
        """The call's input ends now: finish its legs and tell the application."""
        return self.before is State.STREAMING and self.after is not State.STREAMING

    @property
    def stops_replies(self) -> bool:
        """No reply may be written from now on (the close frame aside): stop and free them."""
        closing = (State.CLOSING, State.CLOSED)
        return self.after in closing and self.before not in closing


class Lifecycle:
    """Where one connection stands; starts awaiting its upgrade request."""

    def __init__(self) -> None:
        self.state = State.AWAITING_HANDSHAKE

    @property
    def replying(self) -> bool:
        """Whether the call's replies may still be written."""
        return self.state in (State.STREAMING, State.INPUT_ENDED)

    def handle(self, trigger: Trigger) -> Transition:
        """Move on by ``trigger``; PeerError or LifecycleError (naming both) when not allowed now."""
        after = TRANSITIONS.get((self.state, trigger))
        if after is None:
            peer = PEER_REASONS.get((self.state, trigger))
            if peer is not None:
                raise PeerError(*peer)
            raise LifecycleError(f"WebSocket connection: {trigger.name} is not allowed in state {self.state.name}")
        transition = Transition(self.state, after)
        self.state = after
        return transition
