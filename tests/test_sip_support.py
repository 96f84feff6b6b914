"""Shared builders for the SIP tests (no tests here): requests as a peer sends them, fake RTP ports."""

from __future__ import annotations

from rtp.ports import PortsExhausted
from sip.message import Address, Request, Response, parse

SOURCE = Address("udp", "10.0.0.5", 5062)

OFFER_PCMU = (
    "v=0\r\no=- 1 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 8 101\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
)


def invite(
    *,
    call_id: str = "call-1@10.0.0.5",
    branch: str = "z9hG4bK-1",
    cseq: int = 1,
    method: str = "INVITE",
    to_tag: str | None = None,
    body: str = OFFER_PCMU,
    content_type: str = "application/sdp",
    extra: str = "",
    to_user: str = "4000",
) -> bytes:
    to = f"<sip:{to_user}@10.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
    data = body.encode()
    head = (
        f"{method} sip:{to_user}@10.0.0.1 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 10.0.0.5:5062;branch={branch}\r\n"
        "Max-Forwards: 70\r\n"
        'From: "Alice" <sip:alice@10.0.0.5>;tag=from1\r\n'
        f"To: {to}\r\n"
        f"Call-ID: {call_id}\r\n"
        f"CSeq: {cseq} {method}\r\n"
        "Contact: <sip:alice@10.0.0.5:5062>\r\n"
        f"{extra}"
    )
    if data:
        head += f"Content-Type: {content_type}\r\n"
    return (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def ack(*, to_tag: str, cseq: int = 1, branch: str = "z9hG4bK-ack1", call_id: str = "call-1@10.0.0.5") -> bytes:
    return invite(method="ACK", to_tag=to_tag, cseq=cseq, branch=branch, body="", call_id=call_id)


def as_response(data: bytes) -> Response:
    message = parse(data)
    assert isinstance(message, Response)
    return message


def as_request(data: bytes) -> Request:
    message = parse(data)
    assert isinstance(message, Request)
    return message


class FakePorts:
    def __init__(self, first: int = 20000, count: int = 100) -> None:
        self.free = list(range(first, first + 2 * count, 2))
        self.used: set[int] = set()

    def allocate(self) -> int:
        if not self.free:
            raise PortsExhausted("no ports")
        port = self.free.pop(0)
        self.used.add(port)
        return port

    def release(self, port: int) -> None:
        self.used.discard(port)
        self.free.append(port)
