import asyncio
import random
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


@pytest.mark.parametrize("poll_interval_ms", [0, 20])
@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
def test_tone_over_udp_loopback(codec: str, poll_interval_ms: float) -> None:
    """Timer-driven (20 ms) and readiness-driven (0) socket reading give the same result."""

    async def scenario() -> None:
        leg, sink, port = await open_leg(poll_interval_ms=poll_interval_ms)
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
        await asyncio.sleep(0.5)  # past the 0.3 s timeout: a window in which a held leg must not end
        assert ended == []
        leg.set_hold(False)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(tone_packets("PCMU")[0], (HOST, port))
        await wait_for(lambda: leg.stats.packets == 1)
        await asyncio.sleep(0.15)  # within the timeout after a packet: a window in which it must not end
        assert ended == []
        await wait_for(lambda: bool(ended), timeout=2.0)
        await asyncio.sleep(0.4)  # a window in which it must not end a second time
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
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as first,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other,
        ):
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


def _free_udp_run(length: int) -> int:
    """An even port starting ``length`` UDP ports free on HOST just now (other tests and other
    programs on this machine bind ports too, so a fixed range can be taken)."""
    for _ in range(200):
        base = random.randrange(20_000, 60_000, 2)
        taken: list[socket.socket] = []
        try:
            for port in range(base, base + length):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                taken.append(sock)
                sock.bind((HOST, port))
        except OSError:
            continue
        else:
            return base
        finally:
            for sock in taken:
                sock.close()
    raise RuntimeError(f"no run of {length} free UDP ports found on {HOST}")


def test_port_allocator() -> None:
    base = _free_udp_run(7)
    low, high = base + 1, base + 6  # pairs (base+2, base+3) and (base+4, base+5)
    allocator = PortAllocator(HOST, low, high)
    assert allocator.capacity == 2
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind((HOST, base + 3))
        first = allocator.allocate()
        assert first == base + 4
        with pytest.raises(PortsExhausted, match=f"{low}-{high}"):
            allocator.allocate()
    allocator.release(first)
    assert allocator.allocate() == base + 2
    with pytest.raises(ValueError, match="even/odd pair"):
        PortAllocator(HOST, low, low + 1)


def test_open_resolves_a_host_name() -> None:
    """A media host given by name (not an IP literal) is resolved before binding."""

    async def scenario() -> None:
        leg, _, port = await open_leg_on("localhost")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(tone_packets("PCMU")[0], (HOST, port))
            await wait_for(lambda: leg.stats.packets == 1)
        stats = await leg.close()
        assert leg.local_port is None
        assert stats.packets == 1

    asyncio.run(scenario())


async def open_leg_on(host: str) -> tuple[RtpLeg, CountingSink, int]:
    sink = CountingSink()
    leg = RtpLeg(sink=sink, payload_types=PAYLOAD_TYPES)
    await leg.open(host, 0)
    assert leg.local_port is not None
    return leg, sink, leg.local_port


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


def test_sdp_address_is_accepted_and_strangers_after_it_are_dropped() -> None:
    async def scenario() -> None:
        leg, sink, port = await open_leg()
        packets = tone_packets("PCMU", seconds=0.2)
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger,
        ):
            peer.bind((HOST, 0))
            peer_address = (HOST, peer.getsockname()[1])
            leg.set_expected_remote(peer_address)
            peer.sendto(packets[0], (HOST, port))
            await wait_for(lambda: leg.stats.packets == 1)
            assert leg.remote == peer_address
            for data in packets[1:3]:
                stranger.sendto(data, (HOST, port))
            for data in packets[1:]:
                peer.sendto(data, (HOST, port))
            await wait_for(lambda: leg.stats.packets == len(packets))
            await wait_for(lambda: leg.stats.foreign_packets == 2)
        stats = await leg.close()
        assert leg.remote == peer_address
        assert stats.lost == stats.duplicate == 0
        assert sink.samples == stats.samples_out > 0

    asyncio.run(scenario())


def test_latch_first_takes_a_nat_source_until_the_sdp_address_sends() -> None:
    """`latch: first`, the NAT case: the peer's packets come from an address its SDP does not
    name. The first source is latched while nothing has come from the SDP address; the SDP
    address takes over (so a stranger sending first would own the call: the mode's risk)."""

    async def scenario() -> None:
        sdp_address, nat_address, stranger = ("192.0.2.10", 4000), ("198.51.100.7", 61000), ("203.0.113.9", 5000)
        leg, _, _ = await open_leg(expected_remote=sdp_address, latch="first")
        packets = tone_packets("PCMU", seconds=0.2)
        leg.handle_rtp(b"\x00garbage", stranger)
        assert leg.remote is None
        for data in packets[:4]:
            leg.handle_rtp(data, nat_address)
        assert leg.remote == nat_address
        leg.handle_rtp(packets[4], stranger)
        assert leg.stats.foreign_packets == 1
        for data in packets[4:7]:
            leg.handle_rtp(data, sdp_address)
        assert leg.remote == sdp_address
        for data in packets[7:]:
            leg.handle_rtp(data, nat_address)
        stats = await leg.close()
        assert stats.packets == 7
        assert stats.foreign_packets == 1 + len(packets) - 7
        assert stats.bad_packets == 1

    asyncio.run(scenario())


