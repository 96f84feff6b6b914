"""One AudioSocket connection's state machine: frames in, events out (sans-IO).

States and transitions are a table (``_TRANSITIONS``); a frame with no entry for the current
state raises ``PeerError`` naming the frame and the state. Audio must come after the UUID, in
whole 16-bit samples, at a rate the door takes (``rates``), and at one rate per connection.

==============  =========================  ==============
state           frame                      next state
==============  =========================  ==============
AWAIT_UUID      UUID                       STREAMING
STREAMING       AUDIO*, DTMF               STREAMING
any open        HANGUP, ERROR              CLOSED
==============  =========================  ==============
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import Enum

import numpy as np

from audiosocket.errors import PeerError
from audiosocket.frames import AUDIO_RATES, Frame, Kind


class State(Enum):
    AWAIT_UUID = "await_uuid"
    STREAMING = "streaming"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Identified:
    """The connection names its stream: Asterisk's UUID argument."""

    stream_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Audio:
    """Signed-linear samples at ``rate`` Hz: int16, shape (N,)."""

    rate: int
    samples: np.ndarray


@dataclass(frozen=True, slots=True)
class KeyPressed:
    """One DTMF key ("0"-"9", "*", "#", "A"-"D")."""

    key: str


@dataclass(frozen=True, slots=True)
class HungUp:
    """The call ended (Asterisk hung up; a closed connection is the same for the door)."""


@dataclass(frozen=True, slots=True)
class PeerFailed:
    """Asterisk reported an error (its code: 0 none, 1 hangup, 2 frame forwarding, 4 memory)."""

    code: int | None


Event = Identified | Audio | KeyPressed | HungUp | PeerFailed

_AUDIO_KINDS = frozenset(AUDIO_RATES)
_ANY_AUDIO = "audio"
_TRANSITIONS: dict[tuple[State, Kind | str], State] = {
    (State.AWAIT_UUID, Kind.UUID): State.STREAMING,
    (State.AWAIT_UUID, Kind.HANGUP): State.CLOSED,
    (State.AWAIT_UUID, Kind.ERROR): State.CLOSED,
    (State.STREAMING, _ANY_AUDIO): State.STREAMING,
    (State.STREAMING, Kind.DTMF): State.STREAMING,
    (State.STREAMING, Kind.HANGUP): State.CLOSED,
    (State.STREAMING, Kind.ERROR): State.CLOSED,
}
_DTMF_KEYS = frozenset("0123456789*#ABCD")
_ILLEGAL_REASONS = {(State.AWAIT_UUID, _ANY_AUDIO): "audio_before_uuid", (State.STREAMING, Kind.UUID): "second_uuid"}


class Session:
    """What one connection said so far; ``rates`` are the audio rates (Hz) the door takes."""

    def __init__(self, rates: frozenset[int]) -> None:
        self.rates = rates
        self.state = State.AWAIT_UUID
        self.rate: int | None = None
        """The connection's audio rate (Hz), fixed by its first audio frame."""

    def handle(self, frame: Frame) -> Event:
        """The event ``frame`` makes; PeerError when it is not allowed now or malformed."""
        key: Kind | str = _ANY_AUDIO if frame.kind in _AUDIO_KINDS else frame.kind
        next_state = _TRANSITIONS.get((self.state, key))
        if next_state is None:
            reason = _ILLEGAL_REASONS.get((self.state, key), "unexpected_frame")
            raise PeerError(reason, f"AudioSocket {frame.kind.name} frame not allowed in state {self.state.value}")
        event = self._event(frame)
        self.state = next_state
        return event

    def _event(self, frame: Frame) -> Event:
        payload = frame.payload
        if frame.kind is Kind.UUID:
            if len(payload) != 16:
                raise PeerError("bad_uuid", f"AudioSocket UUID of {len(payload)} bytes; it must be 16")
            return Identified(uuid.UUID(bytes=payload))
        if frame.kind is Kind.DTMF:
            key = payload.decode("ascii", "replace")
            if len(payload) != 1 or key not in _DTMF_KEYS:
                raise PeerError("bad_dtmf", f"AudioSocket DTMF payload {payload!r} is not one key of 0-9 * # A-D")
            return KeyPressed(key)
        if frame.kind is Kind.HANGUP:
            return HungUp()
        if frame.kind is Kind.ERROR:
            return PeerFailed(payload[0] if payload else None)
        return self._audio(AUDIO_RATES[frame.kind], payload)

    def _audio(self, rate: int, payload: bytes) -> Audio:
        if rate not in self.rates:
            taken = ", ".join(f"{r} Hz" for r in sorted(self.rates))
            raise PeerError("unsupported_rate", f"AudioSocket audio at {rate} Hz; this server takes {taken}")
        if self.rate is not None and rate != self.rate:
            raise PeerError("rate_changed", f"AudioSocket audio changed from {self.rate} to {rate} Hz mid-stream")
        if len(payload) % 2:
            raise PeerError("odd_length", f"AudioSocket audio of {len(payload)} bytes is not whole 16-bit samples")
        self.rate = rate
        return Audio(rate, np.frombuffer(payload, dtype="<i2").astype(np.int16))
