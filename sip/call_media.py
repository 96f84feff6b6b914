"""A call's media as the UAS negotiates it: the offer in the body, which streams are recorded
(roles from SIPREC metadata and the route's profile), the RTP legs they open and our SDP answer,
or, for an offerless INVITE or re-INVITE, our SDP offer and the answer the ACK brings.

No sockets: opening a leg means an allocated port and a sink from the application, returned
as ``StartMedia`` actions for the transport. A call's ports are allocated first, then its legs
are opened through ``calls.admit.open_legs`` (all or none, as every door does). A full node (no
port, no room, draining) is a 503; anything else the application raises is its bug: logged
with its traceback, a 500. Either way every port and leg of the attempt is undone.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, replace
from typing import Protocol

from calls.admit import Refused, open_legs, transcribed
from calls.call import LegInfo
from calls.handler import CallHandler
from calls.metadata import clean_value
from calls.profile import Profile
from calls.roles import Role, assign_roles
from sip import cucm
from sip.actions import Action, LegUpdated, StartMedia, StopMedia, UpdateMedia
from sip.admission import CAPACITY_ERRORS
from sip.dialog import Call, Leg
from sip.errors import ProtocolError, SipParseError
from sip.header_values import NameAddr
from sip.message import Request
from sip.responses import HeaderPairs, Reject, warning
from sip.sdp import (
    TAKEN_CODECS,
    MediaDescription,
    SessionDescription,
    StreamPlan,
    build_answer,
    build_offer,
    offers_plain,
    offers_srtp,
    plan_answer,
    plan_streams,
)
from sip.siprec import RecordingMetadata, split_body

log = logging.getLogger(__name__)

NO_AUDIO = warning(f"no {TAKEN_CODECS} audio stream to record", 304)


def no_stream(offer: SessionDescription | None, profile: Profile) -> Reject:
    """The 488 for an offer with nothing we record: an offer the route's SRTP policy refuses
    says so (Warning 302, incompatible transport protocol) instead of the codec warning."""
    if offer is not None and profile.srtp == "off" and offers_srtp(offer) and not offers_plain(offer):
        text = "SRTP (RTP/SAVP) is not taken on this route (srtp: off); offer plain RTP/AVP"
        return Reject(488, (warning(text, 302),))
    if offer is not None and profile.srtp == "required" and not offers_srtp(offer):
        text = "plain RTP/AVP is not taken on this route (srtp: required); offer RTP/SAVP with SDES a=crypto keys"
        return Reject(488, (warning(text, 302),))
    if offer is not None and offers_srtp(offer) and not offers_plain(offer):
        text = "only SDES-keyed RTP/SAVP(F) is taken (a=crypto, RFC 4568), not DTLS-SRTP"
        return Reject(488, (warning(text, 302),))
    return Reject(488, (NO_AUDIO,))


Streams = list[tuple[StreamPlan, Role, str | None]]
"""Accepted streams with the role each is transcribed as and the AOR of the party sending it."""


class PortSource(Protocol):
    """Where RTP ports come from (``rtp.ports.PortAllocator``); ``allocate`` raises
    ``rtp.ports.PortsExhausted`` when none is free."""

    def allocate(self) -> int: ...

    def release(self, port: int) -> None: ...


@dataclass(frozen=True)
class Body:
    """A request's body, parsed: the SDP offer and the SIPREC metadata, each None when absent."""

    offer: SessionDescription | None
    metadata: RecordingMetadata | None


def read_body(request: Request) -> Body:
    """Parse the body of an INVITE or UPDATE; a body we cannot read is the peer's error (400).

    The parsers raise ``SipParseError`` for what they recognise; any other ``ValueError`` or
    ``LookupError`` (an unknown XML encoding, say) from a peer's bytes is turned into one too.
    """
    try:
        sdp, metadata = split_body(request.headers.get("Content-Type"), request.body)
        return Body(
            SessionDescription.parse(sdp) if sdp is not None else None,
            RecordingMetadata.parse(metadata) if metadata else None,
        )
    except ProtocolError:
        raise
    except (ValueError, LookupError) as exc:
        raise SipParseError(f"unreadable body: {exc}", 400) from exc


