import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtp.packet import RTCP_BYE, RtcpPacket, RtpPacket, is_rtcp, parse_rtcp

# PCMU, marker set, seq 0xFFFF, ts 0x01020304, ssrc 0xDEADBEEF, 4 payload bytes
SIMPLE = bytes.fromhex("8080ffff01020304deadbeef") + b"\x01\x02\x03\x04"
# CSRC x2, extension (profile 0xBEDE, one word), padding of 3 bytes
FULL = (
    bytes.fromhex("b208000100000a0000000001")
    + bytes.fromhex("0000000200000003")
    + bytes.fromhex("bede0001")
    + b"\x10\xaa\x00\x00"
    + b"\xff" * 5
    + b"\x00\x00\x03"
)
RTCP_RR_EMPTY = bytes.fromhex("80c9000100000001")
RTCP_BYE_ONE = bytes.fromhex("81cb0001deadbeef")


def test_parse_simple() -> None:
    packet = RtpPacket.parse(SIMPLE)
    assert packet.payload_type == 0
    assert packet.marker
    assert packet.sequence_number == 0xFFFF
    assert packet.timestamp == 0x01020304
    assert packet.ssrc == 0xDEADBEEF
    assert packet.payload == b"\x01\x02\x03\x04"
    assert packet.csrc == []
    assert packet.extension_profile is None
    assert bytes(packet) == SIMPLE


def test_parse_full() -> None:
    packet = RtpPacket.parse(FULL)
    assert packet.payload_type == 8
    assert not packet.marker
    assert packet.csrc == [2, 3]
    assert packet.extension_profile == 0xBEDE
    assert packet.extension_data == b"\x10\xaa\x00\x00"
    assert packet.payload == b"\xff" * 5
    assert packet.padding == b"\x00\x00\x03"
    assert bytes(packet) == FULL


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "RTP packet length is less than 12 bytes"),
        (SIMPLE[:11], "RTP packet length is less than 12 bytes"),
        (b"\x40" + SIMPLE[1:], "RTP packet has invalid version"),
        (FULL[:16], "RTP packet has truncated CSRC"),
        (FULL[:22], "RTP packet has truncated extension header"),
        (FULL[:26], "RTP packet has truncated extension data"),
        (b"\xa0" + SIMPLE[1:-1] + b"\x00", "RTP packet padding length is invalid"),
        (b"\xa0" + SIMPLE[1:-1] + b"\x05", "RTP packet padding length is invalid"),
    ],
)
def test_parse_invalid(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        RtpPacket.parse(data)


def test_serialize_rejects_inconsistent_fields() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        bytes(RtpPacket(extension_profile=1, extension_data=b"\x00"))
    with pytest.raises(ValueError, match="end with its own length"):
        bytes(RtpPacket(padding=b"\x00\x05"))


@given(
    payload_type=st.integers(0, 127),
    seq=st.integers(0, 0xFFFF),
    timestamp=st.integers(0, 0xFFFFFFFF),
    ssrc=st.integers(0, 0xFFFFFFFF),
    marker=st.booleans(),
    csrc=st.lists(st.integers(0, 0xFFFFFFFF), max_size=15),
    extension=st.one_of(st.none(), st.tuples(st.integers(0, 0xFFFF), st.binary(max_size=12))),
    payload=st.binary(max_size=200),
    padding=st.binary(max_size=10),
)
def test_round_trip(
    payload_type: int,
    seq: int,
    timestamp: int,
    ssrc: int,
    marker: bool,
    csrc: list[int],
    extension: tuple[int, bytes] | None,
    payload: bytes,
    padding: bytes,
) -> None:
    profile, data = extension if extension else (None, b"")
    data = data[: len(data) // 4 * 4]
    padding = padding[:-1] + bytes([len(padding)]) if padding else b""
    packet = RtpPacket(payload_type, seq, timestamp, ssrc, marker, csrc, profile, data, payload, padding)
    wire = bytes(packet)
    assert RtpPacket.parse(wire) == packet
    assert bytes(RtpPacket.parse(wire)) == wire


def test_rtcp_compound_with_bye() -> None:
    packets = parse_rtcp(RTCP_RR_EMPTY + RTCP_BYE_ONE)
    assert [p.packet_type for p in packets] == [201, RTCP_BYE]
    assert not packets[0].is_bye
    assert packets[1].is_bye
    assert packets[1].bye_sources == [0xDEADBEEF]
    assert packets[0].bye_sources == []
    assert b"".join(bytes(p) for p in packets) == RTCP_RR_EMPTY + RTCP_BYE_ONE
    assert is_rtcp(RTCP_BYE_ONE)
    assert not is_rtcp(SIMPLE)


def test_rtcp_padding_round_trip() -> None:
    wire = bytes.fromhex("a1cb0002deadbeef00000004")
    (packet,) = parse_rtcp(wire)
    assert packet.bye_sources == [0xDEADBEEF]
    assert packet.padding == b"\x00\x00\x00\x04"
    assert bytes(packet) == wire
    assert bytes(RtcpPacket(RTCP_BYE, 1, struct.pack("!I", 7))) == bytes.fromhex("81cb000100000007")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x80\xc9", "RTCP packet length is less than 4 bytes"),
        (RTCP_RR_EMPTY + b"\x80", "RTCP packet length is less than 4 bytes"),
        (b"\x40" + RTCP_RR_EMPTY[1:], "RTCP packet has invalid version"),
        (bytes.fromhex("80000001") + b"\x00" * 4, "RTCP packet has invalid type"),
        (RTCP_RR_EMPTY[:6], "RTCP packet is truncated"),
        (bytes.fromhex("a1cb0001deadbe00"), "RTCP packet padding length is invalid"),
        (bytes.fromhex("a1cb0000"), "RTCP packet padding length is invalid"),
    ],
)
def test_rtcp_invalid(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        parse_rtcp(data)
