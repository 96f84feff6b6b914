"""The AudioSocket wire format and one connection's state machine, sans-IO: frames cut anywhere
(one byte at a time, with trailing data), truncated and garbage input, and a fuzz test that no
byte string makes the reader or the session fail other than with ``PeerError``."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audiosocket.errors import PeerError
from audiosocket.frames import AUDIO_RATES, Frame, FrameReader, Kind, encode
from audiosocket.session import Audio, HungUp, Identified, KeyPressed, PeerFailed, Session, State

STREAM = uuid.UUID("40b1a7e6-2c1f-4c5e-9a55-0123456789ab")
SLIN = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
CALL = [
    encode(Kind.UUID, STREAM.bytes),
    encode(Kind.AUDIO, SLIN.astype("<i2").tobytes()),
    encode(Kind.DTMF, b"7"),
    encode(Kind.AUDIO, b""),
    encode(Kind.HANGUP),
]
RATES = frozenset({8000, 16000})


def frames_of(data: bytes, cut: int) -> list[Frame]:
    reader = FrameReader()
    frames = []
    for start in range(0, len(data), cut):
        reader.receive_data(data[start : start + cut])
        while (frame := reader.next_frame()) is not None:
            frames.append(frame)
    assert reader.buffered == 0
    return frames


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 1000])
def test_frames_cut_anywhere_read_the_same_and_round_trip(cut: int) -> None:
    data = b"".join(CALL)
    frames = frames_of(data, cut)
    assert [f.kind for f in frames] == [Kind.UUID, Kind.AUDIO, Kind.DTMF, Kind.AUDIO, Kind.HANGUP]
    assert b"".join(bytes(f) for f in frames) == data


def test_a_truncated_frame_waits_and_trailing_data_stays_buffered() -> None:
    reader = FrameReader()
    reader.receive_data(encode(Kind.DTMF, b"5") + b"\x10\x00")
    assert reader.next_frame() == Frame(Kind.DTMF, b"5")
    assert reader.next_frame() is None and reader.buffered == 2
    reader.receive_data(b"\x02\x01")
    assert reader.next_frame() is None  # 1 of 2 payload bytes
    reader.receive_data(b"\x00")
    assert reader.next_frame() == Frame(Kind.AUDIO, b"\x01\x00")


def test_garbage_and_oversized_frames_are_peer_errors_before_their_payload() -> None:
    reader = FrameReader()
    reader.receive_data(b"GET / HTTP/1.1\r\n")
    with pytest.raises(PeerError, match="unknown AudioSocket frame kind 0x47") as info:
        reader.next_frame()
    assert info.value.reason == "unknown_kind"
    reader = FrameReader(max_payload_bytes=640)
    reader.receive_data(bytes([Kind.AUDIO, 0x02, 0x81]))  # 641 bytes announced, none sent
    with pytest.raises(PeerError, match="641 bytes exceeds the limit of 640") as info:
        reader.next_frame()
    assert info.value.reason == "oversized"


def test_the_audio_kinds_follow_asterisks_rate_table() -> None:
    assert AUDIO_RATES[Kind.AUDIO] == 8000 and AUDIO_RATES[Kind.AUDIO_16K] == 16000
    assert [int(k) for k in AUDIO_RATES] == list(range(0x10, 0x19))


def test_a_session_reads_a_call() -> None:
    session = Session(RATES)
    events = [session.handle(frame) for frame in frames_of(b"".join(CALL), 1000)]
    assert events[0] == Identified(STREAM)
    assert isinstance(events[1], Audio) and events[1].rate == 8000
    np.testing.assert_array_equal(events[1].samples, SLIN)  # little-endian slin
    assert events[2] == KeyPressed("7") and events[4] == HungUp()
    assert session.state is State.CLOSED and session.rate == 8000


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([Frame(Kind.AUDIO, b"\x00\x00")], "audio_before_uuid"),
        ([Frame(Kind.UUID, b"short")], "bad_uuid"),
        ([Frame(Kind.UUID, STREAM.bytes), Frame(Kind.AUDIO, b"\x00")], "odd_length"),
        ([Frame(Kind.UUID, STREAM.bytes), Frame(Kind.AUDIO_48K, b"\x00\x00")], "unsupported_rate"),
        ([Frame(Kind.UUID, STREAM.bytes), Frame(Kind.AUDIO, b""), Frame(Kind.AUDIO_16K, b"")], "rate_changed"),
        ([Frame(Kind.UUID, STREAM.bytes), Frame(Kind.UUID, STREAM.bytes)], "second_uuid"),
        ([Frame(Kind.UUID, STREAM.bytes), Frame(Kind.DTMF, b"x")], "bad_dtmf"),
        ([Frame(Kind.HANGUP, b""), Frame(Kind.UUID, STREAM.bytes)], "unexpected_frame"),
    ],
)
def test_a_session_refuses_bad_input_with_a_reason(frames: list[Frame], reason: str) -> None:
    session = Session(RATES)
    with pytest.raises(PeerError) as info:
        for frame in frames:
            session.handle(frame)
    assert info.value.reason == reason and "AudioSocket" in info.value.message


def test_an_error_frame_ends_the_session_with_its_code() -> None:
    session = Session(RATES)
    session.handle(Frame(Kind.UUID, STREAM.bytes))
    assert session.handle(Frame(Kind.ERROR, b"\x02")) == PeerFailed(2)
    assert session.state is State.CLOSED


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=12), st.booleans())
def test_fuzz_any_bytes_give_frames_or_a_peer_error(chunks: list[bytes], valid_start: bool) -> None:
    reader = FrameReader(max_payload_bytes=64)
    session = Session(RATES)
    if valid_start:
        reader.receive_data(encode(Kind.UUID, STREAM.bytes))
    try:
        for chunk in chunks:
            reader.receive_data(chunk)
            while (frame := reader.next_frame()) is not None:
                assert len(frame.payload) <= 64
                session.handle(frame)
    except PeerError as error:
        assert error.reason and error.message
