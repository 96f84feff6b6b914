"""The admission sequence every front door runs for a new call, in one place.

route (``Router.decide``) → the legs the route transcribes → room for them (``has_capacity``)
→ the door builds its ``CallInfo`` → every leg opened (``open_leg``), all or none.

A door keeps only its protocol: what it reads off the wire (``CallFacts``, its legs' labels and
codecs, its own ids) and how it says no (SIP's status code, AudioSocket's error frame, the
WebSocket close code). Each step here raises ``Refused`` with a door-neutral ``reason`` (the
label doors count refusals by) and the SIP status a SIP door answers with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asr_common.audio import PcmSink
from asr_common.errors import CapacityError
from calls.call import CallInfo, LegInfo
from calls.handler import CallHandler
from calls.profile import Profile
from calls.registry import NodeDraining
from calls.roles import Role
from calls.routing import CallFacts, Router


class Refused(Exception):
    """The call is not taken. ``reason``: ``no_route``, ``busy`` or ``draining`` (a door counts
    its refusals by it); ``message``: what the caller can do, as text; ``status``: the SIP
    response code that says it (404 or the routes file's ``reject_code``; 503)."""

    def __init__(self, reason: str, message: str, status: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Routed:
    """The route a call takes (None: the default profile) and its profile."""

    route: str | None
    profile: Profile


def route_call(router: Router, facts: CallFacts, what: str = "this call") -> Routed:
    """The route for ``facts``; ``Refused("no_route")`` with the routes file's code when none takes it."""
    decision = router.decide(facts)
    if decision.profile is None:
        code = decision.reject_code or 404
        raise Refused("no_route", f"no route takes {what} (code {code})", code)
    return Routed(decision.route, decision.profile)


def transcribed(roles: Sequence[Role], profile: Profile) -> list[tuple[int, Role]]:
    """(index, role) of the streams the route transcribes, of a call whose streams have ``roles``."""
    return [(index, role) for index, role in enumerate(roles) if role in profile.transcribe]


def require_room(handler: CallHandler, legs: int) -> None:
    """``Refused("busy")`` unless the node has room for a call of ``legs`` legs."""
    if not handler.has_capacity(legs):
        raise Refused("busy", "no room for another call; try another node", 503)


def open_legs(handler: CallHandler, call: CallInfo, legs: Sequence[LegInfo] | None = None) -> list[PcmSink]:
    """Open ``legs`` of ``call`` (by default all of ``call.legs``; a re-offer opens only its new
    ones), one sink each in that order, or none of them.

    When a leg cannot be opened, the sinks opened before it are finished and the call is ended
    with the handler (as the legs it was told of: ``call``'s others and those just opened), so
    nothing of it stays open; the end reason is ``capacity`` for a full node, ``error`` for
    anything else. A full node raises ``Refused`` (``busy``, or ``draining``); any other error
    propagates after that undo (a bug, not a busy node)."""
    opening = call.legs if legs is None else tuple(legs)
    sinks: list[PcmSink] = []
    try:
        for leg in opening:
            sinks.append(handler.open_leg(call, leg))
    except BaseException as exc:
        full = isinstance(exc, CapacityError)
        if sinks:
            for sink in sinks:
                sink.input_finished()
            failed = opening[len(sinks) :]
            told = tuple(leg for leg in call.legs if leg not in failed)
            handler.call_ended(call.with_legs(told), "capacity" if full else "error")
        if isinstance(exc, NodeDraining):
            raise Refused("draining", f"{exc}", 503) from None
        if full:
            raise Refused("busy", f"no room for another call ({exc}); try another node", 503) from None
        raise
    return sinks
