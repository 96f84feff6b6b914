"""Fuzzing: 100,000 mutated SIP messages into the parser, the TCP framer and the UAS core.

Only ``SipParseError``/``ValueError`` may escape the parser; nothing may escape the UAS core,
its tables must stay bounded, and every INVITE gets a final response or a drop counted under
its reason. A seeded mutation loop gives the volume (about 20 s on one
core); a smaller hypothesis test explores structure. ``SIP_FUZZ_MESSAGES`` scales the loop.
"""

from __future__ import annotations

import os
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from calls.handler import CountingCallHandler
from calls.profile import Profile
from calls.routing import Match, Route, Router, RoutesFile
from sip.actions import Action, SendMessage
from sip.config import SipSettings
from sip.framing import StreamFramer
from sip.message import Address, Request, Response, parse
from sip.multipart import BodyPart, build_multipart
from sip.sdes import SdesError, parse_crypto
from sip.uas import UasCore
from tests.test_sip_support import OFFER_PCMU, FakePorts, ack, invite

MESSAGES = int(os.environ.get("SIP_FUZZ_MESSAGES", "100000"))
SECURE_USER = "5000"  # routed to a profile with srtp: required
METADATA = (
    '<recording xmlns="urn:ietf:params:xml:ns:recording:1"><participant participant_id="p">'
    '<nameID aor="sip:a@b"/></participant><stream stream_id="s"><label>1</label></stream>'
    '<participantstreamassoc participant_id="p"><send>s</send></participantstreamassoc></recording>'
)
SIPREC_BODY = build_multipart(
    [
        BodyPart("application/sdp", OFFER_PCMU.replace("a=sendrecv", "a=label:1\r\na=sendonly").encode()),
        BodyPart("application/rs-metadata+xml", METADATA.encode()),
    ],
    "fz",
).decode()

CRYPTO = "a=crypto:1 AES_CM_128_HMAC_SHA1_32 inline:NzB4d1BINUAvLEw6UzF3WSJ+PSdFcGdUJShpX1Zj|2^20|1:32\r\n"
SAVP_OFFER = OFFER_PCMU.replace("RTP/AVP", "RTP/SAVP") + CRYPTO
CRYPTO_LINES = [
    "a=crypto:2 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz|2^20|1:4\r\n",
    "a=crypto:3 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz\r\n",
    "a=crypto:4 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz KDR=1\r\n",
    "a=crypto:5 AES_CM_128_HMAC_SHA1_32 inline:c2hvcnQ=|2^31\r\n",
    "a=crypto:6 AEAD_AES_256_GCM inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz\r\n",
    "a=crypto:x AES_CM_128_HMAC_SHA1_80 inline:!!!!|1:999\r\n",
    "a=crypto:\r\n",
]
SAVP_BOTH = SAVP_OFFER + CRYPTO_LINES[0]
ANSWER_SAVP = (
    "v=0\r\no=- 2 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\nm=audio 40000 RTP/SAVP 0\r\n"
    + CRYPTO_LINES[1]
    + "a=sendonly\r\n"
)
G722_DTMF = (
    "v=0\r\no=- 1 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 9 0 101\r\na=rtpmap:9 G722/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-16\r\na=ptime:20\r\na=sendonly\r\n"
)
TELEPHONE_EVENT_LINES = [
    "a=rtpmap:96 telephone-event/16000\r\na=fmtp:96 0-15,66,70\r\n",
    "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-16,99-\r\n",
    "a=rtpmap:101 telephone-event\r\na=fmtp:101\r\n",
    "a=rtpmap:9 telephone-event/8000\r\n",
    "a=rtpmap:127 G722/16000/2\r\n",
]
G722_VARIANTS = [G722_DTMF.replace("a=fmtp:101 0-16\r\n", line) for line in TELEPHONE_EVENT_LINES]
ANSWER_PCMA = (
    "v=0\r\no=- 2 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\nm=audio 40000 RTP/AVP 8\r\na=sendonly\r\n"
)


