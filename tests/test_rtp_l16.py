"""L16 (RFC 3551 linear PCM, big-endian): the decoder, and L16/16000 and L16/8000 legs over
real UDP loopback sockets."""

from __future__ import annotations

import asyncio
import socket
import struct

import numpy as np
import pytest

from rtp.codecs import codec, find_codec
from rtp.l16 import L16Decoder, L16Encoder
from rtp.leg import RtpLeg
from rtp.packet import RtpPacket
from rtp.ports import PortAllocator
from rtp.sink import CountingSink
from tests.test_rtp_leg import HOST, wait_for
from tests.test_rtp_wideband_dtmf import dominant_hz, tone

SSRC = 0x1616


def test_decoder_reads_what_the_encoder_writes_big_endian() -> None:
    pcm = np.array([0, 1, -1, 32767, -32768, 0x1234], dtype=np.int16)
    payload = L16Encoder().encode(pcm)
    assert payload == b"\x00\x00\x00\x01\xff\xff\x7f\xff\x80\x00\x12\x34"
    np.testing.assert_array_equal(L16Decoder().decode(payload), pcm)
    assert L16Decoder().decode(payload).dtype == np.int16


def test_decoder_ignores_an_odd_last_byte_and_reads_nothing_from_nothing() -> None:
    assert L16Decoder().decode(b"\x00\x05\x80").tolist() == [5]
    assert len(L16Decoder().decode(b"")) == 0


def test_rtpmap_names_the_rate_and_mono_only_is_taken() -> None:
    assert find_codec("l16", 16000) is codec("L16/16000")
    assert find_codec("L16", 8000) is codec("L16/8000")
    assert find_codec("L16", 16000, channels=2) is None
    assert find_codec("L16", 44100) is None


def l16_packets(pcm: np.ndarray, rate: int, payload_type: int, first_seq: int = 7) -> list[bytes]:
    """20 ms packets: rate / 50 samples, two bytes each, timestamp + rate / 50."""
    step = rate // 50
    encoder = L16Encoder()
    payloads = [encoder.encode(pcm[start : start + step]) for start in range(0, len(pcm) - step + 1, step)]
    return [
        bytes(RtpPacket(payload_type, first_seq + n, 1000 + step * n, SSRC, payload=payload))
        for n, payload in enumerate(payloads)
    ]


async def run_leg(packets: list[bytes], payload_types: dict[int, str]) -> tuple[RtpLeg, CountingSink]:
    sink = CountingSink(keep=True)
    leg = RtpLeg(sink=sink, payload_types=payload_types)
    port = PortAllocator(HOST, 40000, 60000).allocate()
    await leg.open(HOST, port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for data in packets:
            sender.sendto(data, (HOST, port))
            await asyncio.sleep(0.001)
        await wait_for(lambda: leg.stats.packets == len(packets))
    await leg.close()
    return leg, sink


def test_l16_at_16khz_reaches_the_sink_sample_for_sample() -> None:
    pcm = tone(5000, 1.0)  # above the 4 kHz band of 8 kHz codecs
    leg, sink = asyncio.run(run_leg(l16_packets(pcm, 16000, 96), {96: "L16/16000", 101: "telephone-event"}))
    np.testing.assert_array_equal(sink.pcm, pcm)
    stats = leg.stats
    assert stats.lost == 0 and stats.concealed_samples == 0 and stats.unknown_payload_packets == 0


@pytest.mark.parametrize("lost", [False, True])
def test_l16_at_8khz_is_upsampled_and_a_lost_packet_is_concealed_at_its_length(lost: bool) -> None:
    pcm = tone(700, 1.0, rate=8000)
    packets = l16_packets(pcm, 8000, 97)
    if lost:
        del packets[20]
    leg, sink = asyncio.run(run_leg(packets, {97: "l16/8000"}))
    assert sink.samples == 2 * len(pcm)
    assert abs(dominant_hz(sink.pcm, 16000) - 700) <= 2
    assert leg.stats.lost == int(lost) and leg.stats.concealed_samples == 160 * int(lost)


def test_key_presses_beside_l16_at_16khz_count_their_duration_in_its_clock() -> None:
    """RFC 4733 events go with the audio's clock: 100 ms is 1600 ticks of telephone-event/16000."""
    audio = l16_packets(tone(700, 0.2), 16000, 96)
    start = 1000 + 320 * len(audio)
    bodies = [struct.pack("!BBH", 5, (0x80 if n >= 5 else 0) | 10, 320 * min(n + 1, 5)) for n in range(8)]
    events = [bytes(RtpPacket(102, 7 + len(audio) + n, start, SSRC, payload=body)) for n, body in enumerate(bodies)]
    leg, sink = asyncio.run(run_leg(audio + events, {96: "L16/16000", 102: "telephone-event/16000"}))
    assert [(press.key, press.duration_ms) for press in sink.presses] == [("5", 100)]
    assert leg.stats.lost == 0 and leg.stats.telephone_event_packets == 8
