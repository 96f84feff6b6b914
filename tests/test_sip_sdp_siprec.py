"""SDP answers, SIPREC detection and metadata (RFC 7865 and the older Oracle/Acme form).

The roles and routing these feed are the call model's: tests/test_calls_routing.py."""

from __future__ import annotations

import pytest

from sip.errors import SipParseError
from sip.message import parse
from sip.sdp import SessionDescription, build_answer, plan_streams
from sip.siprec import RecordingMetadata, is_siprec, split_body
from tests.test_sip_support import invite

SIPREC_SDP = (
    "v=0\r\no=src 1 1 IN IP4 10.20.0.10\r\ns=-\r\nc=IN IP4 10.20.0.10\r\nt=0 0\r\n"
    "m=audio 30000 RTP/AVP 18 0 101\r\na=rtpmap:101 telephone-event/8000\r\na=label:96\r\na=sendonly\r\n"
    "m=audio 30002 RTP/AVP 8\r\nc=IN IP4 10.20.0.11\r\na=label:97\r\na=sendonly\r\n"
    "m=video 30004 RTP/AVP 96\r\na=label:98\r\n"
)

RFC_METADATA = b"""<?xml version="1.0" encoding="UTF-8"?>
<recording xmlns='urn:ietf:params:xml:ns:recording:1'>
  <datamode>complete</datamode>
  <participant participant_id="srfBElmCRp2QB23b7Mpk0w==">
    <nameID aor="sip:bob@biloxi.com"><name xml:lang="it">Bob</name></nameID>
  </participant>
  <participant participant_id="zSfPoSvdSDCmU3A3TRDxAw==">
    <nameID aor="sip:alice@atlanta.com"/>
  </participant>
  <stream stream_id="UAAMm5GRQKSCMVvLyl4rFw==" session_id="hVpd7YQgRW2nD22h7q60JQ=="><label>96</label></stream>
  <stream stream_id="i1Pz3to5hGk8fuXl+PbwCw==" session_id="hVpd7YQgRW2nD22h7q60JQ=="><label>97</label></stream>
  <participantstreamassoc participant_id="srfBElmCRp2QB23b7Mpk0w==">
    <send>i1Pz3to5hGk8fuXl+PbwCw==</send><recv>UAAMm5GRQKSCMVvLyl4rFw==</recv>
  </participantstreamassoc>
  <participantstreamassoc participant_id="zSfPoSvdSDCmU3A3TRDxAw==">
    <send>UAAMm5GRQKSCMVvLyl4rFw==</send><recv>i1Pz3to5hGk8fuXl+PbwCw==</recv>
  </participantstreamassoc>
</recording>"""

# The draft-era form Oracle (Acme Packet) SBCs send: ids as ``id``, send/recv inside <participant>.
ACME_METADATA = b"""<?xml version='1.0' encoding='UTF-8'?>
<recording xmlns='urn:ietf:params:xml:ns:recording'>
  <datamode>complete</datamode>
  <session id="ZdW8Xj1mSr6uJ2cFzpj4Yw=="><associate-time>2024-01-01T10:00:00</associate-time></session>
  <participant id="caller-1" session="ZdW8Xj1mSr6uJ2cFzpj4Yw==">
    <nameID aor="sip:+8613800000000@carrier.example"><name>Caller</name></nameID>
    <send>st-a</send><recv>st-b</recv>
  </participant>
  <participant id="agent-1" session="ZdW8Xj1mSr6uJ2cFzpj4Yw==">
    <nameID aor="sip:1001@pbx.example"/>
    <send>st-b</send><recv>st-a</recv>
  </participant>
  <stream id="st-a" session="ZdW8Xj1mSr6uJ2cFzpj4Yw=="><label>1</label></stream>
  <stream id="st-b" session="ZdW8Xj1mSr6uJ2cFzpj4Yw=="><label>2</label></stream>
</recording>"""

PREFIXED_METADATA = RFC_METADATA.replace(b"<recording xmlns='", b"<rs:recording xmlns:rs='").replace(
    b"</recording>", b"</rs:recording>"
)


