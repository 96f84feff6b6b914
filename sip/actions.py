"""What the UAS core asks its transport to do: the actions ``UasCore`` returns, in order."""

from __future__ import annotations

from dataclasses import dataclass

from asr_common.audio import PcmSink
from calls.call import CallInfo, LegInfo
from rtp.srtp import SrtpKeys
from sip.errors import SipParseError
from sip.header_values import Via, split_list
from sip.message import Address, Message, Response


@dataclass(frozen=True)
class SendMessage:
    """Send ``message`` to ``dest`` (for TCP/TLS: on the connection from or to that address).

    ``target``: for a request we send in a dialog over TCP/TLS, where a new connection goes
    when ``dest``'s has closed (RFC 3261 18.1.1): the next hop from the route set or the
    remote target (``Call.next_hop``). None for responses: see ``connection_target``.
    """

    message: Message
    dest: Address
    target: Address | None = None

    def connection_target(self) -> Address | None:
        """Where a new TCP/TLS connection goes when ``dest``'s has closed: ``target`` for a
        request; for a response (RFC 3261 18.2.2) the top Via's received address at its sent-by
        port, else 5060 (TCP) or 5061 (TLS). The received address is the closed connection's
        source (what 18.2.1 records as ``received``), so a NATed or named sent-by host still
        reaches the peer. None over UDP or without a readable Via."""
        if self.target is not None or self.dest.transport == "udp" or not isinstance(self.message, Response):
            return self.target
        vias = self.message.headers.get_all("Via")
        try:
            via = Via.parse(split_list(vias[0])[0]) if vias else None
        except SipParseError:
            return None
        if via is None:
            return None
        port = via.port or (5061 if self.dest.transport == "tls" else 5060)
        return Address(self.dest.transport, str(via.params.get("received") or self.dest.host), port)


@dataclass(frozen=True)
class StartMedia:
    """Open an RTP leg on ``port`` feeding ``sink``; when it ends, call ``UasCore.media_ended``.

    ``remote`` is the peer's RTP (address, port) from its SDP offer, None when it gave none;
    ``srtp`` the keys its SRTP is unprotected with, None for plain RTP.
    """

    call: CallInfo
    leg: LegInfo
    port: int
    payload_types: dict[int, str]
    on_hold: bool
    sink: PcmSink
    remote: tuple[str, int] | None = None
    srtp: SrtpKeys | None = None


@dataclass(frozen=True)
class UpdateMedia:
    call_id: str
    leg: LegInfo
    payload_types: dict[int, str]
    on_hold: bool
    remote: tuple[str, int] | None = None
    srtp: SrtpKeys | None = None


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
