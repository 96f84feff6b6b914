"""RTP media load through real SIP call setup, on loopback; prints one JSON object.

    asr-bench media --calls 1000 --seconds 20 [--rate 200] [--codec PCMU] [--compare-no-sip]
    asr-bench media --door audiosocket|websocket|all --calls 1000 --seconds 20 [--door-rate 8000]

This process runs the server: the real `sip.transport.SipServer` (UDP) with real
`rtp.leg.RtpLeg` legs, the engine replaced by `calls.handler.CountingCallHandler`'s counting sinks,
on one event loop (uvloop unless `--no-uvloop`), as `asr-gateway serve` runs them. A child
process is the load generator (`deploy.bench.sip_uac`): it places `--calls` calls at
`--rate` calls/s (INVITE offering `--codec`, 100, 200 with our SDP answer, ACK), then
sends one 20 ms packet per call every 20 ms (50 packets/s per call) for `--seconds` to the
address in each answer, from the address in its offer, then BYEs every call.

What is counted:
- `server_cpu_us_per_packet`: CPU time (user + system, every thread) of this process, from
  the moment it tells the generator to start streaming until the legs have stopped
  receiving (their socket buffers are drained), divided by `packets_received`. That window
  holds the RTP receive path (sockets, event loop, parse, reorder, decode, resample, sink)
  and the idle server around it; call setup and BYEs are outside it.
  `server_cpu_fraction` is the same CPU time over the window's wall time, and
  `server_backlog_s` how long after the generator sent its last packet a leg received its
  last one (near 0 when the server keeps up), `server_max_stall_s` the longest time the
  event loop did not run in the window (other processes holding both cores).
- `setup_failures`: calls that did not get a usable 2xx: a non-2xx final response, no final
  response within 64·T1, or an answer without an audio address (`setup_failure_reasons`).
- `lost`: packets sent but never received (socket drops); `leg_lost` what the legs declared
  lost from sequence gaps; `late` what arrived after being declared lost.
- `max_calls_held`: calls that were set up, received at least 99% of the packets sent to
  them and were not ended by the server before the generator's BYE.

`--no-sip` is the older direct mode: N legs opened without SIP, the same pacer in a child
process; its report says `calls_up` = N and no setup fields. `--srtp-compare` runs the
direct mode twice in one process, plain RTP and then SRTP (AES_CM_128_HMAC_SHA1_80, each
packet protected by libsrtp in the pacer, unprotected by the legs), and reports the SRTP run
as `srtp` with `srtp_extra_us_per_packet`, the difference in `server_cpu_us_per_packet`.
Both runs use the same receive path (the C one unprotects in-order SRTP packets itself).
`--compare-no-sip` runs the SIP mode, then the direct mode with the same load in the same process, and adds the direct
report as `no_sip` and `server_cpu_ratio_to_no_sip`. `--parser-bench` instead prints the
per-packet parse cost of our RtpPacket, and of aiortc's where aiortc is installed (the
`bench` extra; otherwise the JSON says "aiortc not installed").

`--door audiosocket|websocket` runs `--calls` legs of that door at `--door-rate` Hz into the same
counting sinks (fields: `deploy.bench.door_load`); `--door all` runs RTP (SIP mode, or `--no-sip`),
AudioSocket and WebSocket in turn at the same load: one JSON, each report under its door's name,
`server_cpu_us_per_20ms` side by side (an RTP packet is 20 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
import json
import multiprocessing
import socket
import sys
import time
import timeit
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from asr_common.audio import PcmSink
from calls.handler import CountingCallHandler
from deploy.bench.door_load import DOORS, receive_from, run_door, spawn_generator
from deploy.bench.sip_uac import PACKET_MS, UacConfig, run_uac, stream_rtp
from rtp.codecs import audio_codecs, payload_type_map
from rtp.decoding import RESAMPLERS
from rtp.leg import DEFAULT_POLL_INTERVAL_MS, DEFAULT_RESAMPLE_BATCH_MS, RtpLeg
from rtp.packet import RtpPacket
from rtp.poller import FastReceiver
from rtp.ports import PortAllocator
from rtp.sink import CountingSink
from rtp.srtp import SrtpKeys, SrtpSender
from sip.config import SipSettings
from sip.transport import SipServer

PAYLOAD_TYPES = payload_type_map()
"""Every codec of `rtp.codecs` under the payload type the pacer sends it as."""
HELD_FRACTION = 0.99
DRAIN_LIMIT_S = 30.0
DRAIN_POLL_S = 0.2
LEGS_OPEN_LIMIT_S = 10.0
STALL_PROBE_S = 0.05
BENCH_SRTP = SrtpKeys("AES_CM_128_HMAC_SHA1_80", bytes(range(30)))


async def _drain(legs: Iterable[RtpLeg]) -> int:
    """Wait until the legs stop receiving (at most DRAIN_LIMIT_S); returns the packets received."""
    legs = list(legs)
    received = sum(leg.stats.packets for leg in legs)
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
        previous, received = received, sum(leg.stats.packets for leg in legs)
        if received == previous:
            break
    return received


def _leg_options(args: argparse.Namespace) -> dict[str, Any]:
    """RtpLeg keyword arguments the command line overrides (A/B runs); the rest keep their defaults."""
    options: dict[str, Any] = {}
    if args.resample_batch_ms is not None:
        options["resample_batch_ms"] = args.resample_batch_ms
    if args.poll_interval_ms is not None:
        options["poll_interval_ms"] = args.poll_interval_ms
    options["resampler"] = args.resampler
    options["fast_path"] = not args.python_receive
    return options


def _freeze_startup_objects(args: argparse.Namespace) -> None:
    """What `asr-gateway serve` does once started: move every object alive now out of the
    collector's generations, so later collections do not traverse them again."""
    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()