def test_expected_remote_changes() -> None:
    async def scenario() -> None:
        first, moved = ("192.0.2.10", 4000), ("192.0.2.20", 4100)
        leg, _, _ = await open_leg(expected_remote=first)
        packets = tone_packets("PCMU", seconds=0.1)
        leg.handle_rtp(packets[0], first)
        leg.set_expected_remote(("0.0.0.0", 4000))
        leg.set_expected_remote(None)
        leg.set_expected_remote(first)
        assert (leg.expected_remote, leg.remote) == (first, first)
        leg.set_expected_remote(moved)
        assert (leg.expected_remote, leg.remote) == (moved, None)
        leg.handle_rtp(packets[1], moved)
        leg.handle_rtp(packets[2], first)
        assert leg.remote == moved
        assert (leg.stats.packets, leg.stats.foreign_packets) == (2, 1)
        leg.set_expected_remote(("2001:db8:0::1", 4000))
        assert leg.expected_remote == ("2001:db8::1", 4000)
        with pytest.raises(ValueError, match="70000 is outside 0-65535"):
            leg.set_expected_remote(("192.0.2.10", 70000))
        await leg.close()

    asyncio.run(scenario())


class RecordingUpsampler:
    """Stands in for the leg's resampler stream: keeps the 8 kHz pieces it is given, so the
    test compares what each path submitted, piece by piece."""

    def __init__(self) -> None:
        self.pieces: list[np.ndarray] = []

    def submit(self, samples: np.ndarray) -> None:
        self.pieces.append(samples.copy())

    def submit_g711(self, data: bytes, table: np.ndarray) -> None:
        self.pieces.append(table.take(np.frombuffer(data, dtype=np.uint8)))

    def flush(self) -> None:
        pass


def test_in_order_fast_path_plays_what_the_frame_path_plays() -> None:
    """The leg's fast path (`ReorderBuffer.push_in_order`, payload queued as bytes) and the
    general frame path give the same decoded audio, in the same resampler calls, and the same
    counters on a link with loss, reordering, duplicates and a talkspurt gap."""

    async def scenario() -> None:
        packets = tone_packets("PCMA", seconds=1.0)
        order = list(range(50))
        order[10], order[11] = order[11], order[10]
        del order[20]
        del order[30:32]
        order.insert(40, 39)
        arrivals = [packets[n] for n in order]
        gap = RtpPacket.parse(arrivals[-1])
        gap.timestamp += 800
        arrivals[-1] = bytes(gap)
        address = ("192.0.2.1", 4000)
        results = []
        for fast in (True, False):
            leg, _, _ = await open_leg()
            upsampler = leg._audio._upsampler = RecordingUpsampler()  # type: ignore[assignment]
            if not fast:
                leg._buffer.push_in_order = lambda *args: False  # type: ignore[method-assign]
            for data in arrivals:
                leg.handle_rtp(data, address)
            stats = await leg.close()
            results.append((upsampler.pieces, stats.lost, stats.reordered, stats.duplicate, stats.concealed_samples))
        (fast_pieces, *fast_counts), (slow_pieces, *slow_counts) = results
        assert fast_counts == slow_counts
        assert fast_counts[:3] == [3, 1, 1]
        assert [len(piece) for piece in fast_pieces] == [len(piece) for piece in slow_pieces]
        np.testing.assert_array_equal(np.concatenate(fast_pieces), np.concatenate(slow_pieces))
        assert len(np.concatenate(fast_pieces)) == 50 * 160 + 800

    asyncio.run(scenario())


# The source policy (`rtp.latch`) over real sockets: the peer on HOST, a stranger on another
# loopback address (Linux routes all of 127.0.0.0/8 to lo).
STRANGER_HOST = "127.0.0.2"
SILENCE_PCMU = b"\xff" * 160  # decodes to 0


def silent_packet(seq: int, ssrc: int = 0x5EED) -> bytes:
    return bytes(RtpPacket(payload_type=0, sequence_number=seq, timestamp=160 * seq, ssrc=ssrc, payload=SILENCE_PCMU))


def loud_packet(seq: int, ssrc: int = 0x5EED) -> bytes:
    """A packet of full-scale tone: any of it in the output shows."""
    samples = (np.sin(np.arange(160) * 0.3) * 20000).astype(np.int16)
    payload = g711.encode("PCMU", samples)
    return bytes(RtpPacket(payload_type=0, sequence_number=seq, timestamp=160 * seq, ssrc=ssrc, payload=payload))


