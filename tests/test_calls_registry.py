"""``calls.registry.CallRegistry``: the node's calls counted by door, from the first opened leg to
``call_ended``; the node's call limit and draining refuse new calls, never a new leg of a call
already held, and everything is passed on to the application."""

from __future__ import annotations

import pytest

from calls.admit import Refused, open_legs
from calls.call import CallInfo, CallSource, LegInfo
from calls.handler import CountingCallHandler, LegsExhausted
from calls.metadata import CallMetadata
from calls.profile import Profile
from calls.registry import SOURCES, CallRegistry, CallsExhausted, NodeDraining


def call(call_id: str, source: CallSource = "sip", legs: int = 1) -> CallInfo:
    """A call of ``legs`` legs from door ``source``."""
    info = tuple(LegInfo(f"{call_id}-{i}", None, "mixed", None, "L16") for i in range(legs))
    return CallInfo.unaddressed(
        call_id, source, call_id, ("127.0.0.1", 1, "tcp"), None, Profile(), info, CallMetadata()
    )


def test_calls_are_counted_by_door_from_the_first_leg_until_they_end() -> None:
    app = CountingCallHandler()
    registry = CallRegistry(app, max_calls=10)
    assert registry.active == 0 and registry.by_source() == dict.fromkeys(SOURCES, 0)
    calls = [call("s", "sip", legs=2), call("a", "audiosocket"), call("w", "websocket"), call("f", "audio_fork")]
    for info in calls:
        for leg in info.legs:
            registry.open_leg(info, leg)
    assert registry.active == 4, "a call of two legs is one call"
    assert registry.by_source() == {"sip": 1, "audiosocket": 1, "websocket": 1, "audio_fork": 1}
    assert app.open_legs == 5, "every leg reached the application"
    registry.call_ended(calls[1], "hangup")
    assert registry.by_source() == {"sip": 1, "audiosocket": 0, "websocket": 1, "audio_fork": 1}
    assert app.ended == {"a": "hangup"}
    for info in calls:
        registry.call_ended(info, "hangup")  # an end told twice is counted once
    assert registry.active == 0


def test_the_node_limit_counts_every_door_and_refuses_only_new_calls() -> None:
    app = CountingCallHandler()
    registry = CallRegistry(app, max_calls=2)
    first, second = call("one", "websocket", legs=2), call("two", "audiosocket")
    registry.open_leg(first, first.legs[0])
    registry.open_leg(second, second.legs[0])
    assert not registry.has_capacity(1)
    with pytest.raises(CallsExhausted):
        registry.open_leg(call("three", "sip"), call("three", "sip").legs[0])
    registry.open_leg(first, first.legs[1])  # a new leg of a call held is no new call
    assert registry.active == 2 and app.open_legs == 3
    registry.call_ended(second, "hangup")
    assert registry.has_capacity(1)


def test_draining_refuses_new_calls_and_keeps_those_in_progress() -> None:
    registry = CallRegistry(CountingCallHandler(), max_calls=10)
    held = call("held", "sip", legs=2)
    registry.open_leg(held, held.legs[0])
    registry.set_draining()
    assert registry.draining and not registry.has_capacity(1)
    with pytest.raises(NodeDraining):
        registry.open_leg(call("new", "websocket"), call("new", "websocket").legs[0])
    registry.open_leg(held, held.legs[1])
    assert registry.active == 1
    with pytest.raises(Refused) as refused:
        open_legs(registry, call("new", "audiosocket"))
    assert refused.value.reason == "draining" and refused.value.status == 503


def test_a_call_whose_first_leg_the_application_refuses_is_not_counted() -> None:
    app = CountingCallHandler(capacity=1)
    registry = CallRegistry(app, max_calls=10)
    taken = call("taken")
    registry.open_leg(taken, taken.legs[0])
    with pytest.raises(LegsExhausted):
        registry.open_leg(call("refused"), call("refused").legs[0])
    assert registry.active == 1 and registry.by_source()["sip"] == 1
    assert not registry.has_capacity(1), "the application's own room is asked too"


def test_a_call_refused_half_open_ends_and_is_not_counted() -> None:
    """``calls.admit.open_legs``: the second leg finds no room, the first is closed and the call ends."""
    app = CountingCallHandler(capacity=1)
    registry = CallRegistry(app, max_calls=10)
    with pytest.raises(Refused) as refused:
        open_legs(registry, call("pair", "websocket", legs=2))
    assert refused.value.reason == "busy"
    assert registry.active == 0 and app.ended == {"pair": "capacity"} and app.open_legs == 0