def _loop_name() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


@dataclass
class Window:
    """The streaming phase as this process saw it: the generator's "streamed" message, this
    process's CPU and wall time, and the longest time its event loop did not run."""

    streamed: dict[str, Any]
    cpu_s: float
    wall_s: float
    max_stall_s: float
    gc_collections: list[int]


async def _measure_streaming(
    conn: Connection, generator: multiprocessing.process.BaseProcess, legs: Iterable[RtpLeg]
) -> Window:
    """Tell the generator to stream; measure until it is done and the legs are drained.

    A probe timer every STALL_PROBE_S notes how late it fires: seconds in which the loop did
    not run (other processes holding the CPU) explain socket-buffer drops that CPU time does
    not show (a leg's socket holds about 5 s of packets).
    """
    loop = asyncio.get_running_loop()
    stall = 0.0

    async def probe() -> None:
        nonlocal stall
        while True:
            before = loop.time()
            await asyncio.sleep(STALL_PROBE_S)
            stall = max(stall, loop.time() - before - STALL_PROBE_S)

    prober = asyncio.create_task(probe())
    collections_start = [generation["collections"] for generation in gc.get_stats()]
    cpu_start, wall_start = time.process_time(), time.monotonic()
    conn.send("stream")
    streamed = await receive_from(conn, generator)
    await _drain(legs)
    cpu_s, wall_s = time.process_time() - cpu_start, time.monotonic() - wall_start
    prober.cancel()
    collections = [g["collections"] - start for g, start in zip(gc.get_stats(), collections_start, strict=True)]
    return Window(streamed, cpu_s, wall_s, stall, collections)


