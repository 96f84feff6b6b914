"""The C receive path (`rtp._fastrtp`) against the Python one, over real loopback sockets.

Two legs receive the same datagrams, one reading them through the C receiver and one in
Python; they must hand the same PCM to their sinks and count the same. The sequence leaves
the in-order stream in every way a leg must notice (loss, reordering, a duplicate, RTCP on the
RTP port, comfort noise, a codec change, a new SSRC, another source), each followed by an
in-order run long enough for the C path to take packets again.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import socket
import time

import numpy as np
import pytest

from rtp import g711
from rtp.leg import RtpLeg
from rtp.packet import RtpPacket
from rtp.poller import FastReceiver
from rtp.sink import CountingSink
from rtp.stats import LegStats
from tests.test_rtp_fuzz import mutate
from tests.test_rtp_leg import (
    HOST,
    PAYLOAD_TYPES,
    loud_packet,
    open_leg,
    silent_packet,
    stranger_before_and_during_the_call,
    wait_for,
)

pytestmark = pytest.mark.skipif(FastReceiver is None, reason="rtp._fastrtp (the C receive path) is not built")

RTCP_RECEIVER_REPORT = bytes([0x80, 201, 0, 1]) + (0x1234).to_bytes(4, "big")


def test_the_extension_is_built_where_a_compiler_exists() -> None:
    """`pip install -e .` builds it as an optional extension; where gcc exists it must be there."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler here")
    assert FastReceiver is not None


def packet(seq: int, *, codec: str = "PCMU", ssrc: int = 0xCAFE, level: int = 3000, marker: bool = False) -> bytes:
    samples = (np.sin(np.arange(160) * (0.2 + seq % 7 * 0.05)) * level).astype(np.int16)
    return bytes(
        RtpPacket(
            payload_type=0 if codec == "PCMU" else 8,
            sequence_number=seq & 0xFFFF,
            timestamp=(1000 + 160 * seq) & 0xFFFFFFFF,
            ssrc=ssrc,
            marker=marker,
            payload=g711.encode(codec, samples),
        )
    )


def comfort_noise(seq: int, ssrc: int = 0xCAFE) -> bytes:
    header = RtpPacket(payload_type=13, sequence_number=seq, timestamp=1000 + 160 * seq, ssrc=ssrc, payload=b"\x40")
    return bytes(header)


def scripted_traffic() -> list[tuple[str, bytes]]:
    """(sender, datagram) in sending order; sender "main" or "foreign"."""
    run = [("main", packet(n, marker=n == 0)) for n in range(0, 40)]
    run.append(("main", packet(41)))  # 40 lost
    run += [("main", packet(n)) for n in range(42, 60)]
    run += [("main", packet(61)), ("main", packet(60))]  # reordered
    run += [("main", packet(n)) for n in range(62, 80)]
    run.append(("main", packet(79)))  # duplicate
    run.append(("main", RTCP_RECEIVER_REPORT))  # RTCP multiplexed on the RTP port
    run += [("main", b""), ("main", bytes(20)), ("main", b"\x12" * 300)]  # not RTP: bad packets
    run += [("main", packet(n)) for n in range(80, 100)]
    run.append(("main", comfort_noise(100)))
    run += [("main", packet(n, codec="PCMA")) for n in range(101, 130)]  # codec change
    run.append(("foreign", packet(130)))  # another source: dropped, counted
    run += [("main", packet(n, codec="PCMA")) for n in range(130, 150)]
    run += [("main", packet(n, ssrc=0xBEEF)) for n in range(500, 540)]  # new SSRC
    return run


async def receive(traffic: list[tuple[str, bytes]], *, fast: bool) -> tuple[RtpLeg, CountingSink, list[int]]:
    """Send `traffic` to a new leg; also returns the sizes of the batches the C path handed it."""
    leg, sink, port = await open_leg(fast_path=fast, poll_interval_ms=0)
    batches: list[int] = []
    fast_batch = leg.fast_batch

    def counting_fast_batch(payloads: bytes) -> None:
        batches.append(len(payloads))
        fast_batch(payloads)

    leg.fast_batch = counting_fast_batch  # type: ignore[method-assign]
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as main,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as foreign,
    ):
        main.bind((HOST, 0))
        foreign.bind((HOST, 0))
        senders = {"main": main, "foreign": foreign}
        for index, (sender, data) in enumerate(traffic):
            senders[sender].sendto(data, (HOST, port))
            if index % 8 == 7:
                await asyncio.sleep(0.003)
        # every datagram counted once: RTP, RTCP, not RTP, or from a refused source
        await wait_for(
            lambda: (
                leg.stats.packets + leg.stats.rtcp_packets + leg.stats.bad_packets + leg.stats.foreign_packets
                == len(traffic)
            )
        )
    return leg, sink, batches