def select_streams(
    plans: list[StreamPlan],
    profile: Profile,
    metadata: RecordingMetadata | None,
    siprec: bool,
    from_party: NameAddr,
    plain_role: Role = "mixed",
) -> Streams:
    """Each acceptable stream with its role and participant AOR, keeping only roles the profile transcribes."""
    aors: list[str | None] = []
    for plan in plans:
        if not siprec:
            aors.append(from_party.uri)
            continue
        participant = metadata.participant_for_label(plan.label) if metadata and plan.label else None
        aors.append(participant.aor if participant else None)
    if siprec:
        roles = assign_roles(profile.roles.to_rule(), aors)
    else:
        roles = [plain_role] * len(plans)
    return [(plans[index], role, aors[index]) for index, role in transcribed(roles, profile)]


def plain_role(call: Call) -> Role:
    """The role of a plain call's streams, read again off its first INVITE (re-offers keep it)."""
    if call.info.siprec:
        return "mixed"
    profile = call.info.profile
    return cucm.plain_call(call.request, call.remote_party.uri, profile.role, profile.join_by).role


def party_name(call: Call, aor: str | None) -> str | None:
    """Display name of the party sending from ``aor``: the SIPREC participant's name, or for a
    plain call the From display name."""
    if aor is None:
        return None
    if call.info.siprec:
        participants = call.metadata.participants if call.metadata is not None else []
        names = [clean_value(p.name) for p in participants if p.aor == aor and p.name]
        return next((name for name in names if name), None)
    return call.info.metadata.from_name if aor == call.info.from_aor else None


