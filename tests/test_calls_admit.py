"""The admission sequence every door runs (``calls/admit.py``): a route or the routes file's
refusal, the transcribed roles, room, and legs opened all or none, with the undo a failure needs.
The doors' own use of it: tests/test_audiosocket_door.py, tests/test_sip_uas.py."""

from __future__ import annotations

import pytest

from asr_common.audio import CountingPcmSink
from calls.admit import Refused, Routed, open_legs, require_room, route_call, transcribed
from calls.call import CallInfo, LegInfo
from calls.handler import CountingCallHandler
from calls.metadata import CallMetadata
from calls.profile import Profile
from calls.registry import CallRegistry
from calls.roles import Role
from calls.routing import CallFacts, Router, RoutesFile

FACTS = CallFacts("10.0.0.7", "4000", "alice", {}, siprec=False)


class BrokenLegHandler(CountingCallHandler):
    """Opens legs like ``CountingCallHandler`` but fails, as a bug would, on the leg ``broken``."""

    def __init__(self, broken: str) -> None:
        super().__init__()
        self.broken = broken

    def open_leg(self, call: CallInfo, leg: LegInfo) -> CountingPcmSink:
        if leg.leg_id == self.broken:
            raise KeyError(f"no such queue for {leg.leg_id}")
        return super().open_leg(call, leg)


def two_leg_call(call_id: str = "c1") -> CallInfo:
    roles: tuple[Role, ...] = ("caller", "agent")
    legs = tuple(LegInfo(f"{call_id}-{i}", str(i), role, None, "slin") for i, role in enumerate(roles))
    return CallInfo.unaddressed(
        call_id, "websocket", call_id, ("127.0.0.1", 5000, "ws"), None, Profile(), legs, CallMetadata()
    )


def test_route_call_gives_the_route_or_refuses_with_the_routes_files_code() -> None:
    routed = route_call(Router(), FACTS)
    assert isinstance(routed, Routed) and routed.route is None and routed.profile.name == "default"
    closed = Router(RoutesFile(default_profile=None, reject_code=403))
    with pytest.raises(Refused) as info:
        route_call(closed, FACTS, "AudioSocket stream 0a0a")
    assert (info.value.reason, info.value.status) == ("no_route", 403)
    assert info.value.message == "no route takes AudioSocket stream 0a0a (code 403)"


def test_transcribed_keeps_the_indexes_of_the_roles_the_profile_transcribes() -> None:
    agent_only = Profile(transcribe=["agent"])
    assert transcribed(["caller", "agent", "mixed"], agent_only) == [(1, "agent")]
    assert transcribed(["caller"], agent_only) == []
    assert transcribed(["caller", "agent"], Profile()) == [(0, "caller"), (1, "agent")]


def test_require_room_refuses_a_call_the_node_has_no_room_for() -> None:
    handler = CountingCallHandler(capacity=1)
    require_room(handler, 1)
    with pytest.raises(Refused) as info:
        require_room(handler, 2)
    assert (info.value.reason, info.value.status) == ("busy", 503)


def test_all_legs_open_in_order() -> None:
    handler = CountingCallHandler()
    call = two_leg_call()
    sinks = open_legs(handler, call)
    assert sinks == [handler.sinks["c1-0"], handler.sinks["c1-1"]] and handler.open_legs == 2
    assert handler.ended == {}


def test_a_second_leg_without_room_ends_the_call_and_finishes_the_first_sink() -> None:
    handler = CountingCallHandler(capacity=1)
    with pytest.raises(Refused) as info:
        open_legs(handler, two_leg_call())
    assert (info.value.reason, info.value.status) == ("busy", 503)
    assert handler.sinks["c1-0"].finished == 1 and handler.open_legs == 0
    assert handler.ended == {"c1": "capacity"}
    assert [leg.leg_id for leg in handler.calls["c1"].legs] == ["c1-0"]  # the call as the handler knew it


def test_a_first_leg_without_room_leaves_nothing_to_undo() -> None:
    handler = CountingCallHandler(capacity=0)
    with pytest.raises(Refused):
        open_legs(handler, two_leg_call())
    assert handler.ended == {} and handler.sinks == {}


def test_a_draining_node_refuses_as_draining() -> None:
    counting = CountingCallHandler()
    registry = CallRegistry(counting, max_calls=10)
    registry.set_draining()
    with pytest.raises(Refused) as info:
        open_legs(registry, two_leg_call())
    assert (info.value.reason, info.value.status) == ("draining", 503)
    assert counting.sinks == {} and registry.active == 0


def test_an_application_error_propagates_after_the_undo() -> None:
    handler = BrokenLegHandler(broken="c1-1")
    with pytest.raises(KeyError, match="no such queue"):
        open_legs(handler, two_leg_call())
    assert handler.sinks["c1-0"].finished == 1 and handler.open_legs == 0
    assert handler.ended == {"c1": "error"}


def test_a_re_offer_opens_only_its_new_legs_and_its_undo_ends_the_call_the_handler_knew() -> None:
    handler = CountingCallHandler()
    call = two_leg_call()
    first, second = call.legs
    open_legs(handler, call.with_legs((first,)))
    third = LegInfo("c1-2", "2", "mixed", None, "slin")
    grown = call.with_legs((first, second, third))
    handler.capacity = 2
    with pytest.raises(Refused):
        open_legs(handler, grown, [second, third])
    assert handler.sinks["c1-1"].finished == 1 and handler.sinks["c1-0"].finished == 0
    assert handler.ended == {"c1": "capacity"} and handler.open_legs == 0
    assert [leg.leg_id for leg in handler.calls["c1"].legs] == ["c1-0", "c1-1"]
