"""Random and mutated RTP/RTCP datagrams: parsers raise only ValueError, leg handlers never raise.

The seeds include G.722 and RFC 4733 telephone-event packets (keys, a hook flash, unknown
events, several event blocks, cut-short payloads): key presses stay well-formed and never audio.
"""

import asyncio
import contextlib
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rtp import g711
from rtp.dtmf import TelephoneEvents, key_name
from rtp.g722 import G722Encoder
from rtp.l16 import L16Encoder
from rtp.leg import RtpLeg
from rtp.packet import RtpPacket, parse_rtcp
from rtp.sink import CountingSink

MUTATED_DATAGRAMS = 100_000
PAYLOAD_TYPES = {0: "PCMU", 8: "PCMA", 9: "G722", 96: "L16/16000", 97: "L16/8000", 101: "telephone-event", 13: "CN"}
KEY_NAMES = {key_name(code) for code in range(256)}
ADDRESSES = [("127.0.0.1", 5000), ("127.0.0.1", 5002), ("10.0.0.9", 5000)]


class CheckingSink(CountingSink):
    def accept_waveform(self, samples: np.ndarray) -> None:
        assert samples.dtype == np.int16 and samples.ndim == 1
        super().accept_waveform(samples)


def telephone_event(code: int, flags: int, duration: int, *, timestamp: int = 8000, extra: bytes = b"") -> bytes:
    """An RFC 4733 packet: event code, E bit and volume, duration; ``extra``: more event blocks."""
    payload = bytes([code, flags]) + duration.to_bytes(2, "big") + extra
    return bytes(RtpPacket(payload_type=101, sequence_number=9, timestamp=timestamp, ssrc=5, payload=payload))


def seeds(rng: random.Random) -> list[bytes]:
    payload = g711.encode_ulaw((np.sin(np.arange(160) / 3) * 8000).astype(np.int16))
    wideband = G722Encoder().encode((np.sin(np.arange(320) / 5) * 8000).astype(np.int16))
    linear = L16Encoder().encode((np.sin(np.arange(320) / 5) * 8000).astype(np.int16))
    return [
        bytes(RtpPacket(payload_type=96, sequence_number=3, timestamp=1, ssrc=5, payload=linear)),
        bytes(RtpPacket(payload_type=97, sequence_number=4, timestamp=1, ssrc=5, payload=linear[:161])),  # odd
        bytes(RtpPacket(payload_type=9, sequence_number=7, timestamp=1, ssrc=5, payload=wideband)),
        telephone_event(1, 0x0A, 160),
        telephone_event(1, 0x8A, 800),  # its End packet
        telephone_event(16, 0x80, 0, timestamp=9600),  # a hook flash of no duration
        telephone_event(200, 0xBF, 0xFFFF, timestamp=0xFFFFFFFF),  # an unknown event, longest duration
        telephone_event(11, 0x0A, 320, extra=bytes.fromhex("0b8a0140")),  # two event blocks in one payload
        telephone_event(5, 0x0A, 160)[:14],  # cut short
        bytes(RtpPacket(payload_type=0, sequence_number=65535, timestamp=1, ssrc=5, payload=payload)),
        bytes(RtpPacket(payload_type=8, sequence_number=1, ssrc=5, marker=True, csrc=[1, 2], payload=payload)),
        bytes(RtpPacket(payload_type=0, ssrc=5, extension_profile=0xBEDE, extension_data=b"\x10\x01\x00\x00")),
        bytes(RtpPacket(payload_type=13, ssrc=5, payload=b"\x40", padding=b"\x00\x00\x03")),
        bytes(RtpPacket(payload_type=101, ssrc=5, payload=bytes.fromhex("010a00a0"))),
        bytes.fromhex("80c9000100000005") + bytes.fromhex("81cb000100000005"),
        bytes.fromhex("80c8000600000005") + bytes(rng.randrange(256) for _ in range(20)),
    ]


def mutate(data: bytes, rng: random.Random) -> bytes:
    buffer = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(6)
        if choice == 0 and buffer:
            position = rng.randrange(len(buffer))
            buffer[position] ^= 1 << rng.randrange(8)
        elif choice == 1:
            del buffer[rng.randrange(len(buffer) + 1) :]
        elif choice == 2:
            position = rng.randrange(len(buffer) + 1)
            buffer[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif choice == 3 and len(buffer) >= 4:
            buffer[2:4] = rng.randrange(65536).to_bytes(2, "big")
        elif choice == 4 and len(buffer) >= 12:
            buffer[8:12] = rng.choice([5, 6, rng.randrange(1 << 32)]).to_bytes(4, "big")
        elif buffer:
            buffer[rng.randrange(len(buffer))] = rng.randrange(256)
    return bytes(buffer)


def test_mutation_loop() -> None:
    rng = random.Random(20240611)
    corpus = seeds(rng)
    sink = CheckingSink()
    leg = RtpLeg(sink=sink, payload_types=PAYLOAD_TYPES, inactivity_timeout_s=1.0)
    parsed = 0
    for _ in range(MUTATED_DATAGRAMS):
        data = mutate(rng.choice(corpus), rng) if rng.random() < 0.9 else rng.randbytes(rng.randrange(40))
        try:
            RtpPacket.parse(data)
            parsed += 1
        except ValueError:
            pass
        with contextlib.suppress(ValueError):
            parse_rtcp(data)
        address = ADDRESSES[0] if rng.random() < 0.95 else rng.choice(ADDRESSES)
        if rng.random() < 0.8:
            leg.handle_rtp(data, address)
        else:
            leg.handle_rtcp(data, address)
    stats = asyncio.run(leg.close())
    assert parsed > MUTATED_DATAGRAMS // 4
    assert stats.packets > 0 and stats.bad_packets > 0
    assert sink.finished == 1
    assert stats.samples_out == sink.samples
    assert stats.telephone_event_packets > 0 and stats.dtmf_events == len(sink.presses) > 0
    assert all(press.key in KEY_NAMES and 0 <= press.duration_ms <= 0xFFFF * 1000 // 8000 for press in sink.presses)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_arbitrary_datagrams(datagrams: list[bytes]) -> None:
    leg = RtpLeg(sink=CheckingSink(), payload_types=PAYLOAD_TYPES)
    for data in datagrams:
        for parser in (RtpPacket.parse, parse_rtcp):
            with contextlib.suppress(ValueError):
                parser(data)
        leg.handle_rtp(b"\x80" + data, ADDRESSES[0])
        leg.handle_rtcp(data, ADDRESSES[0])
    asyncio.run(leg.close())


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([5, 6]), st.sampled_from([0, 160, 8000, 0xFFFFFFFF]), st.binary(max_size=12)),
        max_size=30,
    )
)
def test_telephone_event_payloads(packets: list[tuple[int, int, bytes]]) -> None:
    """Any run of telephone-event payloads gives at most one press per (SSRC, timestamp) event,
    each with a known key name and a duration the 16-bit field allows; short ones are counted."""
    events = TelephoneEvents()
    presses = [press for ssrc, timestamp, payload in packets for press in events.feed(ssrc, timestamp, payload)]
    last = events.flush()
    presses += [last] if last is not None else []
    assert events.presses == len(presses)
    assert events.bad_payloads == sum(1 for _, _, payload in packets if len(payload) < 4)
    assert len(presses) <= len(packets) - events.bad_payloads
    assert all(p.key in KEY_NAMES and 0 <= p.duration_ms <= 0xFFFF * 1000 // 8000 for p in presses)
