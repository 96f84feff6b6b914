"""The UAS core: (message, source, now) in, actions out. No sockets, no asyncio, no clock.

The transport feeds every datagram or framed stream message to ``receive`` and calls
``on_timer`` when ``next_deadline`` has passed; it performs the returned actions in order:
``SendMessage`` (serialize and send), ``StartMedia``/``UpdateMedia``/``StopMedia`` (the RTP
legs) and ``CallEnded`` (tell the application, after the legs are closed). The core calls the
``CallHandler`` synchronously only for the two questions it must answer before replying:
``has_capacity`` and ``open_leg``. Nothing a peer sends escapes ``receive`` as an exception:
protocol errors become error responses (or drops) and are counted in ``counters``; a bug in
a handler (ours or the application's) is logged with its traceback and answered 500, a full
node 503.

This module keeps the transactions and dialogs; its helpers each have one job:
``invite.InviteGate`` (the checks a new INVITE passes), ``admission`` (ACL, rate, capacity),
``auth`` (digest), ``session_timer`` (RFC 4028), ``call_media`` (streams, legs, SDP answer),
``responses`` (building responses) and ``actions`` (what the transport is asked to do).
At about 650 lines it is kept whole on purpose: every method left here reads and writes the
same transaction and dialog tables, and cutting them apart would scatter one state machine.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import Counter

from calls.handler import CallHandler
from calls.routing import Router
from sip import session_timer
from sip.actions import Action, CallEnded, SendMessage, StopMedia
from sip.admission import Admission
from sip.auth import DigestAuth
from sip.call_media import CallMedia, PortSource, read_body
from sip.config import Network, SipSettings
from sip.dialog import Call, CallEvent, CallState
from sip.errors import ProtocolError, SipParseError
from sip.header_values import NameAddr, Via, parse_cseq, split_list
from sip.invite import InviteGate
from sip.message import Address, Message, Request, Response, parse
from sip.responses import (
    ACCEPT,
    ALLOW,
    SUPPORTED,
    HeaderPairs,
    Reject,
    contact_header,
    make_response,
    reason_header,
    warning,
)
from sip.transaction import ClientTransaction, ServerTransaction, TimerConfig, TimerQueue, TxState, server_key

log = logging.getLogger(__name__)

_ROUTINE_REFUSALS = frozenset({401, 407, 503})
"""INVITE answers that are not news for the log: digest challenges and a full or draining node."""
_MAX_REFUSAL_KEYS = 4096
"""(source, status) pairs whose refusals are followed in the log; refusals of later pairs are only counted."""

_KNOWN_METHODS = frozenset({"REGISTER", "SUBSCRIBE", "NOTIFY", "PUBLISH", "MESSAGE", "REFER", "PRACK"})


class UasCore:
    def __init__(
        self, settings: SipSettings, handler: CallHandler, ports: PortSource, router: Router | None = None
    ) -> None:
        self.settings = settings
        self.handler = handler
        self.ports = ports
        self._router = router or Router()
        self.timers = TimerConfig(settings.t1_ms / 1000, settings.t2_ms / 1000)
        self.local_ports = {"udp": settings.port, "tcp": settings.port, "tls": settings.tls_port}
        self.counters: Counter[str] = Counter()
        self.admission = Admission(settings, handler, _trunk_networks(self._router))
        self.auth = DigestAuth(settings.auth) if settings.auth is not None else None
        self.media = CallMedia(handler, ports, self.counters, self.admission.retry_after())
        self.invites = InviteGate(settings, self.admission, self.auth, self._router, self.counters)
        self._calls: dict[str, Call] = {}
        # RFC 5923: a TCP/TLS peer whose Via carries ``alias`` lets us send our requests for its
        # Via address (sent-by) on the connection it opened: sent-by -> that connection.
        self.connection_aliases: dict[Address, Address] = {}
        self._dialogs: dict[tuple[str, str], str] = {}
        self._server_tx: dict[tuple[str, str, str], ServerTransaction] = {}
        self._refusals_logged: dict[tuple[str, int], int] = {}  # (source IP, status) -> INVITEs refused
        self._tx_by_source: Counter[str] = Counter()  # source IP -> server transactions it holds
        self._client_tx: dict[str, ClientTransaction] = {}
        self._queue = TimerQueue()

    # ---- public API --------------------------------------------------------------------

    @property
    def router(self) -> Router:
        return self._router

    @router.setter
    def router(self, router: Router) -> None:
        """A reloaded routes file: new calls are routed by it and its trunks become trusted."""
        self._router = router
        self.invites.router = router
        self.admission.set_trusted_trunks(_trunk_networks(router))

    @property
    def active_calls(self) -> int:
        return len(self._calls)

    def call(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    def next_deadline(self) -> float | None:
        return self._queue.next_deadline()

    @property
    def draining(self) -> bool:
        return self.admission.draining

    def set_draining(self) -> None:
        """From now on new INVITEs and OPTIONS get 503; calls in progress continue."""
        self.admission.draining = True

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
        """Every request but an ACK gets a final answer or a counted, deliberate drop."""
        headers: HeaderPairs
        try:
            if isinstance(message, Response):
                return self._on_response(message, now)
            if source.transport != "udp":
                self._note_alias(message, source)
            return self._on_request(message, source, now)
        except ProtocolError as exc:
            self.counters["errors.remote"] += 1
            status, headers = exc.status_hint, (warning(str(exc)),)
        except Exception:
            self.counters["errors.internal"] += 1
            log.exception("a message from %s:%s failed; answering 500", source.host, source.port)
            status, headers = 500, ()
            if isinstance(message, Request):
                self._free_unanswered(message)
        if not isinstance(message, Request) or message.method == "ACK":
            return []
        try:
            return [SendMessage(self._make_response(message, status, headers), source)]
        except Exception:  # headers too broken to echo back: nothing can be addressed
            self.counters["dropped.unanswerable"] += 1
            log.exception("cannot build a %s answer for a message from %s:%s", status, source.host, source.port)
            return []

    def _note_alias(self, request: Request, connection: Address) -> None:
        vias = request.headers.get_all("Via")
        if not vias:
            return
        via = Via.parse(split_list(vias[0])[0])
        if "alias" in via.params and via.transport.lower() == connection.transport:
            default = 5061 if connection.transport == "tls" else 5060
            self.connection_aliases[Address(connection.transport, via.host.strip("[]"), via.port or default)] = (
                connection
            )

    def connection_closed(self, connection: Address) -> None:
        """The transport closed ``connection``: forget the aliases that led to it."""
        for alias in [a for a, c in self.connection_aliases.items() if c == connection]:
            del self.connection_aliases[alias]

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

    def hangup(self, call_id: str, reason: str, now: float, header: tuple[str, str] | None = None) -> list[Action]:
        """End a call from our side: BYE when answered, 480 while still ringing. The BYE's
        ``Reason`` is ``header``, or by default cause 200 with ``reason`` as its text."""
        call = self._calls.get(call_id)
        if call is None or call.state in (CallState.ENDING, CallState.ENDED):
            return []
        if call.state is CallState.RINGING:
            call.handle(CallEvent.HANGUP)
            actions = self._final_for_invite(call, 503 if self.draining else 480, now)
            return actions + self._end_call(call, reason)
        call.handle(CallEvent.HANGUP)
        bye_reason = header or reason_header(200, reason)
        return self._end_call(call, reason) + self._send_request(call, "BYE", now, (bye_reason,))

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
        key = server_key(request)
        # Before the ACL: a denied source must not get a 403 for every request it floods.
        if not self.admission.request_rate_ok(source.host, now):
            self.counters["flood.rate_dropped"] += 1
            return []
        origin = self._origin(request, source)
        if not self.admission.allowed(origin):
            self.counters["acl.denied"] += 1
            if self.settings.acl_action == "drop" or request.method == "ACK":
                return []
            return [SendMessage(self._make_response(request, 403), source)]
        if request.method == "ACK":
            return self._on_ack(request, key, now)
        tx = self._server_tx.get(key)
        if tx is not None:
            cached = tx.retransmitted_request()
            self.counters["retransmissions.absorbed"] += 1
            return [SendMessage(cached, source)] if cached is not None else []
        if not self.admission.transactions_ok(source.host, self._tx_by_source[source.host]):
            self.counters["flood.source_transactions"] += 1
            return [SendMessage(self._make_response(request, 503, self.admission.retry_after()), source)]
        if len(self._server_tx) >= self.admission.max_transactions and not self.admission.trusted(source.host):
            self.counters["dropped.tx_table_full"] += 1
            return [SendMessage(self._make_response(request, 503, self.admission.retry_after()), source)]
        tx = ServerTransaction.create(key, request, source.transport != "udp", self.timers)
        tx.peer = source
        self._server_tx[key] = tx
        self._tx_by_source[source.host] += 1
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
        except Reject as reject:
            if request.method == "INVITE":
                self._note_refusal(source.host, reject)
            return self._respond(tx, request, reject.status, now, headers=reject.headers)
        except ProtocolError as exc:
            self.counters["errors.remote"] += 1
            return self._respond(tx, request, exc.status_hint, now, headers=(warning(str(exc)),))
        except Exception:
            # Our bug (or the application's), not the peer's and not a full node: say so with
            # a 500, keep the traceback, and leave no half-made call or open transaction behind.
            self.counters["errors.internal"] += 1
            log.exception("%s from %s:%s failed; answering 500", request.method, source.host, source.port)
            return self._abandon(tx, request, now)

    def _origin(self, request: Request, source: Address) -> str:
        """The caller's address (``Admission.origin``); counts a stated source it ignores or cannot read."""
        origin = self.admission.origin(request, source.host)
        stated = self.admission.stated_source(request)
        if stated is not None and origin == source.host:
            reason = "unreadable" if self.admission.is_proxy(source.host) else "not from a trusted proxy"
            self.counters["proxy.source_ignored"] += 1
            log.debug("ignoring %s %r from %s: %s", self.settings.source_header, stated, source.host, reason)
        return origin

    def _free_unanswered(self, request: Request) -> None:
        """After a failure that escaped the transaction: forget the transaction (and the call it
        was setting up) if it had no final answer yet, so nothing is left waiting forever."""
        try:
            key = server_key(request)
        except ProtocolError:
            return
        tx = self._server_tx.get(key)
        if tx is None or tx.state not in (TxState.TRYING, TxState.PROCEEDING):
            return
        del self._server_tx[key]
        self._queue.schedule(("tx", key), None)
        self._release_source(tx)
        call = self._calls.get(tx.owner or "")
        if call is not None and call.invite_tx == key and call.state is CallState.RINGING:
            self._forget(call)

    def _abandon(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        """After a handler failed: end a call it set up but did not answer, then answer 500."""
        actions: list[Action] = []
        call = self._calls.get(tx.owner or "")
        if call is not None and call.invite_tx == tx.key and call.state is CallState.RINGING:
            call.handle(CallEvent.REJECT)
            actions += self._end_call(call, "error")
            self._forget(call)
        if tx.state in (TxState.TRYING, TxState.PROCEEDING):
            to_tag = call.local_tag if call is not None else None
            actions += self._respond(tx, request, 500, now, to_tag=to_tag)
        return actions

    def _on_options(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        headers = (("Allow", ALLOW), ("Accept", ACCEPT), ("Supported", SUPPORTED))
        if not self.admission.accepting(len(self._calls), 1):
            return self._respond(tx, request, 503, now, headers=headers + self.admission.retry_after())
        return self._respond(tx, request, 200, now, headers=headers)

    def _on_invite(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        to = NameAddr.parse(request.headers.get("To") or "")
        if to.tag is not None:
            return self._modify(tx, request, now)
        assert tx.peer is not None
        origin = self.admission.origin(request, tx.peer.host)
        call = self.invites.admit(request, tx.peer, origin, tx.key, len(self._calls), now)
        call_id = call.info.call_id
        self._calls[call_id] = call
        self._dialogs[(call.sip_call_id, call.local_tag)] = call_id
        tx.owner = call_id
        self.counters["invites.accepted"] += 1
        actions = self._respond(tx, request, 100, now)
        if self.settings.answer_delay_ms > 0:
            actions += self._respond(tx, request, 180, now, to_tag=call.local_tag, contact=True, call=call)
            call.answer_at = now + self.settings.answer_delay_ms / 1000
            self._queue.schedule(("call", call_id), call.next_deadline())
            return actions
        return actions + self._answer(call, now)

    def _answer(self, call: Call, now: float) -> list[Action]:
        tx = self._server_tx.get(call.invite_tx)  # type: ignore[call-overload]
        call.answer_at = None
        if tx is None or tx.state is not TxState.PROCEEDING:
            return []
        try:
            media = self.media.open_legs(call, call.pending_streams)
        except Reject as reject:
            call.handle(CallEvent.REJECT)
            self._forget(call)
            return self._respond(tx, call.request, reject.status, now, headers=reject.headers, to_tag=call.local_tag)
        call.pending_streams = []
        call.handle(CallEvent.ANSWER)
        if call.offer is None:
            call.answer_sdp = self.media.offer_sdp(call, self.settings.public_host())
            call.awaiting_answer = True
        else:
            call.answer_sdp = self.media.answer_sdp(call, self.settings.public_host())
        headers = self._arm_session_timer(call, call.request, now)
        return media + self._respond(
            tx, call.request, 200, now, headers=headers, body=call.answer_sdp, to_tag=call.local_tag, call=call
        )

    def _arm_session_timer(self, call: Call, request: Request, now: float) -> HeaderPairs:
        headers = session_timer.arm(call, request, now)
        self._queue.schedule(("call", call.info.call_id), call.next_deadline())
        return headers

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
        if call is not None and call.state is CallState.RINGING and request.method == "UPDATE":
            # RFC 3311 5.2: the INVITE's offer (or our offer) is not answered yet.
            raise Reject(500, (("Retry-After", "1"), warning("the INVITE is not answered yet")))
        if call is None or call.state not in (CallState.ANSWERING, CallState.CONFIRMED):
            raise Reject(481)
        cseq = parse_cseq(request.headers.get("CSeq"))[0]
        if cseq <= call.remote_cseq:
            raise Reject(500, (warning("CSeq out of order"),))
        pending = self._server_tx.get(call.invite_tx)  # type: ignore[call-overload]
        if request.method == "INVITE" and pending is not None and pending.state is TxState.ACCEPTED:
            raise Reject(491, (("Retry-After", "1"),))
        body = read_body(request)
        if body.offer is not None and call.awaiting_answer:
            # RFC 3311 5.2 / RFC 3261 14.2: our offer in the 2xx awaits its answer in the ACK.
            raise Reject(491, (("Retry-After", "1"),))
        call.remote_cseq = cseq
        if body.metadata is not None:
            call.metadata = body.metadata
        session_expires = session_timer.session_interval(request, self.settings.min_se_s)
        actions = self.media.renegotiate(call, body, self.settings.public_host())
        call.handle(CallEvent.UPDATE)
        if request.method == "INVITE":
            tx.owner = call.info.call_id
            call.invite_tx = tx.key
        call.session_expires = session_expires
        headers = self._arm_session_timer(call, request, now)
        if request.method == "INVITE" and body.offer is None:
            # An offerless re-INVITE (RFC 3261 14.2): our offer in the 200, the answer in the ACK.
            call.answer_sdp = self.media.offer_sdp(call, self.settings.public_host())
            call.awaiting_answer = True
        sdp_body = call.answer_sdp if body.offer is not None or request.method == "INVITE" else b""
        return actions + self._respond(tx, request, 200, now, headers=headers, body=sdp_body)

    def _on_update(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        return self._modify(tx, request, now)

    def _on_info(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        return self._respond(tx, request, 200 if self._find_call(request) else 481, now)

    def _on_bye(self, tx: ServerTransaction, request: Request, now: float) -> list[Action]:
        call = self._find_call(request)
        if call is None:
            raise Reject(481)
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
            raise Reject(481)
        call = self._calls.get(invite.owner or "")
        # RFC 3261 9.2: the 200 to the CANCEL carries the same To tag as the INVITE's 487.
        actions = self._respond(tx, request, 200, now, to_tag=call.local_tag if call is not None else None)
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
        if call.awaiting_answer and parse_cseq(request.headers.get("CSeq"))[0] == call.remote_cseq:
            return self._take_answer(call, request, now)
        return []

    def _take_answer(self, call: Call, ack: Request, now: float) -> list[Action]:
        """The ACK of a 2xx that carried our offer: apply its answer, or end the dialog with a
        BYE whose Reason says why (RFC 3261 13.2.1 leaves no other way to refuse an answer)."""
        try:
            return self.media.take_answer(call, read_body(ack))
        except Reject as reject:
            text = next((value for name, value in reject.headers if name == "Warning"), "no acceptable SDP answer")
        except ProtocolError as exc:
            text = f"unreadable SDP answer: {exc}"
        self.counters["calls.answer_refused"] += 1
        log.info("call %s: no acceptable answer in the ACK (%s); sending BYE", call.info.call_id, text)
        return self.hangup(call.info.call_id, "no-acceptable-answer", now, reason_header(488, _warning_text(text)))

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
            self._release_source(tx)
        else:
            self._queue.schedule(("tx", key), tx.next_deadline())
        return actions

    def _release_source(self, tx: ServerTransaction) -> None:
        """Give back the transaction's place in its source's budget."""
        if tx.peer is None:
            return
        self._tx_by_source[tx.peer.host] -= 1
        if self._tx_by_source[tx.peer.host] <= 0:
            del self._tx_by_source[tx.peer.host]

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
            return self._send_request(call, "UPDATE", now, session_timer.refresh_headers(call))
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

    def _send_request(self, call: Call, method: str, now: float, extra: HeaderPairs = ()) -> list[Action]:
        """An in-dialog request (BYE, refresh UPDATE) to the peer the dialog came from."""
        transport = call.source.transport
        branch, request = call.next_request(method, self._via_host(transport), self.settings.user_agent, extra)
        tx = ClientTransaction.create(branch, request, transport != "udp", self.timers, now)
        tx.peer = call.source
        tx.owner = call.info.call_id
        self._client_tx[branch] = tx
        self._queue.schedule(("ctx", branch), tx.next_deadline())
        self.counters[f"{method.lower()}.sent"] += 1
        return [SendMessage(request, call.source, call.next_hop() if transport != "udp" else None)]

    def _via_host(self, transport: str) -> str:
        return f"{self.settings.public_host()}:{self.local_ports.get(transport, self.settings.port)}"

    # ---- building responses ------------------------------------------------------------

    def _note_refusal(self, host: str, reject: Reject) -> None:
        """Say in our log why a new call was refused, as the Warning told the peer: an operator
        reading only this side must see a misconfigured PBX (a codec we do not take, a route that
        refuses). Challenges (401/407) and busy answers (503) are routine and counted elsewhere;
        the rest is counted by status (``invites.refused.<code>``) and logged for the 1st, 10th,
        100th ... refusal of each source and status, so a looping peer cannot flood the log."""
        if reject.status in _ROUTINE_REFUSALS:
            return
        self.counters[f"invites.refused.{reject.status}"] += 1
        key = (host, reject.status)
        if key not in self._refusals_logged and len(self._refusals_logged) >= _MAX_REFUSAL_KEYS:
            return  # counted; too many sources refused to follow each one in the log
        seen = self._refusals_logged[key] = self._refusals_logged.get(key, 0) + 1
        if seen == 1 or math.log10(seen).is_integer():
            reason = next((value for name, value in reject.headers if name.lower() == "warning"), "no Warning")
            log.info("INVITE from %s refused %d (%s); %d such from it so far", host, reject.status, reason, seen)

    def _respond(
        self,
        tx: ServerTransaction,
        request: Request,
        status: int,
        now: float,
        *,
        headers: HeaderPairs = (),
        body: bytes = b"",
        to_tag: str | None = None,
        contact: bool = False,
        call: Call | None = None,
    ) -> list[Action]:
        response = self._make_response(request, status, headers, to_tag)
        if call is not None and (contact or body):
            transport = call.source.transport
            response.headers.add(*contact_header(transport, self._via_host(transport), call.info.siprec))
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
        extra: HeaderPairs = (),
        to_tag: str | None = None,
    ) -> Response:
        """Every response but a 100 carries a To tag (RFC 3261 8.2.6.2): ``to_tag`` when the
        dialog has one, a fresh one otherwise; ``make_response`` keeps a tag the request had."""
        self.counters[f"responses.{status}"] += 1
        if to_tag is None and status > 100:
            to_tag = secrets.token_hex(6)
        return make_response(request, status, self.settings.user_agent, extra, to_tag)


def _warning_text(value: str) -> str:
    """The quoted text of a ``Warning`` header value (``304 agent "text"``), or the value itself."""
    first, quote, rest = value.partition('"')
    return rest.rsplit('"', 1)[0].replace('\\"', '"').replace("\\\\", "\\") if quote else first


def _trunk_networks(router: Router) -> list[Network]:
    return [network for networks in router.routes.trunks.values() for network in networks]
