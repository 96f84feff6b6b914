"""G.722 legs (16 kHz straight to the sink, 8 kHz for a narrowband model) and RFC 4733 key
presses, over real UDP loopback sockets."""

import asyncio
import socket
import struct

import numpy as np

from rtp.dtmf import TelephoneEvents, key_name
from rtp.g722 import G722Encoder
from rtp.leg import RtpLeg
from rtp.packet import RtpPacket
from rtp.ports import PortAllocator
from rtp.sink import CountingSink
from tests.test_rtp_leg import HOST, wait_for

PAYLOAD_TYPES = {9: "G722", 101: "telephone-event"}
SSRC = 0x7A11


def tone(hz: float, seconds: float, rate: int = 16000) -> np.ndarray:
    return (np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate) * 9000).astype(np.int16)


def g722_packets(pcm16k: np.ndarray, first_seq: int = 100, first_ts: int = 8000) -> list[bytes]:
    """20 ms packets: 320 samples at 16 kHz -> 160 payload bytes, timestamp +160 (RFC 3551)."""
    encoder = G722Encoder()
    return [
        bytes(
            RtpPacket(
                payload_type=9,
                sequence_number=(first_seq + n) & 0xFFFF,
                timestamp=(first_ts + 160 * n) & 0xFFFFFFFF,
                ssrc=SSRC,
                payload=encoder.encode(pcm16k[320 * n : 320 * (n + 1)]),
            )
        )
        for n in range(len(pcm16k) // 320)
    ]


def event_packets(code: int, seq: int, timestamp: int, *, packets: int = 5, end_repeats: int = 3) -> list[bytes]:
    """One key press as a sender transmits it: growing duration, then the End packet thrice."""
    out = []
    for n in range(packets + end_repeats):
        end = n >= packets
        duration = 160 * min(n + 1, packets)
        payload = struct.pack("!BBH", code, (0x80 if end else 0) | 10, duration)
        out.append(bytes(RtpPacket(101, seq + n, timestamp, SSRC, marker=n == 0, payload=payload)))
    return out


def dominant_hz(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    return float(np.argmax(spectrum)) * rate / len(pcm)


async def run_leg(packets: list[bytes], **kwargs: object) -> tuple[RtpLeg, CountingSink]:
    sink = CountingSink(keep=True)
    leg = RtpLeg(sink=sink, payload_types=PAYLOAD_TYPES, **kwargs)  # type: ignore[arg-type]
    port = PortAllocator(HOST, 40000, 60000).allocate()
    await leg.open(HOST, port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for data in packets:
            sender.sendto(data, (HOST, port))
            await asyncio.sleep(0.001)
        await wait_for(lambda: leg.stats.packets == len(packets))
    await leg.close()
    return leg, sink


def test_g722_reaches_the_sink_at_16_khz_with_its_high_band() -> None:
    """A 5 kHz tone (above the 4 kHz G.711 band) survives: no 8 kHz step on the way."""
    seconds = 1.0
    _, sink = asyncio.run(run_leg(g722_packets(tone(5000, seconds))))
    assert sink.samples == int(16000 * seconds)
    assert abs(dominant_hz(sink.pcm, 16000) - 5000) <= 2
    assert np.abs(sink.pcm[400:]).max() > 5000


def test_g722_for_an_8_khz_model_is_resampled_down() -> None:
    _, sink = asyncio.run(run_leg(g722_packets(tone(1000, 1.0)), resampler="none"))
    assert abs(sink.samples - 8000) <= 1
    assert abs(dominant_hz(sink.pcm, 8000) - 1000) <= 2


def test_g722_loss_is_concealed_and_timing_kept() -> None:
    packets = g722_packets(tone(700, 1.0))
    del packets[20]
    packets[30], packets[31] = packets[31], packets[30]
    leg, sink = asyncio.run(run_leg(packets))
    assert leg.stats.lost == 1 and leg.stats.reordered == 1
    assert sink.samples == 16000  # the lost 20 ms repeated, at 16 kHz


def test_key_presses_are_counted_published_and_never_audio() -> None:
    pcm = tone(600, 1.0)
    audio = g722_packets(pcm[:8000])  # 0.5 s of speech band, then keys, then audio again
    keys = event_packets(1, 125, 8000 + 160 * 25) + event_packets(11, 133, 8000 + 160 * 32)
    rest = g722_packets(pcm[8000:], first_seq=141, first_ts=8000 + 160 * 40)
    leg, sink = asyncio.run(run_leg(audio + keys + rest))
    stats = leg.stats
    assert stats.telephone_event_packets == 16
    assert stats.dtmf_events == 2
    assert stats.unknown_payload_packets == 0
    assert [(p.key, p.duration_ms) for p in sink.presses] == [("1", 100), ("#", 100)]
    # the key press span is silence in the audio, not decoded event payloads
    keyspan = sink.pcm[25 * 320 + 200 : 40 * 320 - 200]
    assert np.abs(keyspan).max() == 0


def test_lost_end_packets_still_give_one_press_each() -> None:
    events = TelephoneEvents()
    first = event_packets(5, 1, 1000, end_repeats=0)
    second = event_packets(10, 10, 3000, packets=2, end_repeats=1)
    presses = [press for data in first + second for press in events.feed(SSRC, *_ts_payload(data))]
    assert [p.key for p in presses] == ["5", "*"]
    assert presses[0].duration_ms == 100
    assert events.flush() is None
    third = event_packets(12, 20, 5000, packets=3, end_repeats=0)
    assert [p for data in third for p in events.feed(SSRC, *_ts_payload(data))] == []
    last = events.flush()
    assert last is not None and last.key == "A"
    assert events.feed(SSRC, 1, b"\x01") == [] and events.bad_payloads == 1
    assert [key_name(code) for code in (0, 9, 10, 11, 15, 16, 40)] == ["0", "9", "*", "#", "D", "flash", "event-40"]


def _ts_payload(data: bytes) -> tuple[int, bytes]:
    packet = RtpPacket.parse(data)
    return packet.timestamp, packet.payload
