"""Deciding on a new INVITE (one without a To tag): every check a call must pass before it
exists, in the order a peer can act on, and the ``Call`` record it creates.

Order: draining (503), ``Require`` options (420), the source's INVITE rate (503,
``Retry-After: 1``), digest auth (401), the body (400/415/488), session interval (422), the
route (404 or the route's code), a recordable stream (488), room for its legs (503).
An INVITE without SDP (delayed offer) gets one provisional stream: our offer goes in the 200.
A SIPREC INVITE without SDP is refused 488: we could not know which stream is whose.
A refusal is a ``Reject``; the UAS core answers it and owns the transaction and dialog.
"""

from __future__ import annotations

import secrets
import uuid
from collections import Counter
from collections.abc import Hashable

from calls.admit import Refused, require_room, route_call
from calls.call import CallInfo
from calls.routing import CallFacts, Router
from sip import call_metadata, cucm, session_timer
from sip.admission import Admission
from sip.auth import DigestAuth
from sip.call_media import no_stream, read_body, select_streams
from sip.config import SipSettings
from sip.dialog import Call
from sip.errors import SipParseError
from sip.header_values import NameAddr, SipUri, parse_cseq
from sip.message import Address, Request
from sip.responses import SUPPORTED_OPTIONS, Reject, warning
from sip.sdp import offered_plan, plan_streams
from sip.siprec import is_siprec

NO_SIPREC_OFFER = warning(
    "a SIPREC INVITE needs an SDP offer with a=label per stream; delayed offer is not supported for recordings", 304
)


class InviteGate:
    """Admits or refuses new INVITEs; shares the UAS's ``counters``."""

    def __init__(
        self,
        settings: SipSettings,
        admission: Admission,
        auth: DigestAuth | None,
        router: Router,
        counters: Counter[str],
    ) -> None:
        self.settings = settings
        self.admission = admission
        self.auth = auth
        self.router = router
        self.counters = counters

    def admit(
        self, request: Request, peer: Address, origin: str, tx_key: Hashable, active_calls: int, now: float
    ) -> Call:
        """The new call (ringing, legs not yet open) for ``request`` from ``peer``, or ``Reject``.

        ``origin`` is the caller's address (``Admission.origin``: ``peer``'s, or the one a trusted
        proxy states); the INVITE rate and the routing rules look at it."""
        if self.admission.draining:
            raise Reject(503, self.admission.retry_after())
        unsupported = [o for o in request.headers.get_all("Require") if o.lower() not in SUPPORTED_OPTIONS]
        if unsupported:
            raise Reject(420, (("Unsupported", ", ".join(unsupported)),))
        if not self.admission.rate_ok(origin, now):
            self.counters["invites.rate_limited"] += 1
            raise Reject(503, (("Retry-After", "1"),))
        if self.auth is not None and not self.auth.authorized(request, now):
            self.counters["invites.challenged"] += 1
            raise Reject(401, (("WWW-Authenticate", self.auth.challenge(now)),))
        body = read_body(request)
        siprec = is_siprec(request)
        if body.offer is None and siprec:
            raise Reject(488, (NO_SIPREC_OFFER,))
        session_expires = session_timer.session_interval(request, self.settings.min_se_s)
        to = NameAddr.parse(request.headers.get("To") or "")
        from_party = NameAddr.parse(request.headers.get("From") or "")
        try:
            routed = route_call(self.router, _facts(request, origin, from_party, to, siprec), "this INVITE")
        except Refused as refused:
            raise Reject(refused.status) from None
        profile = routed.profile
        if body.offer is not None:
            plans = plan_streams(body.offer, sendonly_is_hold=not siprec, srtp=profile.srtp)
        else:
            self.counters["invites.offerless"] += 1
            plans = [offered_plan(0, None, profile.srtp)]
        plain = None if siprec else cucm.plain_call(request, from_party.uri, profile.role, profile.join_by)
        streams = select_streams(plans, profile, body.metadata, siprec, from_party, plain.role if plain else "mixed")
        if not streams:
            raise no_stream(body.offer, profile)
        self._require_room(active_calls, len(streams))
        contact = request.headers.get_all("Contact")
        info = CallInfo(
            call_id=uuid.uuid4().hex,
            source="sip",
            source_call_id=request.headers.get("Call-ID") or "",
            from_aor=from_party.uri,
            from_name=from_party.display,
            to_aor=to.uri,
            to_name=to.display,
            peer=(peer.host, peer.port, peer.transport),
            route=routed.route,
            profile=profile,
            siprec=siprec,
            metadata=call_metadata.extract(request, from_party, to, profile.metadata_headers, body.metadata),
            join_key=plain.join_key if plain else None,
        )
        call = Call(
            info=info,
            sip_call_id=info.source_call_id,
            local_tag=secrets.token_hex(6),
            remote_tag=from_party.tag,
            local_party=to,
            remote_party=from_party,
            remote_target=NameAddr.parse(contact[0]).uri if contact else from_party.uri,
            route_set=request.headers.get_all("Record-Route"),
            source=peer,
            remote_cseq=parse_cseq(request.headers.get("CSeq"))[0],
            request=request,
            invite_tx=tx_key,
            metadata=body.metadata,
            sdp_session_id=secrets.randbelow(2**31),
            session_expires=session_expires,
        )
        call.local_party = to.with_params(tag=call.local_tag)
        call.offer = body.offer
        call.pending_streams = streams
        return call

    def _require_room(self, active_calls: int, legs: int) -> None:
        """Room for a call of ``legs`` legs beside ``active_calls`` SIP calls: SIP's ``max_calls``,
        then the node's (``calls.admit.require_room``); else 503 with Retry-After, counted."""
        try:
            if active_calls >= self.settings.max_calls:
                raise Refused("busy", f"all {self.settings.max_calls} SIP calls are in progress", 503)
            require_room(self.admission.handler, legs)
        except Refused as refused:
            self.counters["invites.no_capacity"] += 1
            raise Reject(refused.status, self.admission.retry_after()) from None


def _facts(request: Request, source_ip: str, from_party: NameAddr, to: NameAddr, siprec: bool) -> CallFacts:
    """What routing rules match on: source IP, called and calling user, X- headers, SIPREC."""

    def user(uri: str) -> str:
        try:
            return SipUri.parse(uri).user or ""
        except SipParseError:
            return ""

    headers = {name: value for name, value in request.headers if name.lower().startswith("x-")}
    return CallFacts(source_ip, user(to.uri), user(from_party.uri), headers, siprec)