def _report(
    args: argparse.Namespace,
    legs: dict[str, RtpLeg],
    sent_by_call: dict[str, int],
    ended_early: set[str],
    window: Window,
) -> dict[str, Any]:
    """The fields both modes share; `legs` and `sent_by_call` are keyed by the same call names."""
    streamed, cpu_s, wall_s = window.streamed, window.cpu_s, window.wall_s
    received = sum(leg.stats.packets for leg in legs.values())
    last_packet = max((leg.stats.last_packet_time or 0.0 for leg in legs.values()), default=0.0)
    sent = streamed["packets_sent"]
    held = sum(
        1
        for name, count in sent_by_call.items()
        if name in legs and name not in ended_early and legs[name].stats.packets >= HELD_FRACTION * count
    )
    return {
        "calls": args.calls,
        "calls_up": len(sent_by_call),
        "seconds": args.seconds,
        "codec": args.codec,
        "loop": _loop_name(),
        "pps": round(received / streamed["send_wall_s"], 1),
        "target_pps": len(sent_by_call) * 1000 // PACKET_MS,
        "packets_sent": sent,
        "packets_received": received,
        "lost": sent - received,
        "leg_lost": sum(leg.stats.lost for leg in legs.values()),
        "late": sum(leg.stats.late for leg in legs.values()),
        "foreign_packets": sum(leg.stats.foreign_packets for leg in legs.values()),
        "server_cpu_us_per_packet": round(cpu_s * 1e6 / max(1, received), 2),
        "server_cpu_fraction": round(cpu_s / wall_s, 3),
        "server_backlog_s": round(max(0.0, last_packet - streamed["send_end_time"]), 3),
        "server_max_stall_s": round(window.max_stall_s, 3),
        "sender_cpu_us_per_packet": round(streamed["sender_cpu_s"] * 1e6 / max(1, sent), 2),
        "sender_ticks_behind": streamed["sender_ticks_behind"],
        "max_jitter_ms": round(max((leg.stats.jitter_ms for leg in legs.values()), default=0.0), 2),
        "samples_out": sum(leg.stats.samples_out for leg in legs.values()),
        "calls_ended_early": len(ended_early),
        "max_calls_held": held,
        "resample_batch_ms": DEFAULT_RESAMPLE_BATCH_MS if args.resample_batch_ms is None else args.resample_batch_ms,
        "poll_interval_ms": DEFAULT_POLL_INTERVAL_MS if args.poll_interval_ms is None else args.poll_interval_ms,
        "resampler": args.resampler,
        "receive_path": "python" if args.python_receive or FastReceiver is None else "c",
        "gc_freeze": not args.no_gc_freeze,
        "gc_collections": window.gc_collections,
    }


