"""RTP media load: N receiving legs in this process, one paced sender in a child process.

    python -m deploy.bench.media_load --streams 1000 --seconds 10 [--codec PCMU]

Opens N `RtpLeg`s (with `CountingSink`) on loopback, starts a child process that sends one
20 ms packet to every leg every 20 ms (50 packets/s per stream) from a few UDP sockets, and
prints one JSON object. CPU is measured per process, so `receiver_cpu_us_per_packet` is the
receiving side only (sockets, event loop, parse, reorder, decode, resample, sink):
process CPU time of the receiver from the first packet sent until its sockets are drained,
divided by the packets received. `receiver_backlog_s` is how long the receiver needed after
the sender's last packet to drain its socket buffers (near 0 when it keeps up).

`max_streams_held` counts legs that received at least 99% of the packets sent to them and did
not time out. `lost` is packets sent but never received (socket drops), `leg_lost` what the
legs declared lost from sequence gaps, `late` what arrived after being declared lost.
`--parser-bench` instead prints the per-packet parse cost of aiortc's RtpPacket and ours.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import struct
import sys
import time
import timeit
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from rtp import g711
from rtp.leg import RtpLeg
from rtp.packet import RtpPacket
from rtp.ports import PortAllocator
from rtp.sink import CountingSink

PACKET_MS = 20
PACKET_SAMPLES = 160
PAYLOAD_TYPES = {0: "PCMU", 8: "PCMA", 101: "telephone-event", 13: "CN"}
HELD_FRACTION = 0.99
DRAIN_LIMIT_S = 30.0


def _tone_payloads(codec: str) -> list[bytes]:
    """One second of a 440 Hz tone as 50 packet payloads, reused in a loop."""
    samples = (np.sin(2 * np.pi * 440 * np.arange(8000) / 8000) * 8000).astype(np.int16)
    return [g711.encode(codec, samples[i : i + PACKET_SAMPLES]) for i in range(0, 8000, PACKET_SAMPLES)]


def _send(host: str, ports: list[int], seconds: float, codec: str, sockets: int, results: Connection) -> None:
    """Child process: pace one packet per stream per 20 ms tick for `seconds`."""
    payload_type = 0 if codec == "PCMU" else 8
    payloads = _tone_payloads(codec)
    header = struct.Struct("!BBHII")
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(sockets)]
    targets = [(senders[i % sockets].sendto, (host, port), 0x10000 + i) for i, port in enumerate(ports)]
    ticks = round(seconds * 1000 / PACKET_MS)
    sent = errors = behind = 0
    results.send({"started": True})
    cpu_start = time.process_time()
    start = time.monotonic()
    for tick in range(ticks):
        deadline = start + tick * PACKET_MS / 1000
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -PACKET_MS / 1000:
            behind += 1
        seq = tick & 0xFFFF
        timestamp = (tick * PACKET_SAMPLES) & 0xFFFFFFFF
        payload = payloads[tick % len(payloads)]
        for sendto, address, ssrc in targets:
            try:
                sendto(header.pack(0x80, payload_type, seq, timestamp, ssrc) + payload, address)
                sent += 1
            except OSError:
                errors += 1
    results.send(
        {
            "packets_sent": sent,
            "send_errors": errors,
            "sender_ticks_behind": behind,
            "sender_cpu_s": time.process_time() - cpu_start,
            "send_wall_s": time.monotonic() - start,
        }
    )
    for sender in senders:
        sender.close()


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    allocator = PortAllocator(args.host, args.port_min, args.port_max)
    ended: set[int] = set()
    legs: list[RtpLeg] = []
    for index in range(args.streams):
        leg = RtpLeg(
            sink=CountingSink(),
            payload_types=PAYLOAD_TYPES,
            inactivity_timeout_s=5.0,
            on_end=lambda _reason, index=index: ended.add(index),  # type: ignore[misc]
        )
        await leg.open(args.host, allocator.allocate())
        legs.append(leg)
    ports = [leg.local_port or 0 for leg in legs]

    context = multiprocessing.get_context("spawn")
    receive_end, send_end = context.Pipe(duplex=False)
    sender = context.Process(
        target=_send, args=(args.host, ports, args.seconds, args.codec, args.sockets, send_end), daemon=True
    )
    sender.start()
    while not receive_end.poll():
        await asyncio.sleep(0.05)
    receive_end.recv()
    cpu_start = time.process_time()
    wall_start = time.monotonic()
    while not receive_end.poll():
        await asyncio.sleep(0.05)
    sender_report: dict[str, Any] = receive_end.recv()
    received = sum(leg.stats.packets for leg in legs)
    drain_deadline = time.monotonic() + DRAIN_LIMIT_S
    while time.monotonic() < drain_deadline:
        await asyncio.sleep(0.2)
        previous, received = received, sum(leg.stats.packets for leg in legs)
        if received == previous:
            break
    cpu_s = time.process_time() - cpu_start
    wall_s = time.monotonic() - wall_start
    sender.join(timeout=5)

    per_leg_sent = sender_report["packets_sent"] / max(1, len(legs))
    held = sum(
        1 for index, leg in enumerate(legs) if index not in ended and leg.stats.packets >= HELD_FRACTION * per_leg_sent
    )
    report = {
        "streams": args.streams,
        "seconds": args.seconds,
        "codec": args.codec,
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "pps": round(received / sender_report["send_wall_s"], 1),
        "target_pps": args.streams * 1000 // PACKET_MS,
        "packets_sent": sender_report["packets_sent"],
        "packets_received": received,
        "lost": sender_report["packets_sent"] - received,
        "leg_lost": sum(leg.stats.lost for leg in legs),
        "late": sum(leg.stats.late for leg in legs),
        "receiver_cpu_us_per_packet": round(cpu_s * 1e6 / max(1, received), 2),
        "receiver_cpu_fraction": round(cpu_s / wall_s, 3),
        "receiver_backlog_s": round(wall_s - sender_report["send_wall_s"], 2),
        "sender_cpu_us_per_packet": round(
            sender_report["sender_cpu_s"] * 1e6 / max(1, sender_report["packets_sent"]), 2
        ),
        "sender_ticks_behind": sender_report["sender_ticks_behind"],
        "max_jitter_ms": round(max((leg.stats.jitter_ms for leg in legs), default=0.0), 2),
        "samples_out": sum(leg.stats.samples_out for leg in legs),
        "max_streams_held": held,
    }
    for leg in legs:
        await leg.close()
    return report


def _parser_bench() -> dict[str, Any]:
    from aiortc.rtp import RtpPacket as AiortcRtpPacket

    data = bytes(RtpPacket(payload_type=0, sequence_number=1, timestamp=2, ssrc=3, payload=b"\xff" * 160))
    number = 100_000
    result: dict[str, Any] = {"packet_bytes": len(data)}
    for name, parse in (("aiortc_us_per_packet", AiortcRtpPacket.parse), ("ours_us_per_packet", RtpPacket.parse)):
        best = min(timeit.repeat(lambda parse=parse: parse(data), number=number, repeat=5))  # type: ignore[misc]
        result[name] = round(best * 1e6 / number, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.media_load", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--codec", choices=("PCMU", "PCMA"), default="PCMU")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port-min", type=int, default=30000)
    parser.add_argument("--port-max", type=int, default=39999)
    parser.add_argument("--sockets", type=int, default=4, help="sender sockets")
    parser.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    parser.add_argument("--parser-bench", action="store_true", help="only compare RTP parsers")
    args = parser.parse_args(argv)
    if args.parser_bench:
        print(json.dumps(_parser_bench()))
        return 0
    if not args.no_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    print(json.dumps(asyncio.run(_run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