def corpus() -> list[bytes]:
    return [
        invite(),
        invite(
            extra="Require: siprec\r\nSupported: timer\r\nSession-Expires: 1800;refresher=uac\r\n",
            body=SIPREC_BODY,
            content_type="multipart/mixed;boundary=fz",
        ),
        invite(to_tag="t1", cseq=2, body=OFFER_PCMU.replace("sendrecv", "sendonly")),
        invite(method="UPDATE", to_tag="t1", cseq=3, body=""),
        invite(method="OPTIONS", body=""),
        invite(method="BYE", to_tag="t1", cseq=4, body=""),
        invite(method="CANCEL", body=""),
        ack(to_tag="t1"),
        b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKabc\r\nCSeq: 2 BYE\r\nl: 0\r\n\r\n",
        b"INVITE sip:x@y SIP/2.0\r\nv: SIP/2.0/TCP h;branch=z9hG4bK1\r\nf: <sip:a@b>;tag=1\r\nt: sip:c@d\r\n"
        b'i: q\r\nCSeq: 1 INVITE\r\nm: "A, B" <sip:a@b;lr>;+sip.src\r\nc: application/sdp\r\nl: 6\r\n\r\nv=0\r\n',
        invite(body=""),
        invite(method="ACK", to_tag="t1", branch="z9hG4bK-ack1", body=ANSWER_PCMA),
        invite(to_tag="t1", cseq=5, body=""),
        invite(method="UPDATE", to_tag="t1", cseq=6, body=OFFER_PCMU.replace("sendrecv", "inactive")),
        invite(body=SAVP_OFFER),
        invite(body=SAVP_OFFER + OFFER_PCMU.split("t=0 0\r\n", 1)[1]),
        invite(body=SAVP_BOTH),
        *(invite(body=OFFER_PCMU.replace("RTP/AVP", "RTP/SAVP") + line) for line in CRYPTO_LINES),
        invite(to_tag="t1", cseq=7, body=SAVP_BOTH.replace("RTP/SAVP", "RTP/SAVPF")),
        invite(method="UPDATE", to_tag="t1", cseq=8, body=SAVP_OFFER),
        invite(method="ACK", to_tag="t1", branch="z9hG4bK-ack2", body=ANSWER_SAVP),
        # wideband and key presses: G.722 offers, telephone-event maps, re-INVITE/UPDATE with DTMF
        invite(body=G722_DTMF),
        *(invite(body=variant) for variant in G722_VARIANTS),
        invite(to_tag="t1", cseq=9, body=G722_DTMF.replace("RTP/AVP 9 0 101", "RTP/AVP 101 0")),
        invite(to_tag="t1", cseq=10, body=OFFER_PCMU.replace("RTP/AVP 0 8 101", "RTP/AVP 9 101")),
        invite(method="UPDATE", to_tag="t1", cseq=11, body=G722_VARIANTS[0]),
        invite(method="ACK", to_tag="t1", branch="z9hG4bK-ack3", body=G722_DTMF.replace("9 0 101", "9 101")),
        # the srtp: required route: offerless INVITEs (we offer SAVP), their ACK answers, plain offers
        invite(to_user=SECURE_USER, body=""),
        invite(to_user=SECURE_USER, body="", extra="Require: siprec\r\n"),
        invite(to_user=SECURE_USER, body=OFFER_PCMU),
        invite(to_user=SECURE_USER, body=SAVP_BOTH),
        invite(to_user=SECURE_USER, to_tag="t1", cseq=12, body=""),
        invite(to_user=SECURE_USER, method="ACK", to_tag="t1", branch="z9hG4bK-ack4", body=ANSWER_SAVP),
        invite(to_user=SECURE_USER, method="ACK", to_tag="t1", branch="z9hG4bK-ack5", body=ANSWER_PCMA),
    ]