COMPARED = (
    "packets", "bytes", "lost", "late", "duplicate", "reordered", "ssrc_changes", "bad_packets", "samples_out",
    "foreign_packets", "sequence_resets", "comfort_noise_packets", "unknown_payload_packets", "concealed_samples",
    "rtcp_packets",
)  # fmt: skip


def test_c_path_plays_and_counts_what_the_python_path_does() -> None:
    traffic = scripted_traffic()

    async def scenario() -> None:
        results = []
        for fast in (True, False):
            leg, sink, batches = await receive(traffic, fast=fast)
            stats = await leg.close()
            results.append((batches, sink, stats))
        (c_batches, c_sink, c_stats), (py_batches, py_sink, py_stats) = results
        # Most of the 211 packets went through C, in batches of at most 4 payloads (640 bytes).
        assert sum(c_batches) >= 150 * 160 and max(c_batches) <= 640
        assert py_batches == []
        for name in COMPARED:
            assert getattr(c_stats, name) == getattr(py_stats, name), name
        assert c_stats.lost == 1 and c_stats.reordered == 1 and c_stats.duplicate == 1
        assert c_stats.foreign_packets == 1 and c_stats.ssrc_changes == 1 and c_stats.rtcp_packets == 1
        assert c_stats.bad_packets == 3
        assert c_sink.finished == py_sink.finished == 1
        np.testing.assert_array_equal(c_sink.pcm, py_sink.pcm)
        assert c_stats.samples_out == len(c_sink.pcm) > 0

    asyncio.run(scenario())


def test_ipv6_source_is_taken_in_c() -> None:
    async def scenario() -> None:
        try:
            probe = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            probe.bind(("::1", 0))
            probe.close()
        except OSError:
            pytest.skip("no IPv6 loopback here")
        sink = CountingSink()
        leg = RtpLeg(sink=sink, payload_types=PAYLOAD_TYPES, poll_interval_ms=0)
        await leg.open("::1", 0)
        port = leg.local_port
        assert port is not None
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sender:
            for n in range(20):
                sender.sendto(packet(n), ("::1", port))
                await asyncio.sleep(0.001)
            await wait_for(lambda: leg.stats.packets == 20)
            assert leg._fast.armed
        stats = await leg.close()
        assert stats.samples_out == sink.samples == 20 * 320
        assert stats.lost == stats.bad_packets == 0

    asyncio.run(scenario())


def test_counters_are_current_while_the_c_path_takes_packets() -> None:
    async def scenario() -> None:
        leg, sink, port = await open_leg(poll_interval_ms=0)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for n in range(30):
                sender.sendto(packet(n), (HOST, port))
                await asyncio.sleep(0.001)
            await wait_for(lambda: leg.stats.packets == 30)
            assert leg._fast.armed  # the in-order packets after the first went through C
            stats = leg.stats
            assert stats.bytes == 30 * 172
            assert stats.last_packet_time is not None and stats.last_packet_time <= time.monotonic()
            # 28 payloads are whole batches (7 x 4 packets); the last 2 wait in C and come out at close.
            assert sink.samples == 28 * 320 - 2 * 20
        stats = await leg.close()
        assert stats.samples_out == sink.samples == 30 * 320
        assert sink.finished == 1

    asyncio.run(scenario())


def test_inactivity_timeout_sees_packets_taken_in_c() -> None:
    """Packets taken in C keep the leg alive; the timeout fires only after they stop."""

    async def scenario() -> None:
        ended: list[tuple[str, float]] = []
        leg, _, port = await open_leg(
            poll_interval_ms=0, inactivity_timeout_s=0.3, on_end=lambda reason: ended.append((reason, time.monotonic()))
        )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for n in range(40):  # 0.8 s of packets, longer than the timeout
                sender.sendto(packet(n), (HOST, port))
                await asyncio.sleep(0.02)
            last_sent = time.monotonic()
            assert not ended
            await wait_for(lambda: bool(ended), timeout=3.0)
        (reason, when), *_ = ended
        assert reason == "rtp-timeout"
        assert when - last_sent >= 0.25
        assert leg.stats.packets == 40
        await leg.close()

    asyncio.run(scenario())