class CallMedia:
    """Opens, changes and answers the legs of calls; shares the UAS's ``counters``."""

    def __init__(
        self, handler: CallHandler, ports: PortSource, counters: Counter[str], retry_after: HeaderPairs
    ) -> None:
        self.handler = handler
        self.ports = ports
        self.counters = counters
        self.retry_after = retry_after

    def open_legs(self, call: Call, streams: Streams) -> list[Action]:
        """Allocate a port per stream, then open the streams' legs (``calls.admit.open_legs``:
        all or none); undo every port and leg of the attempt on failure.

        Raises ``Reject(503)`` with Retry-After when the node is full (no port, no room, or
        draining), ``Reject(500)`` when the application failed.
        """
        new: list[Leg] = []
        try:
            for plan, role, aor in streams:
                info = LegInfo(
                    f"{call.info.call_id}-{plan.index}", plan.label, role, aor, plan.codec, party_name(call, aor)
                )
                new.append(Leg(info, plan, self.ports.allocate()))
                call.legs[plan.index] = new[-1]
            call.info = call.info.with_legs(call.leg_infos())
            sinks = open_legs(self.handler, call.info, [leg.info for leg in new])
        except Exception as exc:
            full = isinstance(exc, (Refused, *CAPACITY_ERRORS))
            if full:
                self.counters["invites.no_capacity"] += 1
            else:
                self.counters["errors.internal"] += 1
                log.exception("opening a leg of call %s failed; answering 500", call.info.call_id)
            self._undo(call, streams)
            raise Reject(503, self.retry_after) if full else Reject(500) from exc
        return [
            StartMedia(
                call.info,
                leg.info,
                leg.port,
                dict(leg.plan.payload_types),
                leg.plan.on_hold,
                sink,
                leg.plan.remote,
                leg.plan.srtp.keys if leg.plan.srtp else None,
            )
            for leg, sink in zip(new, sinks, strict=True)
        ]

    def _undo(self, call: Call, streams: Streams) -> None:
        """Release the ports of ``streams``' legs and take the legs off ``call`` (the handler was
        told by ``calls.admit.open_legs``)."""
        for plan, _, _ in streams:
            leg = call.legs.pop(plan.index, None)
            if leg is not None:
                self.ports.release(leg.port)
        call.info = call.info.with_legs(call.leg_infos())

    def apply_streams(self, call: Call, streams: Streams) -> list[Action]:
        """A new offer on an existing call: stop dropped streams, update changed ones, open new ones."""
        actions: list[Action] = []
        wanted = {plan.index for plan, _, _ in streams}
        for index in [i for i in call.legs if i not in wanted]:
            leg = call.legs.pop(index)
            actions.append(StopMedia(call.info.call_id, leg.info.leg_id, leg.port))
        new_streams: Streams = []
        for plan, role, aor in streams:
            existing = call.legs.get(plan.index)
            if existing is None:
                new_streams.append((plan, role, aor))
                continue
            leg = existing
            info = LegInfo(leg.info.leg_id, plan.label, role, aor, plan.codec, party_name(call, aor))
            changed_media = (
                plan.payload_types != leg.plan.payload_types
                or plan.on_hold != leg.plan.on_hold
                or plan.remote != leg.plan.remote
                or plan.srtp != leg.plan.srtp
            )
            leg.plan = plan
            if info != leg.info:
                leg.info = info
                call.info = call.info.with_legs(call.leg_infos())
                actions.append(LegUpdated(call.info, info))
            if changed_media:
                keys = plan.srtp.keys if plan.srtp else None
                actions.append(
                    UpdateMedia(call.info.call_id, info, dict(plan.payload_types), plan.on_hold, plan.remote, keys)
                )
        call.info = call.info.with_legs(call.leg_infos())
        if new_streams:
            actions += self.open_legs(call, new_streams)
        return actions

    def apply_metadata(self, call: Call) -> list[Action]:
        """A metadata-only update: re-map participants (and so roles) onto the current legs."""
        plans = [leg.plan for leg in call.legs.values()]
        streams = select_streams(
            plans, call.info.profile, call.metadata, call.info.siprec, call.remote_party, plain_role(call)
        )
        return self.apply_streams(call, [s for s in streams if s[0].index in call.legs])

    def renegotiate(self, call: Call, body: Body, host: str) -> list[Action]:
        """A re-INVITE's or UPDATE's body on an answered call: a new offer changes the legs and
        our answer (488 when nothing is left to record); metadata alone re-maps the roles."""
        if body.offer is None:
            return self.apply_metadata(call) if body.metadata is not None else []
        plans = plan_streams(body.offer, sendonly_is_hold=not call.info.siprec, srtp=call.info.profile.srtp)
        streams = select_streams(
            plans, call.info.profile, call.metadata, call.info.siprec, call.remote_party, plain_role(call)
        )
        if not streams:
            raise no_stream(body.offer, call.info.profile)
        call.offer = body.offer
        actions = self.apply_streams(call, streams)
        call.answer_sdp = self.answer_sdp(call, host)
        return actions

    @staticmethod
    def answer_sdp(call: Call, host: str) -> bytes:
        """Our SDP answer to the call's current offer (a new version each time), media at ``host``."""
        assert call.offer is not None
        plans = [leg.plan for leg in call.legs.values()]
        ports = {index: leg.port for index, leg in call.legs.items()}
        call.sdp_version += 1
        return build_answer(call.offer, plans, ports, host, call.sdp_session_id, call.sdp_version)

    @staticmethod
    def offer_sdp(call: Call, host: str) -> bytes:
        """Our SDP offer for an offerless INVITE or re-INVITE (a new version each time): the
        session's m-lines so far (one audio line for a new call), our legs ``recvonly``."""
        layout = call.offer.media if call.offer is not None else [MediaDescription("audio", 0, "RTP/AVP", ["0"])]
        plans = [leg.plan for leg in call.legs.values()]
        ports = {index: leg.port for index, leg in call.legs.items()}
        call.sdp_version += 1
        srtp = call.info.profile.srtp
        return build_offer(layout, plans, ports, host, call.sdp_session_id, call.sdp_version, srtp)

    def take_answer(self, call: Call, body: Body) -> list[Action]:
        """The ACK's answer to our offer: the legs take its codecs, direction and address.

        Raises ``Reject(488)`` naming what was wrong when there is no answer, its m-lines do not
        match our offer's (RFC 3264 6), or it accepts no stream we can record; the legs are
        then left as they were and the caller ends the call.
        """
        answer = body.offer
        if answer is None:
            raise Reject(488, (warning("the ACK carried no SDP answer to our offer in the 200", 304),))
        offered = len(call.offer.media) if call.offer is not None else 1
        if len(answer.media) != offered:
            text = f"the SDP answer has {len(answer.media)} m-lines, our offer had {offered}"
            raise Reject(488, (warning(text, 304),))
        plans = [
            replace(plan, label=plan.label or call.legs[plan.index].plan.label)
            for plan in plan_answer(answer, call.info.profile.srtp)
            if plan.index in call.legs
        ]
        streams = select_streams(
            plans, call.info.profile, call.metadata, call.info.siprec, call.remote_party, plain_role(call)
        )
        if not streams:
            raise Reject(488, (warning(f"the SDP answer accepts no {TAKEN_CODECS} stream we offered", 304),))
        call.offer = answer
        call.awaiting_answer = False
        return self.apply_streams(call, streams)
