"""Parser and serializer: round trips, compact headers, lists, name-addr, Via, multipart, framing."""

from __future__ import annotations

import pytest

from sip.errors import SipParseError
from sip.framing import StreamFramer
from sip.header_values import NameAddr, SipUri, Via, parse_cseq, split_list
from sip.message import Headers, Request, Response, parse
from sip.multipart import BodyPart, build_multipart, parse_multipart
from tests.test_sip_support import invite

COMPACT = (
    b"INVITE sip:4000@10.0.0.1 SIP/2.0\r\n"
    b"v: SIP/2.0/UDP 10.0.0.5:5062;branch=z9hG4bK-1;rport\r\n"
    b'f: "Alice, A." <sip:alice@10.0.0.5>;tag=abc\r\n'
    b"t: <sip:4000@10.0.0.1>\r\n"
    b"i: compact@10.0.0.5\r\n"
    b"CSEQ: 7 INVITE\r\n"
    b"m: <sip:alice@10.0.0.5:5062>\r\n"
    b"k: timer, 100rel\r\n"
    b"x: 1800;refresher=uac\r\n"
    b"c: application/sdp\r\n"
    b"l: 4\r\n\r\nv=0\r\n"
)


def test_compact_headers_are_expanded_and_round_trip() -> None:
    message = parse(COMPACT)
    assert isinstance(message, Request)
    assert message.headers.get("Call-ID") == "compact@10.0.0.5"
    assert message.headers.get("i") == "compact@10.0.0.5"
    assert message.headers.get("cseq") == "7 INVITE"
    assert message.headers.get_all("Supported") == ["timer", "100rel"]
    assert message.headers.get("Session-Expires") == "1800;refresher=uac"
    assert message.body == b"v=0\r"
    assert [name for name, _ in message.headers][:4] == ["Via", "From", "To", "Call-ID"]
    assert parse(bytes(message)) == message


@pytest.mark.parametrize(
    "data",
    [
        invite(),
        b"SIP/2.0 180 Ringing\r\nVia: SIP/2.0/TCP h;branch=z9hG4bKx\r\nContent-Length: 0\r\n\r\n",
        b"OPTIONS sip:x@y SIP/2.0\r\nSubject: folded\r\n  across lines\r\n\r\n",
        b"SIP/2.0 200\r\n\r\n",
    ],
)
def test_round_trip(data: bytes) -> None:
    message = parse(data)
    assert parse(bytes(message)) == message


def test_folded_header_is_joined() -> None:
    message = parse(b"OPTIONS sip:x@y SIP/2.0\r\nSubject: folded\r\n  across lines\r\n\r\n")
    assert message.headers.get("Subject") == "folded across lines"


def test_response_fields() -> None:
    response = parse(b"SIP/2.0 486 Busy Here\r\nContent-Length: 0\r\n\r\n")
    assert isinstance(response, Response)
    assert (response.status, response.reason) == (486, "Busy Here")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no blank line"),
        (b"INVITE sip:x@y SIP/2.0\r\nVia: x\r\n", "no blank line"),
        (b"HELLO\r\n\r\n", "malformed start line"),
        (b"INVITE sip:x@y SIP/3.0\r\n\r\n", "malformed start line"),
        (b"INVITE sip:x@y SIP/2.0\r\nno colon here\r\n\r\n", "malformed header line"),
        (b"INVITE sip:x@y SIP/2.0\r\nBad Name: x\r\n\r\n", "malformed header line"),
        (b"INVITE sip:x@y SIP/2.0\r\nContent-Length: 10\r\n\r\nshort", "truncated body"),
        (b"INVITE sip:x@y SIP/2.0\r\nContent-Length: -1\r\n\r\n", "not a number"),
        (b"INVITE sip:x@y SIP/2.0\r\nContent-Length: \xc2\xb2\r\n\r\n", "not a number"),
        (b"INVITE sip:x@y SIP/2.0\r\nFrom: \xff\r\n\r\n", "not UTF-8"),
        (b" continuation\r\n\r\n", "continuation line before the first header"),
    ],
)
def test_bad_messages_raise_sip_parse_error(data: bytes, message: str) -> None:
    with pytest.raises(SipParseError, match=message) as info:
        parse(data)
    assert isinstance(info.value, ValueError)
    assert info.value.status_hint == 400


def test_split_list_respects_quotes_and_angle_brackets() -> None:
    value = '"Doe, John" <sip:j@x;a=1,2>;tag=1, <sip:k@y>, sip:z@w'
    assert split_list(value) == ['"Doe, John" <sip:j@x;a=1,2>;tag=1', "<sip:k@y>", "sip:z@w"]
    with pytest.raises(SipParseError, match="unterminated quoted string"):
        split_list('"open, <sip:x@y>')


def test_multi_line_headers_are_one_list() -> None:
    headers = Headers([("Via", "SIP/2.0/UDP a;branch=z9hG4bK1, SIP/2.0/UDP b"), ("v", "SIP/2.0/UDP c")])
    headers.items = [(name if name != "v" else "Via", value) for name, value in headers.items]
    assert len(headers.get_all("via")) == 3
    auth = Headers([("Authorization", 'Digest username="a", realm="b"')])
    assert auth.get_all("Authorization") == ['Digest username="a", realm="b"']