def test_sdp_answer_recvonly_first_g711_per_stream() -> None:
    offer = SessionDescription.parse(SIPREC_SDP)
    assert [m.label for m in offer.media] == ["96", "97", "98"]
    plans = plan_streams(offer, sendonly_is_hold=False)
    assert [(p.index, p.codec, p.payload_types, p.on_hold) for p in plans] == [
        (0, "PCMU", {0: "PCMU", 101: "telephone-event"}, False),
        (1, "PCMA", {8: "PCMA"}, False),
    ]
    assert plans[1].remote == ("10.20.0.11", 30002)
    answer = build_answer(offer, plans, {0: 40000, 1: 40002}, "192.0.2.1", 7, 1).decode()
    assert "m=audio 40000 RTP/AVP 0 101\r\n" in answer and "m=audio 40002 RTP/AVP 8\r\n" in answer
    assert "m=video 0 RTP/AVP 96\r\n" in answer
    assert answer.count("a=recvonly") == 2 and "a=label:96" in answer and "a=label:97" in answer
    assert "o=hotline-asr 7 1 IN IP4 192.0.2.1" in answer


def test_sdp_hold_directions() -> None:
    base = "v=0\r\nc=IN IP4 1.2.3.4\r\nm=audio 5000 RTP/AVP 8\r\na={}\r\n"
    for direction, hold, answer_direction in [
        ("sendrecv", False, "recvonly"),
        ("sendonly", True, "recvonly"),
        ("inactive", True, "inactive"),
        ("recvonly", True, "inactive"),
    ]:
        (plan,) = plan_streams(SessionDescription.parse(base.format(direction)))
        assert (plan.on_hold, plan.direction) == (hold, answer_direction), direction
    assert plan_streams(SessionDescription.parse(base.format("sendrecv").replace("5000", "0"))) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m=audio 1 RTP/AVP 0\r\n", "no v= line"),
        ("v=0\r\nbogus\r\n", "<type>=<value>"),
        ("v=0\r\nm=audio x RTP/AVP 0\r\n", "bad port"),
        ("v=0\r\nm=audio 5\r\n", "needs media"),
        ("v=0\r\nc=IN IP4\r\n", "c= line"),
    ],
)
def test_sdp_errors(text: str, message: str) -> None:
    with pytest.raises(SipParseError, match=message):
        SessionDescription.parse(text)


def test_siprec_detection() -> None:
    assert is_siprec(parse(invite(extra="Require: siprec\r\n")))  # type: ignore[arg-type]
    audiocodes = invite().replace(b"Contact: <sip:alice@10.0.0.5:5062>", b"Contact: <sip:alice@10.0.0.5:5062>;src")
    assert is_siprec(parse(audiocodes))  # type: ignore[arg-type]
    assert not is_siprec(parse(invite()))  # type: ignore[arg-type]


@pytest.mark.parametrize("metadata", [RFC_METADATA, PREFIXED_METADATA])
def test_rfc7865_metadata(metadata: bytes) -> None:
    parsed = RecordingMetadata.parse(metadata)
    assert parsed.participant_for_label("96").aor == "sip:alice@atlanta.com"  # type: ignore[union-attr]
    bob = parsed.participant_for_label("97")
    assert bob is not None and (bob.aor, bob.name) == ("sip:bob@biloxi.com", "Bob")
    assert parsed.participant_for_label("99") is None


def test_acme_metadata() -> None:
    parsed = RecordingMetadata.parse(ACME_METADATA)
    assert parsed.participant_for_label("1").aor == "sip:+8613800000000@carrier.example"  # type: ignore[union-attr]
    assert parsed.participant_for_label("2").aor == "sip:1001@pbx.example"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"<recording", "not well-formed"),
        (b"<other/>", "expected <recording>"),
        (b'<!DOCTYPE x [<!ENTITY a "b">]><recording/>', "DOCTYPE"),
    ],
)
def test_bad_metadata(data: bytes, message: str) -> None:
    with pytest.raises(SipParseError, match=message):
        RecordingMetadata.parse(data)


def test_split_multipart_body() -> None:
    body = (
        b"--xyz\r\nContent-Type: application/sdp\r\n\r\n" + SIPREC_SDP.encode() + b"\r\n"
        b"--xyz\r\nContent-Type: application/rs-metadata+xml\r\nContent-Disposition: recording-session\r\n\r\n"
        + RFC_METADATA
        + b"\r\n--xyz--\r\n"
    )
    sdp, metadata = split_body("multipart/mixed;boundary=xyz", body)
    assert sdp == SIPREC_SDP.encode() and metadata == RFC_METADATA
    with pytest.raises(SipParseError, match="unsupported body type") as info:
        split_body("text/html", b"<p>")
    assert info.value.status_hint == 415
