"""The WebSocket connection's lifecycle (``wsaudio/lifecycle.py``) without a socket: every
(state, trigger) pair either moves as the table says or raises the right error, the table
reaches every state, input ends exactly once, and replies stop on the way to a close."""

from __future__ import annotations

import itertools

import pytest

from wsaudio.errors import LifecycleError, PeerError
from wsaudio.lifecycle import OPEN_STATES, PEER_REASONS, TRANSITIONS, Lifecycle, State, Trigger

PATHS: dict[State, list[Trigger]] = {
    State.AWAITING_HANDSHAKE: [],
    State.AWAITING_START: [Trigger.REQUEST],
    State.STREAMING: [Trigger.REQUEST, Trigger.START],
    State.INPUT_ENDED: [Trigger.REQUEST, Trigger.START, Trigger.END],
    State.CLOSING: [Trigger.REQUEST, Trigger.START, Trigger.REFUSE],
    State.CLOSED: [Trigger.REQUEST, Trigger.START, Trigger.PEER_CLOSED],
}
"""A way to reach each state from a new connection."""


def lifecycle_in(state: State) -> Lifecycle:
    lifecycle = Lifecycle()
    for trigger in PATHS[state]:
        lifecycle.handle(trigger)
    assert lifecycle.state is state
    return lifecycle


@pytest.mark.parametrize(("state", "trigger"), list(itertools.product(State, Trigger)))
def test_every_pair_moves_as_the_table_says_or_raises_naming_it(state: State, trigger: Trigger) -> None:
    lifecycle = lifecycle_in(state)
    after = TRANSITIONS.get((state, trigger))
    if after is not None:
        transition = lifecycle.handle(trigger)
        assert (transition.before, transition.after, lifecycle.state) == (state, after, after)
    elif (state, trigger) in PEER_REASONS:
        with pytest.raises(PeerError) as info:
            lifecycle.handle(trigger)
        assert info.value.reason == PEER_REASONS[state, trigger][0]
        assert lifecycle.state is state
    else:
        with pytest.raises(LifecycleError, match=f"{trigger.name} is not allowed in state {state.name}"):
            lifecycle.handle(trigger)
        assert lifecycle.state is state


def test_the_table_is_complete() -> None:
    reached = {State.AWAITING_HANDSHAKE} | set(TRANSITIONS.values())
    assert reached == set(State)
    assert all(state in OPEN_STATES for state, _ in TRANSITIONS)  # a closed connection takes nothing
    for state in OPEN_STATES:  # every open connection can end, with or without a close handshake
        assert TRANSITIONS[state, Trigger.PEER_CLOSED] is State.CLOSED
        assert TRANSITIONS[state, Trigger.ABORT] is State.CLOSED
    assert not set(PEER_REASONS) & set(TRANSITIONS)
    assert {reason for reason, _ in PEER_REASONS.values()} == {"audio_before_start", "audio_after_end"}


def test_input_ends_once_on_leaving_streaming_and_replies_stop_on_the_way_to_a_close() -> None:
    for path in (
        [Trigger.END, Trigger.CALL_ENDED, Trigger.PEER_CLOSED],  # an application: end signal, last event, close
        [Trigger.AUDIO, Trigger.PEER_CLOSED],  # mod_audio_fork: the fork's close ends the call
        [Trigger.AUDIO, Trigger.REFUSE, Trigger.AUDIO, Trigger.ABORT],  # a slow reader that never answers the close
        [Trigger.CALL_ENDED, Trigger.TEXT, Trigger.PEER_CLOSED],  # the application ended the call first
    ):
        lifecycle = lifecycle_in(State.STREAMING)
        transitions = [lifecycle.handle(trigger) for trigger in path]
        assert sum(t.ends_input for t in transitions) == 1, path
        assert sum(t.stops_replies for t in transitions) == 1, path
        assert lifecycle.state is State.CLOSED


def test_replies_flow_only_while_the_stream_is_open() -> None:
    assert {state for state in State if lifecycle_in(state).replying} == {State.STREAMING, State.INPUT_ENDED}


def test_a_refused_start_or_handshake_ends_no_input() -> None:
    lifecycle = lifecycle_in(State.AWAITING_START)
    assert not lifecycle.handle(Trigger.REFUSE).ends_input
    assert not lifecycle.handle(Trigger.PEER_CLOSED).ends_input
    rejected = Lifecycle()
    transition = rejected.handle(Trigger.REJECT)
    assert rejected.state is State.CLOSED and not transition.ends_input