async def stranger_before_and_during_the_call(*, fast: bool, nat: bool) -> tuple[RtpLeg, CountingSink, int]:
    """A stranger sends speech before the peer's first packet and then, spoofing the peer's
    sequence numbers and SSRC, between its packets; the peer sends silence. With `nat` the peer
    sends from another port than its SDP names. Returns the closed leg, its sink and how many
    datagrams the stranger sent."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger,
    ):
        peer.bind((HOST, 0))
        stranger.bind((STRANGER_HOST, 0))
        peer_port = peer.getsockname()[1]
        sdp_port = peer_port + 2 if nat else peer_port
        leg, sink, port = await open_leg(expected_remote=(HOST, sdp_port), fast_path=fast, poll_interval_ms=0)
        sent_by_stranger = 0
        for seq in range(10):
            stranger.sendto(loud_packet(seq, ssrc=0xBAD), (HOST, port))
            sent_by_stranger += 1
        await asyncio.sleep(0.02)  # pacing: the stranger's datagrams come before the peer's first
        for seq in range(50):
            peer.sendto(silent_packet(seq), (HOST, port))
            if seq % 5 == 0:
                stranger.sendto(loud_packet(seq + 1), (HOST, port))
                sent_by_stranger += 1
            await asyncio.sleep(0.001)
        await wait_for(lambda: leg.stats.packets == 50 and leg.stats.foreign_packets == sent_by_stranger)
        assert leg.remote == (HOST, peer_port)
        if fast:
            assert leg._fast.armed  # the stranger's datagrams were dropped in C, without disarming
    await leg.close()
    return leg, sink, sent_by_stranger


@pytest.mark.parametrize("nat", [False, True], ids=["sdp-port", "nat-port"])
def test_stranger_audio_never_reaches_the_sink(nat: bool) -> None:
    """`latch: address` (default), Python receive path; `tests/test_rtp_fastpath.py` runs the
    same with the C path."""

    async def scenario() -> None:
        leg, sink, sent = await stranger_before_and_during_the_call(fast=False, nat=nat)
        stats = leg.stats
        assert (stats.foreign_address, stats.foreign_port, stats.bad_packets) == (sent, 0, 0)
        assert stats.samples_out == len(sink.pcm) == 50 * 320
        assert not sink.pcm.any()

    asyncio.run(scenario())


def test_strict_drops_another_port_and_address_relatches_only_on_a_restarted_stream() -> None:
    async def scenario() -> None:
        sdp_address, other_port = ("192.0.2.10", 4000), ("192.0.2.10", 4100)
        strict, _, _ = await open_leg(expected_remote=sdp_address, latch="strict", fast_path=False)
        strict.handle_rtp(silent_packet(0), other_port)
        strict.handle_rtp(silent_packet(1), ("198.51.100.7", 4000))
        strict.handle_rtp(silent_packet(2), sdp_address)
        stats = await strict.close()
        assert (stats.packets, stats.foreign_port, stats.foreign_address, strict.remote) == (1, 1, 1, sdp_address)

        loose, sink, _ = await open_leg(expected_remote=sdp_address, fast_path=False)
        loose.handle_rtp(silent_packet(0), other_port)  # NAT: the signalled IP, another port
        assert loose.remote == other_port
        loose.handle_rtp(loud_packet(1), sdp_address)  # same SSRC from a third port: refused
        assert (loose.remote, loose.stats.foreign_port) == (other_port, 1)
        loose.handle_rtp(silent_packet(100, ssrc=0xD00D), sdp_address)  # a new SSRC, latched one talking
        assert (loose.remote, loose.stats.foreign_port) == (other_port, 2)
        await asyncio.sleep(0.25)  # the latched source falls silent past rtp.latch.RELATCH_SILENCE_S (0.2 s)
        for seq in (100, 101, 102):  # the peer restarted its stream: the third packet re-latches
            loose.handle_rtp(silent_packet(seq, ssrc=0xD00D), sdp_address)
        assert loose.remote == sdp_address
        loose.handle_rtp(loud_packet(101, ssrc=0xD00D), other_port)  # the new SSRC elsewhere: refused
        stats = await loose.close()
        assert (stats.packets, stats.foreign_port, stats.ssrc_changes) == (2, 5, 1)
        assert not sink.pcm.any()

    asyncio.run(scenario())


def test_latch_before_the_answer_is_released_when_the_address_arrives() -> None:
    """Delayed offer: the leg opens before the peer's address is known and acts like `first`;
    the answer's address releases a latch the policy refuses."""

    async def scenario() -> None:
        leg, _, _ = await open_leg(fast_path=False)
        stranger, peer = ("203.0.113.9", 5000), ("192.0.2.10", 4000)
        leg.handle_rtp(loud_packet(0, ssrc=0xBAD), stranger)
        assert leg.remote == stranger
        leg.set_expected_remote(peer)
        assert leg.remote is None
        leg.handle_rtp(loud_packet(1, ssrc=0xBAD), stranger)
        leg.handle_rtp(silent_packet(0), peer)
        assert (leg.remote, leg.stats.foreign_address, leg.stats.packets) == (peer, 1, 2)
        leg.set_latch("strict")
        assert leg.latch == "strict" and leg.remote == peer
        with pytest.raises(ValueError, match="sometimes"):
            leg.set_latch("sometimes")
        await leg.close()

    asyncio.run(scenario())