TOKENS = [
    b"\r\n",
    b"\r\n\r\n",
    b":",
    b";",
    b",",
    b"<",
    b">",
    b'"',
    b"\\",
    b"=",
    b" ",
    b"\x00",
    b"\xff",
    b"@",
    b"tag=",
    b"branch=z9hG4bK",
    b"Content-Length: 99999",
    b"l: 0",
    b"-1",
    b"SIP/2.0",
    b"m=audio 0 RTP/AVP 0",
    b"a=label:",
    b"RTP/SAVP",
    b"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:",
    b"AES_CM_128_HMAC_SHA1_32",
    b"|2^20|1:4",
    b"inline:",
    b"a=crypto:",
    b"Content-Length: 0",
    b"--fz",
    b"<!DOCTYPE",
    b"To: <sip:x@y>;tag=t1",
    b"CSeq: 0 INVITE",
    b"\xe4\xb8\xad",
    b"a=rtpmap:9 G722/8000",
    b"a=rtpmap:101 telephone-event/8000",
    b"a=fmtp:101 0-16",
    b"RTP/AVP 9 101",
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if kind == 0 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif kind == 1:
            buf[pos:pos] = rng.choice(TOKENS)
        elif kind == 2:
            del buf[pos : pos + rng.randint(1, 20)]
        elif kind == 3:
            end = min(len(buf), pos + rng.randint(1, 40))
            buf[pos:pos] = buf[pos:end]
        elif kind == 4:
            del buf[pos:]
        elif kind == 5:
            lines = bytes(buf).split(b"\r\n")
            rng.shuffle(lines)
            buf = bytearray(b"\r\n".join(lines))
        else:
            buf[pos:pos] = bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 12)))
    return bytes(buf)


def is_invite(data: bytes) -> bool:
    """Whether ``data`` is an INVITE we sent: its request line says so, or it parses as one."""
    if data.startswith(b"INVITE "):
        return True
    try:
        message = parse(data)
    except ValueError:
        return False
    return isinstance(message, Request) and message.method == "INVITE"


def is_final(action: Action) -> bool:
    return isinstance(action, SendMessage) and isinstance(action.message, Response) and action.message.status >= 200


def deliberate_drops(counters: Counter[str]) -> int:
    """Messages the core chose not to answer, each counted under a ``dropped.``/``flood.``/``acl.`` reason."""
    return sum(value for key, value in counters.items() if key.split(".", 1)[0] in ("dropped", "flood", "acl"))


def check_parser(data: bytes) -> None:
    try:
        message = parse(data)
    except ValueError:
        return
    assert parse(bytes(message)) == message


def test_fuzz_parser_framer_and_core() -> None:
    rng = random.Random(20240601)
    seeds = corpus()
    # srtp: optional, so that both plain and SDES offers reach the SDP and a=crypto parsers;
    # calls to SECURE_USER take a profile with srtp: required and published key presses.
    router = Router(
        RoutesFile(
            profiles={
                "default": Profile(srtp="optional"),
                "secure": Profile(name="secure", srtp="required", dtmf="publish"),
            },
            routes=[Route(name="secure", match=Match(to_user=SECURE_USER), profile="secure")],
        )
    )
    core = UasCore(SipSettings(max_calls=50), CountingCallHandler(capacity=60), FakePorts(count=200), router)
    framer = StreamFramer(max_message_bytes=8192)
    sources = [Address("udp", f"10.0.0.{i}", 5060 + i) for i in range(1, 9)]
    now = 0.0
    invites = answered = dropped = 0
    for i in range(MESSAGES):
        seed = rng.choice(seeds).replace(b"call-1@10.0.0.5", b"c%d" % (i % 300)).replace(b"z9hG4bK-1", b"z9hG4bK%d" % i)
        data = mutate(rng, seed) if i % 10 else seed
        check_parser(data)
        drops_before = deliberate_drops(core.counters)
        actions = core.receive(data, rng.choice(sources), now)
        if is_invite(data):
            invites += 1
            if any(is_final(action) for action in actions):
                answered += 1
            else:
                assert deliberate_drops(core.counters) > drops_before, f"INVITE #{i} got no answer: {data!r}"
                dropped += 1
        try:
            framer.feed(data[: rng.randrange(len(data) + 1)])
            list(framer)
        except ValueError:
            framer = StreamFramer(max_message_bytes=8192)
        if i % 100 == 0:
            now += 1.0
            core.on_timer(now)
    assert core.active_calls <= 50
    core.hangup_all("shutdown", now)
    core.on_timer(now + 3600.0)
    assert core.active_calls == 0
    assert len(core._server_tx) == 0 and len(core._client_tx) == 0
    assert core.counters["errors.internal"] == 0
    print(f"fuzz: {invites} INVITEs, {answered} answered with a final response, {dropped} dropped on purpose")
    assert invites == answered + dropped and answered > 0


