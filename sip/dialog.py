"""A call as seen by our UAS: the dialog (RFC 3261 section 12) and its state table.

``Call`` holds what identifies the dialog (Call-ID, tags), the sequence numbers, where to
send in-dialog requests, the legs we receive and the SDP session version. Its state moves
only along ``CALL_TABLE``. ``offer`` is the peer's latest session description (its offer, or
its answer to ours); ``answer_sdp`` is our latest one (an answer, or an offer while
``awaiting_answer``: a 2xx to an offerless INVITE whose ACK must carry the answer).
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass, field

from calls.call import CallInfo, LegInfo
from calls.roles import Role
from sip.errors import LocalProtocolError, RemoteProtocolError, SipParseError
from sip.header_values import NameAddr, SipUri, split_list
from sip.message import BRANCH_MAGIC, Address, Headers, Request
from sip.sdp import SessionDescription, StreamPlan
from sip.siprec import RecordingMetadata


class CallState(enum.Enum):
    RINGING = "Ringing"
    ANSWERING = "Answering"
    CONFIRMED = "Confirmed"
    ENDING = "Ending"
    ENDED = "Ended"


class CallEvent(enum.Enum):
    ANSWER = "answer"
    REJECT = "reject"
    CANCEL = "cancel"
    ACK = "ack"
    ACK_TIMEOUT = "ack timeout"
    BYE_IN = "bye received"
    HANGUP = "hangup"
    BYE_DONE = "bye done"
    UPDATE = "update"


C, E = CallState, CallEvent
CALL_TABLE: dict[tuple[CallState, CallEvent], CallState] = {
    (C.RINGING, E.ANSWER): C.ANSWERING,
    (C.RINGING, E.REJECT): C.ENDED,
    (C.RINGING, E.CANCEL): C.ENDED,
    (C.RINGING, E.HANGUP): C.ENDED,
    (C.ANSWERING, E.ACK): C.CONFIRMED,
    (C.ANSWERING, E.ACK_TIMEOUT): C.ENDING,
    (C.ANSWERING, E.BYE_IN): C.ENDED,
    (C.ANSWERING, E.HANGUP): C.ENDING,
    (C.ANSWERING, E.UPDATE): C.ANSWERING,
    (C.CONFIRMED, E.ACK): C.CONFIRMED,
    (C.CONFIRMED, E.UPDATE): C.CONFIRMED,
    (C.CONFIRMED, E.BYE_IN): C.ENDED,
    (C.CONFIRMED, E.HANGUP): C.ENDING,
    (C.ENDING, E.BYE_IN): C.ENDED,
    (C.ENDING, E.BYE_DONE): C.ENDED,
    (C.ENDING, E.ACK): C.ENDING,
}
_REMOTE_EVENTS = frozenset({E.CANCEL, E.ACK, E.BYE_IN, E.UPDATE})


@dataclass
class Leg:
    info: LegInfo
    plan: StreamPlan
    port: int


@dataclass
class Call:
    info: CallInfo
    sip_call_id: str
    local_tag: str
    remote_tag: str | None
    local_party: NameAddr
    remote_party: NameAddr
    remote_target: str
    route_set: list[str]
    source: Address
    remote_cseq: int
    request: Request
    invite_tx: object
    metadata: RecordingMetadata | None = None
    state: CallState = CallState.RINGING
    local_cseq: int = 1
    legs: dict[int, Leg] = field(default_factory=dict)
    sdp_session_id: int = 0
    sdp_version: int = 0
    answer_sdp: bytes = b""
    answer_at: float | None = None
    expires_at: float | None = None
    refresh_at: float | None = None
    session_expires: int | None = None
    end_reason: str | None = None
    offer: SessionDescription | None = None
    awaiting_answer: bool = False
    pending_streams: list[tuple[StreamPlan, Role, str | None]] = field(default_factory=list)

    def handle(self, event: CallEvent) -> CallState:
        new = CALL_TABLE.get((self.state, event))
        if new is None:
            error = RemoteProtocolError if event in _REMOTE_EVENTS else LocalProtocolError
            raise error(f"event {event.value!r} is illegal for the UAS dialog in state {self.state.value}", 481)
        self.state = new
        return new

    def next_deadline(self) -> float | None:
        times = [t for t in (self.answer_at, self.expires_at, self.refresh_at) if t is not None]
        return min(times) if times else None

    def leg_infos(self) -> tuple[LegInfo, ...]:
        return tuple(leg.info for leg in self.legs.values())

    def next_hop(self) -> Address | None:
        """Where a new connection for our in-dialog request goes (RFC 3261 8.1.2, 18.1.1): the
        first Record-Route entry (loose routing), else the remote target (Contact). Its
        ``transport`` parameter, else ``tls`` for a sips URI, else the dialog's own transport;
        its port, else 5061 for TLS and 5060 otherwise. Host names are resolved as A/AAAA
        records (no NAPTR/SRV). None when the URI is not a SIP URI we can read."""
        try:
            text = NameAddr.parse(split_list(self.route_set[0])[0]).uri if self.route_set else self.remote_target
            uri = SipUri.parse(text)
        except (SipParseError, IndexError):
            return None
        if uri.scheme == "tel":
            return None
        maddr = uri.params.get("maddr")
        transport = (uri.params.get("transport") or ("tls" if uri.scheme == "sips" else self.source.transport)).lower()
        host = (maddr or uri.host).strip("[]")
        return Address(transport, host, uri.port or (5061 if transport == "tls" else 5060))

    def next_request(
        self, method: str, via_host: str, user_agent: str, extra: tuple[tuple[str, str], ...] = ()
    ) -> tuple[str, Request]:
        """(branch, request): our next in-dialog request (BYE, refresh UPDATE) to the remote
        target along the route set, with the next local CSeq; ``via_host`` is our host:port."""
        transport = self.source.transport
        branch = BRANCH_MAGIC + secrets.token_hex(8)
        self.local_cseq += 1
        headers = Headers()
        headers.add("Via", f"SIP/2.0/{transport.upper()} {via_host};branch={branch};rport")
        headers.add("Max-Forwards", "70")
        for route in self.route_set:
            headers.add("Route", route)
        headers.add("From", str(self.local_party))
        headers.add("To", str(self.remote_party))
        headers.add("Call-ID", self.sip_call_id)
        headers.add("CSeq", f"{self.local_cseq} {method}")
        for name, value in extra:
            headers.add(name, value)
        headers.add("User-Agent", user_agent)
        return branch, Request(method, self.remote_target, headers)