def test_name_addr_forms() -> None:
    quoted = NameAddr.parse('"Alice \\"A\\"" <sip:alice@x.com;transport=tcp>;tag=88;+sip.src')
    assert quoted.display == 'Alice "A"'
    assert quoted.uri == "sip:alice@x.com;transport=tcp"
    assert quoted.tag == "88"
    assert "+sip.src" in quoted.params
    bare = NameAddr.parse("sip:bob@y.com;tag=9")
    assert (bare.display, bare.uri, bare.tag) == (None, "sip:bob@y.com", "9")
    assert NameAddr.parse(str(quoted.with_params(tag="99"))).tag == "99"
    with pytest.raises(SipParseError, match="unbalanced"):
        NameAddr.parse("Bob <sip:bob@y.com")


def test_via_branch_received_rport() -> None:
    via = Via.parse("SIP/2.0/UDP 10.0.0.5:5062;branch=z9hG4bK-1;rport;received=1.2.3.4")
    assert (via.transport, via.host, via.port, via.branch) == ("UDP", "10.0.0.5", 5062, "z9hG4bK-1")
    assert via.params["rport"] is None and via.params["received"] == "1.2.3.4"
    assert Via.parse(str(via)) == via
    assert Via.parse("SIP/2.0/TLS [2001:db8::1]:5061;branch=z9hG4bKa").host == "[2001:db8::1]"
    for bad in ("SIP/2.0 host", "HTTP/1.1/TCP h", "SIP/2.0/UDP h:99999"):
        with pytest.raises(SipParseError):
            Via.parse(bad)


def test_sip_uri_and_cseq() -> None:
    uri = SipUri.parse("sip:+8613800000000@carrier.example:5080;user=phone")
    assert (uri.user, uri.host, uri.port, uri.params) == ("+8613800000000", "carrier.example", 5080, {"user": "phone"})
    assert parse_cseq("12 INVITE") == (12, "INVITE")
    for bad in ("", "x INVITE", "1", "99999999999 BYE"):
        with pytest.raises(SipParseError, match="CSeq"):
            parse_cseq(bad)


def test_multipart_round_trip() -> None:
    parts = [BodyPart("application/sdp", b"v=0\r\n"), BodyPart("application/rs-metadata+xml", b"<recording/>")]
    body = build_multipart(parts, "b1")
    parsed = parse_multipart('multipart/mixed; boundary="b1"', body)
    assert [(p.content_type, p.body) for p in parsed] == [(p.content_type, p.body) for p in parts]
    with pytest.raises(SipParseError, match="boundary"):
        parse_multipart("multipart/mixed", body)
    with pytest.raises(SipParseError, match="no part"):
        parse_multipart("multipart/mixed;boundary=zz", body)


def test_framer_one_byte_at_a_time_then_trailing_data() -> None:
    data = invite()
    framer = StreamFramer()
    out: list[bytes] = []
    for i in range(len(data)):
        framer.feed(data[i : i + 1])
        out.extend(framer)
    assert out == [data]
    framer.feed(b"\r\n\r\n" + data + data[:30])
    assert list(framer) == [data]
    assert framer.keepalives == 1
    framer.feed(data[30:])
    assert list(framer) == [data]


def test_framer_limits() -> None:
    framer = StreamFramer(max_message_bytes=2048)
    framer.feed(b"INVITE sip:x@y SIP/2.0\r\nContent-Length: 999999\r\n\r\n")
    with pytest.raises(SipParseError, match="exceeds the limit") as info:
        framer.next_message()
    assert info.value.status_hint == 513
    endless = StreamFramer(max_message_bytes=2048)
    endless.feed(b"X" * 4096)
    with pytest.raises(SipParseError, match="longer than"):
        endless.next_message()
    bad = StreamFramer()
    bad.feed(b"INVITE sip:x@y SIP/2.0\r\nl: abc\r\n\r\n")
    with pytest.raises(SipParseError, match="not a number"):
        bad.next_message()


def test_framer_header_cap_and_pending() -> None:
    framer = StreamFramer(max_message_bytes=65536, max_header_bytes=1024)
    framer.feed(b"\r\n\r\n")
    assert list(framer) == [] and not framer.pending
    framer.feed(b"OPTIONS sip:x@y SIP/2.0\r\n")
    assert list(framer) == [] and framer.pending
    framer.feed(b"X-Pad: " + b"a" * 1024)
    with pytest.raises(SipParseError, match="header block longer than 1024"):
        framer.next_message()
    complete = StreamFramer(max_message_bytes=65536, max_header_bytes=1024)
    complete.feed(b"OPTIONS sip:x@y SIP/2.0\r\nX-Pad: " + b"a" * 1024 + b"\r\n\r\n")
    with pytest.raises(SipParseError, match="header block longer than 1024"):
        complete.next_message()