def test_a_failing_leg_does_not_cost_the_others_their_packets(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        broken, _, broken_port = await open_leg(poll_interval_ms=20)
        healthy, sink, healthy_port = await open_leg(poll_interval_ms=20)

        def fail(payloads: bytes) -> None:
            raise RuntimeError("handler bug")

        broken.fast_batch = fail  # type: ignore[method-assign]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for n in range(40):
                sender.sendto(packet(n), (HOST, broken_port))
                sender.sendto(packet(n), (HOST, healthy_port))
                await asyncio.sleep(0.001)
            await wait_for(lambda: healthy.stats.packets == 40 and broken.stats.packets == 40)
        stats = await healthy.close()
        await broken.close()
        assert stats.samples_out == sink.samples == 40 * 320
        assert "RTP batch handler failed" in caplog.text

    asyncio.run(scenario())


FUZZ_DATAGRAMS = 20_000


def fuzz_traffic(rng: random.Random) -> list[bytes]:
    """A long in-order stream (so the C path is armed most of the time) with a quarter of the
    datagrams mutated copies of stream packets (bit flips, truncation, inserted bytes, another
    sequence number or SSRC) or random bytes."""
    traffic = []
    seq = 0
    for _ in range(FUZZ_DATAGRAMS):
        if rng.random() < 0.75:
            traffic.append(packet(seq))
            seq += 1
        elif rng.random() < 0.9:
            traffic.append(mutate(packet(seq + rng.randrange(-3, 4)), rng))
        else:
            traffic.append(rng.randbytes(rng.randrange(200)))
    return traffic


def test_fuzzed_traffic_through_the_c_path_matches_the_python_path() -> None:
    traffic = fuzz_traffic(random.Random(2026))

    async def run(fast: bool) -> tuple[CountingSink, LegStats, list[object]]:
        errors: list[object] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        leg, sink, port = await open_leg(fast_path=fast, poll_interval_ms=0)

        def handled() -> int:  # every datagram ends in exactly one of these counters
            stats = leg.stats
            return stats.packets + stats.bad_packets + stats.rtcp_packets

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for index, data in enumerate(traffic):
                sender.sendto(data, (HOST, port))
                if index % 100 == 99:  # let the leg catch up: never fill the socket buffer
                    await wait_for(lambda sent=index + 1: handled() >= sent)  # type: ignore[misc]
            await wait_for(lambda: handled() >= len(traffic))
        return sink, await leg.close(), errors

    c_sink, c_stats, c_errors = asyncio.run(run(True))
    py_sink, py_stats, py_errors = asyncio.run(run(False))
    assert c_errors == py_errors == []
    for name in COMPARED:
        assert getattr(c_stats, name) == getattr(py_stats, name), name
    assert c_stats.packets + c_stats.bad_packets + c_stats.rtcp_packets == FUZZ_DATAGRAMS
    assert c_stats.bad_packets > 0 and c_stats.duplicate + c_stats.late > 0
    np.testing.assert_array_equal(c_sink.pcm, py_sink.pcm)


@pytest.mark.parametrize("nat", [False, True], ids=["sdp-port", "nat-port"])
def test_c_path_drops_a_strangers_audio(nat: bool) -> None:
    """The C receiver screens sources like `RtpLeg.handle_rtp`: the stranger's datagrams are
    counted and dropped in C, and the leg keeps taking the peer's packets there."""

    async def scenario() -> None:
        leg, sink, sent = await stranger_before_and_during_the_call(fast=True, nat=nat)
        stats = leg.stats
        assert (stats.foreign_address, stats.foreign_port, stats.bad_packets) == (sent, 0, 0)
        assert stats.samples_out == len(sink.pcm) == 50 * 320
        assert not sink.pcm.any()

    asyncio.run(scenario())


def test_c_screen_by_port_in_strict_mode() -> None:
    async def scenario() -> None:
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other,
        ):
            peer.bind((HOST, 0))
            other.bind((HOST, 0))
            leg, sink, port = await open_leg(expected_remote=peer.getsockname(), latch="strict", poll_interval_ms=0)
            for seq in range(20):
                peer.sendto(silent_packet(seq), (HOST, port))
                other.sendto(loud_packet(seq + 1), (HOST, port))
                await asyncio.sleep(0.001)
            await wait_for(lambda: leg.stats.packets == 20 and leg.stats.foreign_port == 20)
            assert leg._fast.armed
        stats = await leg.close()
        assert stats.foreign_address == 0 and stats.foreign_packets == 20
        assert not sink.pcm.any()

    asyncio.run(scenario())