HEADER_NAMES = st.sampled_from(
    [
        "Via",
        "v",
        "From",
        "f",
        "To",
        "t",
        "Call-ID",
        "i",
        "CSeq",
        "Contact",
        "m",
        "Content-Type",
        "c",
        "Content-Length",
        "l",
        "Require",
        "Session-Expires",
        "X-Queue",
        "Authorization",
    ]
)
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), max_size=40)


@settings(max_examples=400, deadline=None)
@given(
    method=st.sampled_from(["INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "UPDATE", "INFO", "FOO", "invite"]),
    headers=st.lists(st.tuples(HEADER_NAMES, TEXT), max_size=12),
    body=st.binary(max_size=200),
    start=st.sampled_from(["{m} sip:x@y SIP/2.0", "SIP/2.0 200 OK", "{m} sip:x@y SIP/2.0 extra", "SIP/2.0 99 x"]),
)
def test_hypothesis_messages(method: str, headers: list[tuple[str, str]], body: bytes, start: str) -> None:
    head = "\r\n".join([start.format(m=method)] + [f"{n}: {v}" for n, v in headers])
    data = head.encode() + b"\r\n\r\n" + body
    check_parser(data)
    core = UasCore(SipSettings(), CountingCallHandler(), FakePorts())
    core.receive(data, Address("udp", "127.0.0.1", 5062), 0.0)
    core.on_timer(100.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=50), max_size=30))
def test_framer_any_split(cuts: list[int]) -> None:
    stream = b"\r\n\r\n".join(corpus()[:5])
    framer = StreamFramer()
    out: list[bytes] = []
    pos = 0
    for cut in cuts + [len(stream)]:
        framer.feed(stream[pos : pos + cut])
        pos += cut
        out.extend(framer)
    framer.feed(stream[pos:])
    out.extend(framer)
    assert out == corpus()[:5]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from(["1", "x", " ", "AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32", "inline:", "|", "2^20",
                         "1:4", ";", "KDR=1", "WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz", "=", "\x00", "é"]),
        max_size=12,
    )
)  # fmt: skip
def test_crypto_attribute_parses_or_says_why(pieces: list[str]) -> None:
    """Any a=crypto value is a key or an SdesError (a 488 with its reason), never another exception."""
    value = "".join(pieces)
    try:
        key = parse_crypto(value)
    except SdesError as exc:
        assert exc.status_hint == 488 and str(exc)
        return
    assert len(key.keys.key) == 30


def test_wideband_dtmf_and_srtp_required_seeds_reach_their_code_paths() -> None:
    """The seeds added for G.722, telephone-event and srtp: required, sent as they are, are
    answered the way they should be, so the mutations around them explore those paths."""
    router = Router(
        RoutesFile(
            profiles={"default": Profile(), "secure": Profile(name="secure", srtp="required")},
            routes=[Route(name="secure", match=Match(to_user=SECURE_USER), profile="secure")],
        )
    )
    source = Address("udp", "10.0.0.5", 5060)

    def final(data: bytes) -> Response:
        core = UasCore(SipSettings(), CountingCallHandler(), FakePorts(), router)
        finals = [a.message for a in core.receive(data, source, 0.0) if isinstance(a, SendMessage) and is_final(a)]
        assert len(finals) == 1 and isinstance(finals[0], Response)
        return finals[0]

    g722 = final(invite(body=G722_DTMF))
    assert g722.status == 200 and "m=audio" in g722.body.decode() and "G722/8000" in g722.body.decode()
    assert "telephone-event/8000" in g722.body.decode()
    offer = final(invite(to_user=SECURE_USER, body=""))
    assert offer.status == 200 and "RTP/SAVP" in offer.body.decode() and "a=crypto:" in offer.body.decode()
    plain = final(invite(to_user=SECURE_USER, body=OFFER_PCMU))
    assert plain.status == 488 and "Warning" in plain.headers
