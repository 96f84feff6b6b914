import asyncio
import socket
import struct
import time
from collections.abc import Callable

import numpy as np
import pytest

from rtp import g711
from rtp.leg import RtpLeg
from rtp.packet import RtpPacket
from rtp.ports import PortAllocator, PortsExhausted
from rtp.sink import CountingSink

HOST = "127.0.0.1"
PAYLOAD_TYPES = {0: "PCMU", 8: "PCMA", 101: "telephone-event", 13: "CN"}


def tone_packets(codec: str, *, seconds: float = 1.0, hz: float = 440.0, ssrc: int = 0x5EED) -> list[bytes]:
    samples = (np.sin(2 * np.pi * hz * np.arange(int(8000 * seconds)) / 8000) * 10000).astype(np.int16)
    payload_type = 0 if codec == "PCMU" else 8
    return [
        bytes(
            RtpPacket(
                payload_type=payload_type,
                sequence_number=(65520 + n) & 0xFFFF,
                timestamp=(0xFFFFF000 + 160 * n) & 0xFFFFFFFF,
                ssrc=ssrc,
                marker=n == 0,
                payload=g711.encode(codec, samples[160 * n : 160 * (n + 1)]),
            )
        )
        for n in range(len(samples) // 160)
    ]


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def open_leg(**kwargs: object) -> tuple[RtpLeg, CountingSink, int]:
    sink = CountingSink(keep=True)
    leg = RtpLeg(sink=sink, payload_types=PAYLOAD_TYPES, **kwargs)  # type: ignore[arg-type]
    allocator = PortAllocator(HOST, 40000, 60000)
    port = allocator.allocate()
    await leg.open(HOST, port)
    return leg, sink, port


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
def test_tone_over_udp_loopback(codec: str) -> None:
    async def scenario() -> None:
        leg, sink, port = await open_leg()
        packets = tone_packets(codec)
        packets[10], packets[11] = packets[11], packets[10]
        del packets[30]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for data in packets:
                sender.sendto(data, (HOST, port))
                await asyncio.sleep(0.002)
            await wait_for(lambda: leg.stats.packets == 49)
        stats = await leg.close()
        assert sink.finished == 1
        assert stats.packets == 49
        assert stats.lost == 1
        assert stats.reordered == 1
        assert stats.late == stats.duplicate == stats.bad_packets == 0
        assert stats.samples_out == sink.samples == 16000
        pcm = sink.pcm
        spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
        assert abs(int(np.argmax(spectrum)) - 440) <= 1
        assert stats.first_packet_time is not None and stats.last_packet_time is not None
        assert stats.as_dict()["lost"] == 1

    asyncio.run(scenario())


def test_inactivity_timeout_and_hold() -> None:
    async def scenario() -> None:
        ended: list[str] = []
        leg, sink, port = await open_leg(inactivity_timeout_s=0.3, on_end=ended.append)
        leg.set_hold(True)
        await asyncio.sleep(0.5)
        assert ended == []
        leg.set_hold(False)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(tone_packets("PCMU")[0], (HOST, port))
        await wait_for(lambda: leg.stats.packets == 1)
        await asyncio.sleep(0.15)
        assert ended == []
        await wait_for(lambda: bool(ended), timeout=2.0)
        await asyncio.sleep(0.4)
        assert ended == ["rtp-timeout"]
        await leg.close()
        await leg.close()
        assert sink.finished == 1

    asyncio.run(scenario())


def test_rtcp_bye_ends_the_leg() -> None:
    async def scenario() -> None:
        ended: list[str] = []
        leg, _, port = await open_leg(on_end=ended.append)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(tone_packets("PCMU", ssrc=7)[0], (HOST, port))
            await wait_for(lambda: leg.stats.packets == 1)
            sender.sendto(bytes.fromhex("81cb0001") + struct.pack("!I", 99), (HOST, port + 1))
            await wait_for(lambda: leg.stats.rtcp_packets == 1)
            assert ended == []
            receiver_report = bytes.fromhex("80c9000100000007")
            sender.sendto(receiver_report + bytes.fromhex("81cb0001") + struct.pack("!I", 7), (HOST, port + 1))
            await wait_for(lambda: bool(ended))
        assert ended == ["rtcp-bye"]
        await leg.close()

    asyncio.run(scenario())


def test_source_latching_bad_packets_and_events() -> None:
    async def scenario() -> None:
        leg, sink, port = await open_leg()
        packets = tone_packets("PCMU", seconds=0.2)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as first, socket.socket(
            socket.AF_INET, socket.SOCK_DGRAM
        ) as other:
            first.sendto(b"\x00garbage", (HOST, port))
            first.sendto(packets[0], (HOST, port))
            await wait_for(lambda: leg.stats.packets == 1)
            other.sendto(packets[1], (HOST, port))
            event = RtpPacket.parse(packets[1])
            event.payload_type, event.payload = 101, bytes.fromhex("010a00a0")
            first.sendto(bytes(event), (HOST, port))
            for data in packets[2:]:
                first.sendto(data, (HOST, port))
            await wait_for(lambda: leg.stats.packets == len(packets))
            assert leg.remote == (HOST, first.getsockname()[1])
        stats = await leg.close()
        assert stats.bad_packets == 1
        assert stats.foreign_packets == 1
        assert stats.telephone_event_packets == 1
        assert stats.lost == 0
        assert sink.samples == stats.samples_out

    asyncio.run(scenario())


def test_payload_type_change_and_unknown_types() -> None:
    async def scenario() -> None:
        leg, sink, _ = await open_leg()
        address = ("192.0.2.1", 4000)
        for data in tone_packets("PCMU", seconds=0.1):
            leg.handle_rtp(data, address)
        leg.set_payload_types({8: "PCMA"})
        for data in tone_packets("PCMU", seconds=0.1):
            packet = RtpPacket.parse(data)
            packet.sequence_number += 5
            packet.timestamp += 800
            leg.handle_rtp(bytes(packet), address)
        stats = await leg.close()
        assert stats.unknown_payload_packets == 5
        assert stats.lost == 0
        assert sink.samples == stats.samples_out == 1600

    asyncio.run(scenario())


def test_port_allocator() -> None:
    allocator = PortAllocator(HOST, 41001, 41006)
    assert allocator.capacity == 2
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind((HOST, 41003))
        first = allocator.allocate()
        assert first == 41004
        with pytest.raises(PortsExhausted, match="41001-41006"):
            allocator.allocate()
    allocator.release(first)
    assert allocator.allocate() == 41002
    with pytest.raises(ValueError, match="even/odd pair"):
        PortAllocator(HOST, 41001, 41002)


def test_open_reports_taken_port() -> None:
    async def scenario() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
            squatter.bind((HOST, 0))
            taken = squatter.getsockname()[1]
            leg = RtpLeg(sink=CountingSink(), payload_types=PAYLOAD_TYPES)
            with pytest.raises(OSError):
                await leg.open(HOST, taken - 1)
            await leg.close()

    asyncio.run(scenario())
