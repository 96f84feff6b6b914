"""The UAS core: (message, source, now) in, actions out. No sockets, no asyncio, no clock.

The transport feeds every datagram or framed stream message to ``receive`` and calls
``on_timer`` when ``next_deadline`` has passed; it performs the returned actions in order:
``SendMessage`` (serialize and send), ``StartMedia``/``UpdateMedia``/``StopMedia`` (the RTP
legs) and ``CallEnded`` (tell the application, after the legs are closed). The core calls the
``CallHandler`` synchronously only for the two questions it must answer before replying:
``has_capacity`` and ``open_leg``. Nothing a peer sends escapes ``receive`` as an exception:
protocol errors become error responses (or drops) and are counted in ``counters``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from sip.app import CallHandler, CallInfo, CapacityError, LegInfo, PcmSink
from sip.config import SipSettings
from sip.dialog import Call, CallEvent, CallState, Leg
from sip.errors import ProtocolError, SipParseError
from sip.message import (
    BRANCH_MAGIC,
    Address,
    Headers,
    Message,
    NameAddr,
    Request,
    Response,
    SipUri,
    Via,
    parse,
    parse_cseq,
    parse_params,
    split_list,
    unquote,
)
from sip.routing import CallFacts, Profile, Router
from sip.sdp import SessionDescription, StreamPlan, build_answer, plan_streams
from sip.siprec import RecordingMetadata, Role, assign_roles, is_siprec, split_body
from sip.transaction import ClientTransaction, ServerTransaction, TimerConfig, TimerQueue, TxState

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, UPDATE, INFO"
ACCEPT = "application/sdp, multipart/mixed, application/rs-metadata+xml"
SUPPORTED = "timer, siprec"
_SUPPORTED_OPTIONS = frozenset({"timer", "siprec"})
_KNOWN_METHODS = frozenset({"REGISTER", "SUBSCRIBE", "NOTIFY", "PUBLISH", "MESSAGE", "REFER", "PRACK"})
_NONCE_LIFETIME_S = 300.0
_MAX_BUCKETS = 4096
REASONS = {
    100: "Trying",
    180: "Ringing",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    420: "Bad Extension",
    422: "Session Interval Too Small",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    491: "Request Pending",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    513: "Message Too Large",
}


class PortSource(Protocol):
    """Where RTP ports come from (``rtp.ports.PortAllocator``); ``allocate`` raises when exhausted."""

    def allocate(self) -> int: ...

    def release(self, port: int) -> None: ...


@dataclass(frozen=True)
class SendMessage:
    message: Message
    dest: Address


@dataclass(frozen=True)
class StartMedia:
    """Open an RTP leg on ``port`` feeding ``sink``; when it ends, call ``UasCore.media_ended``.

    ``remote`` is the peer's RTP (address, port) from its SDP offer, None when it gave none.
    """

    call: CallInfo
    leg: LegInfo
    port: int
    payload_types: dict[int, str]
    on_hold: bool
    sink: PcmSink
    remote: tuple[str, int] | None = None


@dataclass(frozen=True)
class UpdateMedia:
    call_id: str
    leg: LegInfo
    payload_types: dict[int, str]
    on_hold: bool
    remote: tuple[str, int] | None = None


@dataclass(frozen=True)
class StopMedia:
    """Close the leg; its port goes back to the allocator once the leg is closed."""

    call_id: str
    leg_id: str
    port: int


@dataclass(frozen=True)
class LegUpdated:
    call: CallInfo
    leg: LegInfo


@dataclass(frozen=True)
class CallEnded:
    call: CallInfo
    reason: str


Action = SendMessage | StartMedia | UpdateMedia | StopMedia | LegUpdated | CallEnded


class _Reject(Exception):
    """Answer the request with ``status`` (and extra headers) and stop handling it."""

    def __init__(self, status: int, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(status)
        self.status = status
        self.headers = headers


class UasCore:
    def __init__(
        self, settings: SipSettings, handler: CallHandler, ports: PortSource, router: Router | None = None
    ) -> None:
        self.settings = settings
        self.handler = handler
        self.ports = ports
        self.router = router or Router()
        self.timers = TimerConfig(settings.t1_ms / 1000, settings.t2_ms / 1000)
        self.local_ports = {"udp": settings.port, "tcp": settings.port, "tls": settings.tls_port}
        self.draining = False
        self.counters: Counter[str] = Counter()
        self.max_transactions = settings.max_calls * 8 + 256
        self._calls: dict[str, Call] = {}
        self._dialogs: dict[tuple[str, str], str] = {}
        self._server_tx: dict[tuple[str, str, str], ServerTransaction] = {}
        self._client_tx: dict[str, ClientTransaction] = {}
        self._queue = TimerQueue()
        self._buckets: dict[str, tuple[float, float]] = {}
        self._secret = secrets.token_bytes(16)
        self._acl = list(settings.acl_cidrs)

    # ---- public API --------------------------------------------------------------------

    @property
    def active_calls(self) -> int:
        return len(self._calls)

    def call(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    def next_deadline(self) -> float | None:
        return self._queue.next_deadline()

    def set_draining(self) -> None:
        """From now on new INVITEs and OPTIONS get 503; calls in progress continue."""
        self.draining = True

    def receive(self, data: bytes, source: Address, now: float) -> list[Action]:
        """One datagram (or one framed stream message) from ``source``."""
        if len(data) > self.settings.max_message_bytes:
            self.counters["dropped.too_large"] += 1
            return []
        try:
            message = parse(data)
        except SipParseError:
            self.counters["dropped.unparseable"] += 1
            return []
        return self.receive_message(message, source, now)

    def receive_message(self, message: Message, source: Address, now: float) -> list[Action]:
        try:
            if isinstance(message, Response):
                return self._on_response(message, now)
            return self._on_request(message, source, now)
        except ProtocolError as exc:
            self.counters["errors.remote"] += 1
            if isinstance(message, Request) and message.method != "ACK":
                return [SendMessage(self._make_response(message, exc.status_hint), source)]
            return []

    def on_timer(self, now: float) -> list[Action]:
        """Run every timer due at ``now``: retransmissions, timeouts, delayed answers, session expiry."""
        actions: list[Action] = []
        for owner in self._queue.pop_due(now):
            kind, key = owner
            if kind == "tx":
                actions += self._server_tx_timer(key, now)
            elif kind == "ctx":
                actions += self._client_tx_timer(key, now)
            elif kind == "call":
                actions += self._call_timer(key, now)
        return actions

    def hangup(self, call_id: str, reason: str, now: float) -> list[Action]:
        """End a call from our side: BYE when answered, 480 while still ringing."""
        call = self._calls.get(call_id)
        if call is None or call.state in (CallState.ENDING, CallState.ENDED):
            return []
        if call.state is CallState.RINGING:
            call.handle(CallEvent.HANGUP)
            actions = self._final_for_invite(call, 503 if self.draining else 480, now)
            return actions + self._end_call(call, reason)
        call.handle(CallEvent.HANGUP)
        reason_header = (("Reason", f'SIP;cause=200;text="{reason}"'),)
        return self._end_call(call, reason) + self._send_request(call, "BYE", now, reason_header)

    def hangup_all(self, reason: str, now: float) -> list[Action]:
        actions: list[Action] = []
        for call_id in list(self._calls):
            actions += self.hangup(call_id, reason, now)
        return actions

    def media_ended(self, call_id: str, reason: str, now: float) -> list[Action]:
        """An RTP leg stopped on its own (``rtp-timeout``, ``rtcp-bye``, bind failure): hang up."""
        return self.hangup(call_id, reason, now)

    # ---- requests ----------------------------------------------------------------------

    def _on_request(self, request: Request, source: Address, now: float) -> list[Action]:
        via = self._validate(request)
        if not self._allowed(source.host):
            self.counters["acl.denied"] += 1
            if self.settings.acl_action == "drop" or request.method == "ACK":
                return []
            return [SendMessage(self._make_response(request, 403), source)]
        method_key = "INVITE" if request.method == "ACK" else request.method
        key = (via.branch or request.headers.get("Call-ID") or "", f"{via.host}:{via.port}", method_key)
        if request.method == "ACK":
            return self._on_ack(request, key, now)
        tx = self._server_tx.get(key)
        if tx is not None:
            cached = tx.retransmitted_request()
            self.counters["retransmissions.absorbed"] += 1
            return [SendMessage(cached, source)] if cached is not None else []
        if len(self._server_tx) >= self.max_transactions:
            self.counters["dropped.tx_table_full"] += 1
            return [SendMessage(self._make_response(request, 503, self._retry_after()), source)]
        tx = ServerTransaction.create(key, request, source.transport != "udp", self.timers)
        tx.peer = source
        self._server_tx[key] = tx
        handlers = {
            "INVITE": self._on_invite,
            "BYE": self._on_bye,
            "CANCEL": self._on_cancel,
            "OPTIONS": self._on_options,
            "UPDATE": self._on_update,
            "INFO": self._on_info,
        }
        handle = handlers.get(request.method)
        try:
            if handle is None:
                status = 405 if request.method in _KNOWN_METHODS else 501
                return self._respond(tx, request, status, now, headers=(("Allow", ALLOW),))
            return handle(tx, request, now)
        except _Reject as reject:
            return self._respond(tx, request, reject.status, now, headers=reject.headers)
        except ProtocolError as exc:
            self.counters["errors.remote"] += 1
            return self._respond(tx, request, exc.status_hint, now)

    def _validate(self, request: Request) -> Via:
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
        return via

    def _allowed(self, host: str) -> bool:
        if not self._acl:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._acl)

    def _on_options(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        headers = (("Allow", ALLOW), ("Accept", ACCEPT), ("Supported", SUPPORTED))
        if self.draining or not self._has_room(1):
            return self._respond(tx, request, 503, now, headers=headers + self._retry_after())
        return self._respond(tx, request, 200, now, headers=headers)

    def _has_room(self, legs: int) -> bool:
        return len(self._calls) < self.settings.max_calls and self.handler.has_capacity(legs)

    def _retry_after(self) -> tuple[tuple[str, str], ...]:
        return (("Retry-After", str(self.settings.retry_after_s)),)

    def _on_invite(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        to = NameAddr.parse(request.headers.get("To") or "")
        if to.tag is not None:
            return self._modify(tx, request, now)
        if self.draining:
            raise _Reject(503, self._retry_after())
        unsupported = [o for o in request.headers.get_all("Require") if o.lower() not in _SUPPORTED_OPTIONS]
        if unsupported:
            raise _Reject(420, (("Unsupported", ", ".join(unsupported)),))
        assert tx.peer is not None
        if not self._rate_ok(tx.peer.host, now):
            self.counters["invites.rate_limited"] += 1
            raise _Reject(503, (("Retry-After", "1"),))
        if self.settings.auth is not None and not self._authorized(request, now):
            self.counters["invites.challenged"] += 1
            raise _Reject(401, (("WWW-Authenticate", self._challenge(now)),))
        sdp, metadata_bytes = split_body(request.headers.get("Content-Type"), request.body)
        if sdp is None:
            raise _Reject(488, (("Warning", '399 hotline-asr "an SDP offer is required"'),))
        siprec = is_siprec(request)
        offer = SessionDescription.parse(sdp)
        metadata = RecordingMetadata.parse(metadata_bytes) if metadata_bytes else None
        session_expires = self._session_interval(request)
        from_party = NameAddr.parse(request.headers.get("From") or "")
        decision = self.router.decide(self._facts(request, tx.peer, from_party, to, siprec))
        if decision.profile is None:
            raise _Reject(decision.reject_code or 404)
        profile = decision.profile
        streams = self._streams(plan_streams(offer, sendonly_is_hold=not siprec), profile, metadata, siprec, from_party)
        if not streams:
            raise _Reject(488, (("Warning", '304 hotline-asr "no PCMU or PCMA audio stream to record"'),))
        plans = [plan for plan, _, _ in streams]
        if not self._has_room(len(plans)):
            self.counters["invites.no_capacity"] += 1
            raise _Reject(503, self._retry_after())
        call_id = uuid.uuid4().hex
        contact = request.headers.get_all("Contact")
        info = CallInfo(
            call_id=call_id,
            sip_call_id=request.headers.get("Call-ID") or "",
            from_aor=from_party.uri,
            from_name=from_party.display,
            to_aor=to.uri,
            to_name=to.display,
            source=(tx.peer.host, tx.peer.port, tx.peer.transport),
            route=decision.route,
            profile=profile,
            siprec=siprec,
        )
        call = Call(
            info=info,
            sip_call_id=info.sip_call_id,
            local_tag=secrets.token_hex(6),
            remote_tag=from_party.tag,
            local_party=to,
            remote_party=from_party,
            remote_target=NameAddr.parse(contact[0]).uri if contact else from_party.uri,
            route_set=request.headers.get_all("Record-Route"),
            source=tx.peer,
            remote_cseq=parse_cseq(request.headers.get("CSeq"))[0],
            request=request,
            invite_tx=tx.key,
            metadata=metadata,
            sdp_session_id=secrets.randbelow(2**31),
            session_expires=session_expires,
        )
        call.local_party = to.with_params(tag=call.local_tag)
        self._calls[call_id] = call
        self._dialogs[(call.sip_call_id, call.local_tag)] = call_id
        tx.owner = call_id
        self.counters["invites.accepted"] += 1
        call.offer = offer
        call.pending_streams = streams
        actions = self._respond(tx, request, 100, now)
        if self.settings.answer_delay_ms > 0:
            actions += self._respond(tx, request, 180, now, to_tag=call.local_tag, contact=True, call=call)
            call.answer_at = now + self.settings.answer_delay_ms / 1000
            self._queue.schedule(("call", call_id), call.next_deadline())
            return actions
        return actions + self._answer(call, now)

    def _streams(
        self,
        plans: list[StreamPlan],
        profile: Profile,
        metadata: RecordingMetadata | None,
        siprec: bool,
        from_party: NameAddr,
    ) -> list[tuple[StreamPlan, Role, str | None]]:
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
            roles = ["mixed"] * len(plans)
        return [
            (plan, role, aor) for plan, role, aor in zip(plans, roles, aors, strict=True) if role in profile.transcribe
        ]

    def _open_legs(self, call: Call, streams: list[tuple[StreamPlan, Role, str | None]]) -> list[Action]:
        """Allocate ports and ask the application for sinks; undo everything on failure (503)."""
        opened: list[tuple[Leg, PcmSink]] = []
        try:
            for plan, role, aor in streams:
                port = self.ports.allocate()
                info = LegInfo(f"{call.info.call_id}-{plan.index}", plan.label, role, aor, plan.codec)
                call.legs[plan.index] = Leg(info, plan, port)
                call.info = call.info.with_legs(call.leg_infos())
                opened.append((call.legs[plan.index], self.handler.open_leg(call.info, info)))
        except (CapacityError, RuntimeError) as exc:
            self.counters["invites.no_capacity"] += 1
            for plan, _, _ in streams:
                leg = call.legs.pop(plan.index, None)
                if leg is not None:
                    self.ports.release(leg.port)
            partial = call.info
            call.info = call.info.with_legs(call.leg_infos())
            if opened:
                self.handler.call_ended(partial, "capacity")
            raise _Reject(503, self._retry_after()) from exc
        return [
            StartMedia(
                call.info, leg.info, leg.port, dict(leg.plan.payload_types), leg.plan.on_hold, sink, leg.plan.remote
            )
            for leg, sink in opened
        ]

    def _answer(self, call: Call, now: float) -> list[Action]:
        tx = self._server_tx.get(call.invite_tx)  # type: ignore[call-overload]
        call.answer_at = None
        if tx is None or tx.state is not TxState.PROCEEDING:
            return []
        try:
            media = self._open_legs(call, call.pending_streams)
        except _Reject as reject:
            call.handle(CallEvent.REJECT)
            self._forget(call)
            return self._respond(tx, call.request, reject.status, now, headers=reject.headers, to_tag=call.local_tag)
        call.pending_streams = []
        call.handle(CallEvent.ANSWER)
        call.answer_sdp = self._answer_sdp(call)
        headers = self._session_timer_headers(call, call.request, now)
        return media + self._respond(
            tx, call.request, 200, now, headers=headers, body=call.answer_sdp, to_tag=call.local_tag, call=call
        )

    def _answer_sdp(self, call: Call) -> bytes:
        assert call.offer is not None
        plans = [leg.plan for leg in call.legs.values()]
        ports = {index: leg.port for index, leg in call.legs.items()}
        call.sdp_version += 1
        return build_answer(
            call.offer, plans, ports, self.settings.public_host(), call.sdp_session_id, call.sdp_version
        )

    def _session_interval(self, request: Request) -> int | None:
        """RFC 4028 for a UAS: the interval the request asks for, or 422 when below our Min-SE."""
        value = request.headers.get("Session-Expires")
        if value is None:
            return None
        number = value.split(";", 1)[0].strip()
        if not number.isascii() or not number.isdigit() or len(number) > 9:
            raise SipParseError(f"malformed Session-Expires {value[:40]!r}")
        interval = int(number)
        if interval < self.settings.min_se_s:
            raise _Reject(422, (("Min-SE", str(self.settings.min_se_s)),))
        return interval

    def _session_timer_headers(self, call: Call, request: Request, now: float) -> tuple[tuple[str, str], ...]:
        """Session-Expires for a 2xx. When the UAC refreshes we hang up if it stops; when it does
        not support session timers we are the refresher and send UPDATE every half interval."""
        call.expires_at = call.refresh_at = None
        if call.session_expires is None:
            return ()
        value = request.headers.get("Session-Expires") or ""
        refresher = parse_params(value.partition(";")[2]).get("refresher") or "uac"
        supported = any(o.lower() == "timer" for o in request.headers.get_all("Supported"))
        if not supported:
            refresher = "uas"
        interval = call.session_expires
        if refresher == "uac":
            call.expires_at = now + interval - min(32, interval / 3)
        else:
            call.refresh_at = now + interval / 2
        self._queue.schedule(("call", call.info.call_id), call.next_deadline())
        headers = [("Session-Expires", f"{interval};refresher={refresher}")]
        if supported:
            headers.append(("Require", "timer"))
        return tuple(headers)

    def _facts(self, request: Request, source: Address, from_party: NameAddr, to: NameAddr, siprec: bool) -> CallFacts:
        def user(uri: str) -> str:
            try:
                return SipUri.parse(uri).user or ""
            except SipParseError:
                return ""

        headers = {name: value for name, value in request.headers if name.lower().startswith("x-")}
        return CallFacts(source.host, user(to.uri), user(from_party.uri), headers, siprec)

    def _find_call(self, request: Request) -> Call | None:
        to = NameAddr.parse(request.headers.get("To") or "")
        call_id = self._dialogs.get((request.headers.get("Call-ID") or "", to.tag or ""))
        call = self._calls.get(call_id) if call_id else None
        if call is None:
            return None
        from_tag = NameAddr.parse(request.headers.get("From") or "").tag
        return call if from_tag == call.remote_tag else None

    def _modify(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        """re-INVITE or UPDATE: hold/resume, codec change, new streams, metadata, session refresh."""
        call = self._find_call(request)
        if call is None or call.state not in (CallState.ANSWERING, CallState.CONFIRMED):
            raise _Reject(481)
        cseq = parse_cseq(request.headers.get("CSeq"))[0]
        if cseq <= call.remote_cseq:
            raise _Reject(500, (("Warning", '399 hotline-asr "CSeq out of order"'),))
        pending = self._server_tx.get(call.invite_tx)  # type: ignore[call-overload]
        if request.method == "INVITE" and pending is not None and pending.state is TxState.ACCEPTED:
            raise _Reject(491, (("Retry-After", "1"),))
        call.remote_cseq = cseq
        sdp, metadata_bytes = split_body(request.headers.get("Content-Type"), request.body)
        if metadata_bytes:
            call.metadata = RecordingMetadata.parse(metadata_bytes)
        session_expires = self._session_interval(request)
        actions: list[Action] = []
        if sdp is not None:
            offer = SessionDescription.parse(sdp)
            streams = self._streams(
                plan_streams(offer, sendonly_is_hold=not call.info.siprec),
                call.info.profile,
                call.metadata,
                call.info.siprec,
                call.remote_party,
            )
            if not streams:
                raise _Reject(488, (("Warning", '304 hotline-asr "no PCMU or PCMA audio stream to record"'),))
            call.offer = offer
            actions += self._apply_streams(call, streams)
            call.answer_sdp = self._answer_sdp(call)
        elif metadata_bytes:
            actions += self._apply_metadata(call)
        call.handle(CallEvent.UPDATE)
        if request.method == "INVITE":
            tx.owner = call.info.call_id
            call.invite_tx = tx.key
        call.session_expires = session_expires
        headers = self._session_timer_headers(call, request, now)
        return actions + self._respond(
            tx, request, 200, now, headers=headers, body=call.answer_sdp if sdp or request.method == "INVITE" else b""
        )

    def _apply_streams(self, call: Call, streams: list[tuple[StreamPlan, Role, str | None]]) -> list[Action]:
        actions: list[Action] = []
        wanted = {plan.index for plan, _, _ in streams}
        for index in [i for i in call.legs if i not in wanted]:
            leg = call.legs.pop(index)
            actions.append(StopMedia(call.info.call_id, leg.info.leg_id, leg.port))
        new_streams: list[tuple[StreamPlan, Role, str | None]] = []
        for plan, role, aor in streams:
            existing = call.legs.get(plan.index)
            if existing is None:
                new_streams.append((plan, role, aor))
                continue
            leg = existing
            info = LegInfo(leg.info.leg_id, plan.label, role, aor, plan.codec)
            changed_media = (
                plan.payload_types != leg.plan.payload_types
                or plan.on_hold != leg.plan.on_hold
                or plan.remote != leg.plan.remote
            )
            leg.plan = plan
            if info != leg.info:
                leg.info = info
                call.info = call.info.with_legs(call.leg_infos())
                actions.append(LegUpdated(call.info, info))
            if changed_media:
                actions.append(
                    UpdateMedia(call.info.call_id, info, dict(plan.payload_types), plan.on_hold, plan.remote)
                )
        call.info = call.info.with_legs(call.leg_infos())
        if new_streams:
            actions += self._open_legs(call, new_streams)
        return actions

    def _apply_metadata(self, call: Call) -> list[Action]:
        """A metadata-only update: re-map participants (and so roles) onto the current legs."""
        plans = [leg.plan for leg in call.legs.values()]
        streams = self._streams(plans, call.info.profile, call.metadata, call.info.siprec, call.remote_party)
        return self._apply_streams(call, [s for s in streams if s[0].index in call.legs])

    def _on_update(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        return self._modify(tx, request, now)

    def _on_info(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        return self._respond(tx, request, 200 if self._find_call(request) else 481, now)

    def _on_bye(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        call = self._find_call(request)
        if call is None:
            raise _Reject(481)
        call.handle(CallEvent.BYE_IN)
        actions = self._respond(tx, request, 200, now)
        if call.end_reason is None:
            actions += self._end_call(call, "bye")
        self._forget(call)
        return actions

    def _on_cancel(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        invite_key = (tx.key[0], tx.key[1], "INVITE")  # type: ignore[index]
        invite = self._server_tx.get(invite_key)
        if invite is None:
            raise _Reject(481)
        actions = self._respond(tx, request, 200, now)
        call = self._calls.get(invite.owner or "")
        if call is not None and call.state is CallState.RINGING and invite.state is TxState.PROCEEDING:
            call.handle(CallEvent.CANCEL)
            actions += self._final_for_invite(call, 487, now)
            actions += self._end_call(call, "cancel")
            self._forget(call)
        return actions

    def _on_ack(self, request: Request, key: tuple[str, str, str], now: float) -> list[Action]:
        tx = self._server_tx.get(key)
        if tx is not None and tx.state in (TxState.COMPLETED, TxState.CONFIRMED):
            tx.ack(now)
            self._queue.schedule(("tx", key), tx.next_deadline())
            return []
        call = self._find_call(request)
        if call is None:
            self.counters["dropped.stray_ack"] += 1
            return []
        invite = self._server_tx.get(call.invite_tx)  # type: ignore[call-overload]
        if invite is not None and invite.state is TxState.ACCEPTED:
            invite.ack(now)
            self._queue.schedule(("tx", invite.key), invite.next_deadline())
        if call.state is CallState.ANSWERING:
            call.handle(CallEvent.ACK)
        return []

    # ---- responses to our requests -----------------------------------------------------

    def _on_response(self, response: Response, now: float) -> list[Action]:
        vias = response.headers.get_all("Via")
        branch = Via.parse(vias[0]).branch if vias else None
        tx = self._client_tx.get(branch or "")
        if tx is None:
            self.counters["dropped.stray_response"] += 1
            return []
        if tx.receive_response(response):
            return self._finish_client_tx(tx, now)
        return []

    def _finish_client_tx(self, tx: ClientTransaction, now: float) -> list[Action]:
        """Our BYE completed (or timed out): forget the call. Our refresh UPDATE: re-arm or hang up."""
        self._client_tx.pop(str(tx.key), None)
        self._queue.schedule(("ctx", tx.key), None)
        call = self._calls.get(tx.owner or "")
        if call is None or tx.request is None:
            return []
        if tx.request.method == "BYE" and call.state is CallState.ENDING:
            call.handle(CallEvent.BYE_DONE)
            self._forget(call)
        elif tx.request.method == "UPDATE" and call.session_expires is not None:
            status = tx.final_status
            if status is not None and 200 <= status < 300:
                call.refresh_at = now + call.session_expires / 2
                self._queue.schedule(("call", call.info.call_id), call.next_deadline())
            elif status is None or status in (408, 481):
                self.counters["calls.refresh_failed"] += 1
                return self.hangup(call.info.call_id, "session-refresh-failed", now)
        return []

    # ---- timers ------------------------------------------------------------------------

    def _server_tx_timer(self, key: object, now: float) -> list[Action]:
        tx = self._server_tx.get(key)  # type: ignore[call-overload]
        if tx is None:
            return []
        actions: list[Action] = []
        response = tx.on_timer(now)
        if response is not None and tx.peer is not None:
            self.counters["retransmissions.sent"] += 1
            actions.append(SendMessage(response, tx.peer))
        if tx.ack_timed_out:
            tx.ack_timed_out = False
            call = self._calls.get(tx.owner or "")
            if call is not None and call.invite_tx == tx.key:
                self.counters["calls.ack_timeout"] += 1
                actions += self.hangup(call.info.call_id, "ack-timeout", now)
        if tx.state is TxState.TERMINATED:
            del self._server_tx[key]  # type: ignore[arg-type]
        else:
            self._queue.schedule(("tx", key), tx.next_deadline())
        return actions

    def _client_tx_timer(self, key: object, now: float) -> list[Action]:
        tx = self._client_tx.get(str(key))
        if tx is None:
            return []
        request = tx.on_timer(now)
        if tx.state is TxState.TERMINATED:
            self.counters[f"{tx.request.method.lower() if tx.request else 'request'}.timeout"] += 1
            return self._finish_client_tx(tx, now)
        self._queue.schedule(("ctx", key), tx.next_deadline())
        if request is not None and tx.peer is not None:
            return [SendMessage(request, tx.peer)]
        return []

    def _call_timer(self, call_id: object, now: float) -> list[Action]:
        call = self._calls.get(str(call_id))
        if call is None:
            return []
        if call.answer_at is not None and now >= call.answer_at:
            return self._answer(call, now)
        if call.expires_at is not None and now >= call.expires_at:
            call.expires_at = None
            self.counters["calls.session_expired"] += 1
            return self.hangup(call.info.call_id, "session-expired", now)
        if call.refresh_at is not None and now >= call.refresh_at and call.session_expires is not None:
            call.refresh_at = None
            refresh = (("Session-Expires", f"{call.session_expires};refresher=uas"), ("Supported", "timer"))
            return self._send_request(call, "UPDATE", now, refresh)
        self._queue.schedule(("call", call_id), call.next_deadline())
        return []

    # ---- ending calls ------------------------------------------------------------------

    def _end_call(self, call: Call, reason: str) -> list[Action]:
        """Stop the media and tell the application (once); the dialog may live on until BYE completes."""
        call.end_reason = reason
        call.answer_at = call.expires_at = call.refresh_at = None
        self._queue.schedule(("call", call.info.call_id), None)
        actions: list[Action] = [StopMedia(call.info.call_id, leg.info.leg_id, leg.port) for leg in call.legs.values()]
        if call.legs:
            actions.append(CallEnded(call.info, reason))
        self.counters[f"calls.ended.{reason}"] += 1
        return actions

    def _forget(self, call: Call) -> None:
        self._calls.pop(call.info.call_id, None)
        self._dialogs.pop((call.sip_call_id, call.local_tag), None)
        self._queue.schedule(("call", call.info.call_id), None)

    def _final_for_invite(self, call: Call, status: int, now: float) -> list[Action]:
        tx = self._server_tx.get(call.invite_tx)  # type: ignore[call-overload]
        if tx is None or tx.state is not TxState.PROCEEDING:
            return []
        return self._respond(tx, call.request, status, now, to_tag=call.local_tag)

    def _send_request(
        self, call: Call, method: str, now: float, extra: tuple[tuple[str, str], ...] = ()
    ) -> list[Action]:
        """An in-dialog request (BYE, refresh UPDATE) to the peer the dialog came from."""
        transport = call.source.transport
        branch = BRANCH_MAGIC + secrets.token_hex(8)
        call.local_cseq += 1
        headers = Headers()
        headers.add("Via", f"SIP/2.0/{transport.upper()} {self._via_host(transport)};branch={branch};rport")
        headers.add("Max-Forwards", "70")
        for route in call.route_set:
            headers.add("Route", route)
        headers.add("From", str(call.local_party))
        headers.add("To", str(call.remote_party))
        headers.add("Call-ID", call.sip_call_id)
        headers.add("CSeq", f"{call.local_cseq} {method}")
        for name, value in extra:
            headers.add(name, value)
        headers.add("User-Agent", self.settings.user_agent)
        request = Request(method, call.remote_target, headers)
        tx = ClientTransaction.create(branch, request, transport != "udp", self.timers, now)
        tx.peer = call.source
        tx.owner = call.info.call_id
        self._client_tx[branch] = tx
        self._queue.schedule(("ctx", branch), tx.next_deadline())
        self.counters[f"{method.lower()}.sent"] += 1
        return [SendMessage(request, call.source)]

    def _via_host(self, transport: str) -> str:
        return f"{self.settings.public_host()}:{self.local_ports.get(transport, self.settings.port)}"

    # ---- building responses ------------------------------------------------------------

    def _respond(
        self,
        tx: ServerTransaction,
        request: Request,
        status: int,
        now: float,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
        to_tag: str | None = None,
        contact: bool = False,
        call: Call | None = None,
    ) -> list[Action]:
        if status >= 200 and to_tag is None and request.method != "CANCEL":
            to_tag = secrets.token_hex(6)
        response = self._make_response(request, status, headers, to_tag)
        if call is not None and (contact or body):
            srs = ";+sip.srs" if call.info.siprec else ""
            transport = "" if call.source.transport == "udp" else f";transport={call.source.transport}"
            response.headers.add(
                "Contact", f"<sip:hotline-asr@{self._via_host(call.source.transport)}{transport}>{srs}"
            )
        if body:
            response.headers.add("Content-Type", "application/sdp")
            response.body = body
        tx.send_response(response, now)
        self._queue.schedule(("tx", tx.key), tx.next_deadline())
        if status >= 200 and tx.state is TxState.COMPLETED and tx.deadline is not None and tx.deadline <= now:
            self._queue.schedule(("tx", tx.key), now)
        assert tx.peer is not None
        return [SendMessage(response, tx.peer)]

    def _make_response(
        self,
        request: Request,
        status: int,
        extra: tuple[tuple[str, str], ...] = (),
        to_tag: str | None = None,
    ) -> Response:
        self.counters[f"responses.{status}"] += 1
        headers = Headers()
        for name, value in request.headers:
            lower = name.lower()
            if lower in ("via", "from", "call-id", "cseq") or (
                lower == "record-route" and request.method == "INVITE" and 100 < status < 300
            ):
                headers.add(name, value)
            elif lower == "to":
                if to_tag is not None and status > 100 and ";tag=" not in value.replace(" ", "").lower():
                    value = f"{value};tag={to_tag}"
                headers.add(name, value)
        headers.add("Server", self.settings.user_agent)
        if status in (200, 405) and request.method in ("INVITE", "UPDATE"):
            headers.add("Allow", ALLOW)
            headers.add("Supported", SUPPORTED)
        for name, value in extra:
            headers.add(name, value)
        return Response(status, REASONS.get(status, "Unknown"), headers)

    # ---- admission: rate limit and digest auth -----------------------------------------

    def _rate_ok(self, host: str, now: float) -> bool:
        """Token bucket per source IP; the table keeps the most recent sources only."""
        burst = float(self.settings.invite_burst)
        tokens, last = self._buckets.pop(host, (burst, now))
        tokens = min(burst, tokens + max(0.0, now - last) * self.settings.invite_rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[host] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > _MAX_BUCKETS:
            del self._buckets[next(iter(self._buckets))]
        return allowed

    def _challenge(self, now: float) -> str:
        assert self.settings.auth is not None
        stamp = f"{int(now * 1000):x}"
        nonce = f"{stamp}.{hmac.new(self._secret, stamp.encode(), hashlib.sha256).hexdigest()[:20]}"
        return f'Digest realm="{self.settings.auth.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"'

    def _nonce_fresh(self, nonce: str, now: float) -> bool:
        stamp, _, mac = nonce.partition(".")
        expected = hmac.new(self._secret, stamp.encode(), hashlib.sha256).hexdigest()[:20]
        try:
            issued = int(stamp, 16) / 1000
        except ValueError:
            return False
        return hmac.compare_digest(mac, expected) and 0 <= now - issued <= _NONCE_LIFETIME_S

    def _authorized(self, request: Request, now: float) -> bool:
        assert self.settings.auth is not None
        header = request.headers.get("Authorization") or ""
        scheme, _, rest = header.partition(" ")
        if scheme.lower() != "digest":
            return False
        params: dict[str, str] = {}
        for item in split_list(rest):
            name, _, value = item.partition("=")
            params[name.strip().lower()] = unquote(value)
        password = self.settings.auth.users.get(params.get("username", ""))
        if password is None or params.get("realm") != self.settings.auth.realm:
            return False
        if not self._nonce_fresh(params.get("nonce", ""), now):
            return False

        def md5(text: str) -> str:
            return hashlib.md5(text.encode("utf-8")).hexdigest()

        ha1 = md5(f"{params['username']}:{params['realm']}:{password}")
        ha2 = md5(f"{request.method}:{params.get('uri', '')}")
        if params.get("qop"):
            expected = md5(f"{ha1}:{params['nonce']}:{params.get('nc', '')}:{params.get('cnonce', '')}:auth:{ha2}")
        else:
            expected = md5(f"{ha1}:{params['nonce']}:{ha2}")
        return hmac.compare_digest(expected, params.get("response", ""))