async def run_sip(args: argparse.Namespace) -> dict[str, Any]:
    """Calls set up through SipServer by the sip_uac child process; see the module doc."""
    settings = SipSettings(
        host=args.host,
        port=0,
        transports=["udp"],
        max_calls=args.server_max_calls or args.calls,
        # One generator address places every call: let the per-source INVITE limit pass the ramp.
        invite_rate_per_s=max(50.0, 2 * args.rate),
        invite_burst=max(100, round(args.rate)),
        # ... and its requests and open transactions: a trusted source's budgets (x10), no node-wide cap.
        trusted_cidrs=[ipaddress.ip_network(args.host)],
        t1_ms=args.t1_ms,
    )
    handler = CountingCallHandler(capacity=args.server_max_calls or args.calls)
    legs_by_sink: dict[int, RtpLeg] = {}
    leg_options = _leg_options(args)

    def leg_factory(sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> RtpLeg:
        """The server's own leg construction, plus a note of which sink each leg feeds."""
        leg = RtpLeg(
            sink=sink,
            payload_types=payload_types,
            reorder_ms=settings.rtp_reorder_ms,
            inactivity_timeout_s=settings.rtp_inactivity_timeout_s,
            on_end=on_end,
            **leg_options,
        )
        legs_by_sink[id(sink)] = leg
        return leg

    ports = PortAllocator(args.host, args.port_min, args.port_max)
    server = SipServer(settings, handler, ports, leg_factory=leg_factory, media_host=args.host)
    await server.start()
    _freeze_startup_objects(args)
    config = UacConfig(
        host=args.host,
        server_port=server.port("udp"),
        calls=args.calls,
        rate_per_s=args.rate,
        seconds=args.seconds,
        codec=args.codec,
        rtp_sockets=args.sockets,
        t1_s=args.t1_ms / 1000,
    )
    conn, generator = spawn_generator(run_uac, config)
    try:
        setup = await receive_from(conn, generator)
        deadline = time.monotonic() + LEGS_OPEN_LIMIT_S
        while len(legs_by_sink) < setup["calls_up"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        legs: dict[str, RtpLeg] = {}
        for call in handler.calls.values():
            for info in call.legs:
                leg = legs_by_sink.get(id(handler.sinks.get(info.leg_id)))
                if leg is not None:
                    legs[call.source_call_id] = leg

        window = await _measure_streaming(conn, generator, legs.values())
        ended_early = {handler.calls[call_id].source_call_id for call_id in handler.ended}
        ended_early |= set(window.streamed["ended_by_server"])
        report = {"mode": "sip", "setup_rate_per_s": args.rate}
        report |= _report(args, legs, window.streamed["sent_by_call"], ended_early, window)

        conn.send("hangup")
        done = await receive_from(conn, generator)
    finally:
        generator.join(timeout=5)
        if generator.is_alive():
            generator.kill()
        await server.stop(grace_s=2.0)
    report |= {
        "setup_failures": setup["setup_failures"],
        "setup_failure_reasons": setup["failure_reasons"],
        "setup_wall_s": round(setup["setup_wall_s"], 2),
        "setup_ms_p50": setup["setup_ms_p50"],
        "setup_ms_max": setup["setup_ms_max"],
        "bye_failures": done["bye_failures"],
        "invite_retransmissions": done["counters"].get("retransmissions.INVITE", 0),
        "bye_retransmissions": done["counters"].get("retransmissions.BYE", 0),
    }
    return report


def _direct_sender(
    conn: Connection, host: str, ports: list[int], seconds: float, codec: str, sockets: int, srtp: bool
) -> None:
    """Child process of `--no-sip`: the same pacer, aimed straight at the legs' ports; with
    `srtp`, one libsrtp session per leg protects its packets."""
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(sockets)]
    targets = [(senders[index % sockets], (host, port)) for index, port in enumerate(ports)]
    protectors: list[Callable[[bytes], bytes]] | None = None
    if srtp:
        protectors = [SrtpSender(BENCH_SRTP).protect for _ in ports]
    conn.send({"event": "ready"})
    if conn.recv() != "stream":
        return
    conn.send(stream_rtp(targets, seconds, codec, protectors=protectors).message())
    for sender in senders:
        sender.close()


async def run_direct(args: argparse.Namespace, srtp: bool = False) -> dict[str, Any]:
    """`--no-sip`: legs opened directly (no SIP), one pacer child process; SRTP legs with `srtp`."""
    allocator = PortAllocator(args.host, args.port_min, args.port_max)
    ended: set[str] = set()
    legs: dict[str, RtpLeg] = {}
    leg_options = _leg_options(args)
    _freeze_startup_objects(args)
    for index in range(args.calls):
        name = f"leg-{index}"
        leg = RtpLeg(
            sink=CountingSink(),
            payload_types=PAYLOAD_TYPES,
            on_end=lambda _reason, name=name: ended.add(name),  # type: ignore[misc]
            srtp=BENCH_SRTP if srtp else None,
            **leg_options,
        )
        await leg.open(args.host, allocator.allocate())
        legs[name] = leg
    ports = [leg.local_port or 0 for leg in legs.values()]
    conn, sender = spawn_generator(_direct_sender, args.host, ports, args.seconds, args.codec, args.sockets, srtp)
    try:
        await receive_from(conn, sender)
        window = await _measure_streaming(conn, sender, legs.values())
    finally:
        sender.join(timeout=5)
        if sender.is_alive():
            sender.kill()
    per_leg = window.streamed["packets_sent"] // max(1, len(legs))
    report = {"mode": "no-sip"} | _report(args, legs, dict.fromkeys(legs, per_leg), ended, window)
    if srtp:
        report["srtp_auth_failed"] = sum(leg.stats.srtp_auth_failed for leg in legs.values())
    for leg in legs.values():
        await leg.close()
    return report


async def _run_doors(args: argparse.Namespace) -> dict[str, Any]:
    """`--door`: one door's legs, or (`all`) RTP and every door at the same load, side by side."""
    if args.door != "all":
        return await run_door(args.door, args.host, args.calls, args.seconds, args.door_rate)
    rtp = await (run_direct(args) if args.no_sip else run_sip(args))
    report: dict[str, Any] = {"door": "all", "legs": args.calls, "seconds": args.seconds, "rtp": rtp}
    for door in DOORS:
        report[door] = await run_door(door, args.host, args.calls, args.seconds, args.door_rate)
    report["server_cpu_us_per_20ms"] = {"rtp": rtp["server_cpu_us_per_packet"]} | {
        door: report[door]["server_cpu_us_per_20ms"] for door in DOORS
    }
    return report


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    if args.door != "rtp":
        return await _run_doors(args)
    if args.srtp_compare:
        report = await run_direct(args)
        report["srtp"] = await run_direct(args, srtp=True)
        extra = report["srtp"]["server_cpu_us_per_packet"] - report["server_cpu_us_per_packet"]
        report["srtp_extra_us_per_packet"] = round(extra, 2)
        return report
    if args.no_sip:
        return await run_direct(args)
    report = await run_sip(args)
    if args.compare_no_sip:
        direct = await run_direct(args)
        report["no_sip"] = direct
        report["server_cpu_ratio_to_no_sip"] = round(
            report["server_cpu_us_per_packet"] / max(0.01, direct["server_cpu_us_per_packet"]), 3
        )
    return report


def _parser_bench() -> dict[str, Any]:
    """Our parse cost per packet, and aiortc's where it is installed (the `bench` extra)."""
    data = bytes(RtpPacket(payload_type=0, sequence_number=1, timestamp=2, ssrc=3, payload=b"\xff" * 160))
    parsers: list[tuple[str, Callable[[bytes], object]]] = [("ours_us_per_packet", RtpPacket.parse)]
    result: dict[str, Any] = {"packet_bytes": len(data)}
    try:
        from aiortc.rtp import RtpPacket as AiortcRtpPacket
    except ImportError:
        result["aiortc_us_per_packet"] = "aiortc not installed (pip install 'hotline-asr[bench]')"
    else:
        parsers.insert(0, ("aiortc_us_per_packet", AiortcRtpPacket.parse))
    number = 100_000
    for name, parse in parsers:
        best = min(timeit.repeat(lambda parse=parse: parse(data), number=number, repeat=5))  # type: ignore[misc]
        result[name] = round(best * 1e6 / number, 3)
    return result


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def convert(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return convert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asr-bench media", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", "--streams", type=_positive(int), default=100, help="concurrent calls")
    parser.add_argument("--seconds", type=_positive(float), default=10.0, help="streaming time per call")
    parser.add_argument("--rate", type=_positive(float), default=200.0, help="call setup rate, calls/s")
    codecs = list(audio_codecs())
    parser.add_argument(
        "--codec",
        choices=[codec.name for codec in codecs],
        default="PCMU",
        help="codecs without the C receive path: " + ", ".join(codec.name for codec in codecs if not codec.fast_path),
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port-min", type=int, default=30000, help="server RTP port range")
    parser.add_argument("--port-max", type=int, default=39999)
    parser.add_argument("--sockets", type=_positive(int), default=4, help="generator RTP sockets")
    parser.add_argument("--t1-ms", type=_positive(int), default=500, help="SIP T1, both sides")
    parser.add_argument(
        "--server-max-calls", type=_positive(int), help="server admission limit (default --calls); beyond it: 503"
    )
    parser.add_argument(
        "--door", choices=("rtp", *DOORS, "all"), default="rtp", help="legs of this door (all: each in turn)"
    )
    parser.add_argument("--door-rate", type=int, choices=(8000, 16000), default=8000, help="Hz sent to the doors")
    parser.add_argument("--no-sip", action="store_true", help="open the legs directly (the older mode)")
    parser.add_argument("--compare-no-sip", action="store_true", help="also run --no-sip and report both")
    parser.add_argument(
        "--srtp-compare", action="store_true", help="direct mode twice: plain RTP, then SRTP; report both"
    )
    parser.add_argument(
        "--resample-batch-ms", type=int, help="RtpLeg resample_batch_ms (default: the leg's own default)"
    )
    parser.add_argument(
        "--poll-interval-ms", type=float, help="RtpLeg poll_interval_ms (0: read on readiness; default: the leg's)"
    )
    parser.add_argument("--resampler", choices=RESAMPLERS, default="halfband", help="RtpLeg resampler")
    parser.add_argument(
        "--python-receive", action="store_true", help="read RTP in Python even where the C receive path is built"
    )
    parser.add_argument("--no-gc-freeze", action="store_true", help="skip gc.freeze() after start-up")
    parser.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    parser.add_argument("--parser-bench", action="store_true", help="only compare RTP parsers")
    args = parser.parse_args(argv)
    if args.parser_bench:
        print(json.dumps(_parser_bench()))
        return 0
    if args.port_max - args.port_min < 2 * args.calls:
        parser.error(f"--port-min/--port-max {args.port_min}-{args.port_max} hold fewer than {args.calls} port pairs")
    if not args.no_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    print(json.dumps(asyncio.run(_run(args))))
    # Let the exit's collection finalize what start-up froze (nanobind reports soxr streams
    # still alive at exit as leaks).
    gc.unfreeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
