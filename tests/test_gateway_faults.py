"""The service under faults, with real peers (sipp, redis-server) on loopback.

Redis restarted during calls, garbage datagrams on the SIP and RTP ports, an INVITE flood
beyond capacity, a caller that vanishes without BYE, and SIGTERM to ``asr-gateway serve``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from asr_common import allocator
from asr_core.audio_io import read_wav
from asr_gateway.config import ServiceConfig
from asr_gateway.dev.demo import DATA_DIR, EventCollector, demo_config
from asr_gateway.dev.local_redis import free_tcp_port
from asr_gateway.dev.sipp_calls import PCMA, CallResult, place_call, rtp_packets, sipp_path
from asr_gateway.service import DEMO_MODEL_DIR, Service
from kb_hooks import events as ev
from tests.redis_server import RedisServer
from tests.tool_marks import needs_redis_server, needs_sipp

MODEL = DEMO_MODEL_DIR  # the bundled model must read the bundled recordings: no fallback, no skip

pytestmark = [
    needs_sipp,
    needs_redis_server,
    pytest.mark.timeout(60),
]

FLOOD_SCENARIO = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="INVITE flood">
<send retrans="500"><![CDATA[
INVITE sip:12345@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: flood <sip:flood@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:12345@[remote_ip]:[remote_port]>
Call-ID: [call_id]
CSeq: 1 INVITE
Contact: <sip:flood@[local_ip]:[local_port]>
Max-Forwards: 70
Content-Type: application/sdp
Content-Length: [len]

v=0
o=flood 1 1 IN IP4 [local_ip]
s=-
c=IN IP4 [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000
a=sendonly
]]></send>
<recv response="100" optional="true"/>
<recv response="503"><action>
<ereg regexp="[0-9]+" search_in="hdr" header="Retry-After:" check_it="true" assign_to="retry"/>
</action></recv>
<Reference variables="retry"/>
<send><![CDATA[
ACK sip:12345@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: flood <sip:flood@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:12345@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 1 ACK
Max-Forwards: 70
Content-Length: 0

]]></send>
</scenario>
"""


@pytest.fixture()
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    # appendfsync always: what Redis acknowledged survives the kill -9 of the restart test.
    server = RedisServer(tmp_path / "redis", extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def audio(name: str) -> np.ndarray:
    return read_wav(DATA_DIR / f"{name}.wav").samples


def config_for(redis_url: str, tmp_path: Path, **sip: Any) -> ServiceConfig:
    config = demo_config(redis_url, MODEL, tmp_path, max_streams=4)
    return config.model_copy(update={"sip": config.sip.model_copy(update=sip)})


def record_submitted(service: Service) -> list[dict[str, Any]]:
    """Every event the service hands to its publisher, in order, in its JSON form."""
    submitted: list[dict[str, Any]] = []
    submit = service.publisher.submit

    def recording(event: ev.Event, *, audio_end_monotonic: float | None = None) -> None:
        submitted.append(event.to_json())
        submit(event, audio_end_monotonic=audio_end_monotonic)

    service.publisher.submit = recording  # type: ignore[method-assign]
    return submitted


async def wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def events_of(collector: EventCollector, tag: str) -> list[dict[str, Any]]:
    return [r.event for r in collector.events(tag + "-")]


def finals(events: list[dict[str, Any]]) -> list[str]:
    return [e["text"] for e in events if e["event_type"] == "transcript.final"]


def test_redis_restart_during_calls_loses_nothing_but_partials(tmp_path: Path, redis_server: RedisServer) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], EventCollector, list[CallResult], Service]:
        service = Service(config_for(redis_server.url, tmp_path))
        submitted = record_submitted(service)
        ports = await service.start()
        assert ports.sip_udp is not None
        collector = EventCollector(redis_server.url)
        await collector.start()
        try:
            calls = asyncio.gather(
                place_call(tmp_path / "a", ports.sip_udp, audio("hotline_seed"), 16000, call_tag="a"),
                place_call(tmp_path / "b", ports.sip_udp, audio("hotline_1"), 16000, payload_type=PCMA, call_tag="b"),
            )
            await wait_until(lambda: service.engine.stats.chunks > 4, 15)
            redis_server.stop(kill=True)
            await asyncio.sleep(1.5)
            redis_server.start()
            results = list(await calls)
            await collector.wait_for(["a-", "b-"], 15)
        finally:
            await service.stop(grace_s=5)
            await collector.stop()
        return submitted, collector, results, service

    submitted, collector, results, service = asyncio.run(scenario())
    assert all(r.returncode == 0 for r in results), [r.errors for r in results]
    assert service.publisher.reconnects > 0 or service.publisher.redis_errors > 0, "Redis was really down"
    durable = {e["event_id"]: e["event_type"] for e in submitted if e["event_type"] != "transcript.partial"}
    received = {r.event["event_id"] for r in collector.received}
    missing = {event_id: kind for event_id, kind in durable.items() if event_id not in received}
    assert not missing, f"lost across the Redis restart: {missing}"
    kinds = set(durable.values())
    assert {"call.started", "transcript.final", "call.ended"} <= kinds


def send_garbage(sock: socket.socket, ports: list[int], rng: random.Random) -> None:
    for port in ports:
        kind = rng.randrange(4)
        if kind == 0:  # random bytes, RTP version forced to something other than 2
            data = bytes([rng.choice((0x00, 0x40, 0xC0)) | rng.randrange(0x40)]) + rng.randbytes(rng.randrange(200))
        elif kind == 1:  # a truncated header
            data = b"\x80" + rng.randbytes(rng.randrange(11))
        elif kind == 2:  # a well-formed PCMU packet from a stranger: must not join the call
            data = bytes([0x80, 0]) + rng.randbytes(10) + bytes(160)
        else:  # a SIP-looking start, then junk
            data = b"INVITE sip:x SIP/2.0\r\nVia: " + rng.randbytes(rng.randrange(300))
        sock.sendto(data, ("127.0.0.1", port))


def test_garbage_udp_on_sip_and_rtp_ports_leaves_calls_unaffected(tmp_path: Path, redis_server: RedisServer) -> None:
    async def scenario() -> tuple[EventCollector, list[CallResult], int, list[dict[str, int]]]:
        config = config_for(redis_server.url, tmp_path)
        config = config.model_copy(update={"rtp": config.rtp.model_copy(update={"port_max": config.rtp.port_min + 63})})
        service = Service(config)
        ports = await service.start()
        assert ports.sip_udp is not None
        sip_port = ports.sip_udp
        collector = EventCollector(redis_server.url)
        await collector.start()
        targets = [sip_port, *range(config.rtp.port_min, config.rtp.port_max + 1)]
        rng = random.Random(7)
        sent = 0
        try:
            rtp = [service.rtp_totals.snapshot()]
            clean = await place_call(tmp_path / "clean", sip_port, audio("hotline_1"), 16000, call_tag="clean")
            await collector.wait_for(["clean-"], 10)
            rtp.append(service.rtp_totals.snapshot())
            call = asyncio.create_task(
                place_call(tmp_path / "noisy", sip_port, audio("hotline_1"), 16000, call_tag="noisy")
            )
            # the leg has latched onto the caller's media: it played a packet of this call
            await wait_until(lambda: service.rtp_totals.snapshot()["packets"] > rtp[-1]["packets"], 10)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                while not call.done():
                    send_garbage(sock, targets, rng)
                    sent += len(targets)
                    await asyncio.sleep(0.05)
            noisy = await call
            await collector.wait_for(["noisy-"], 10)
            rtp.append(service.rtp_totals.snapshot())
        finally:
            await service.stop(grace_s=5)
            await collector.stop()
        return collector, [clean, noisy], sent, rtp

    collector, results, sent, rtp = asyncio.run(scenario())
    assert sent > 1000
    assert all(r.returncode == 0 for r in results), [r.errors for r in results]
    clean_rtp, noisy_rtp = ({key: after[key] - before[key] for key in before} for before, after in pairwise(rtp))
    assert noisy_rtp["packets"] == clean_rtp["packets"], "every packet of the caller and nothing else was played"
    assert noisy_rtp["bad_packets"] > 0 and noisy_rtp["foreign_packets"] > 0, noisy_rtp
    clean, noisy = events_of(collector, "clean"), events_of(collector, "noisy")
    assert finals(clean), "the clean call produced finals"
    assert finals(noisy) == finals(clean)
    ended = [next(e for e in events if e["event_type"] == "call.ended") for events in (clean, noisy)]
    assert [e["reason"] for e in ended] == ["bye", "bye"]
    audio_ms = [sorted(e["stats"]["audio_ms"].values()) for e in ended]
    assert audio_ms[0] == audio_ms[1]


def test_invite_flood_beyond_capacity_gets_503_and_spares_existing_calls(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    async def scenario() -> tuple[EventCollector, list[CallResult], subprocess.CompletedProcess[bytes], Service]:
        config = config_for(redis_server.url, tmp_path)
        config = config.model_copy(update={"engine": config.engine.model_copy(update={"max_streams": 2})})
        service = Service(config)
        ports = await service.start()
        assert ports.sip_udp is not None
        sip_port = ports.sip_udp
        collector = EventCollector(redis_server.url)
        await collector.start()
        try:
            calls = asyncio.gather(
                place_call(tmp_path / "a", sip_port, audio("hotline_seed"), 16000, call_tag="a"),
                place_call(tmp_path / "b", sip_port, audio("hotline_seed"), 16000, payload_type=PCMA, call_tag="b"),
            )
            await wait_until(lambda: service.engine.free_slots == 0, 10)
            (tmp_path / "flood.xml").write_text(FLOOD_SCENARIO, encoding="latin-1")
            flood = await asyncio.to_thread(
                subprocess.run,
                [sipp_path(), "-sf", str(tmp_path / "flood.xml"), "-m", "40", "-r", "100", "-l", "40", "-i",
                 "127.0.0.1", "-p", str(free_udp_port()), "-timeout", "20s", "-timeout_error", "-nostdin",
                 f"127.0.0.1:{sip_port}"],
                cwd=tmp_path, capture_output=True, timeout=30,
            )  # fmt: skip
            results = await calls
            await collector.wait_for(["a-", "b-"], 15)
        finally:
            await service.stop(grace_s=5)
            await collector.stop()
        return collector, list(results), flood, service

    collector, results, flood, service = asyncio.run(scenario())
    assert flood.returncode == 0, flood.stderr.decode(errors="replace")[-2000:]
    assert service.sip.counters["responses.503"] >= 40
    assert all(r.returncode == 0 for r in results), [r.errors for r in results]
    for tag in ("a", "b"):
        events = events_of(collector, tag)
        ended = [e for e in events if e["event_type"] == "call.ended"]
        assert finals(events) and [e["reason"] for e in ended] == ["bye"]
        assert next(iter(ended[0]["stats"]["audio_ms"].values())) >= 5000


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_caller_vanishing_without_bye_is_ended_by_rtp_timeout(tmp_path: Path, redis_server: RedisServer) -> None:
    async def scenario() -> tuple[EventCollector, CallResult, float, float]:
        service = Service(config_for(redis_server.url, tmp_path, rtp_inactivity_timeout_s=1.0))
        ports = await service.start()
        assert ports.sip_udp is not None
        collector = EventCollector(redis_server.url)
        await collector.start()
        try:
            result = await place_call(
                tmp_path / "gone", ports.sip_udp, audio("hotline_1"), 16000, hangup=False, call_tag="gone"
            )
            sipp_done = time.monotonic()
            assert await collector.wait_for(["gone-"], 10), "no call.ended after the RTP timeout"
            ended_at = time.monotonic()
        finally:
            await service.stop(grace_s=2)
            await collector.stop()
        return collector, result, sipp_done, ended_at

    collector, result, sipp_done, ended_at = asyncio.run(scenario())
    assert result.returncode == 0, result.errors
    events = events_of(collector, "gone")
    ended = [e for e in events if e["event_type"] == "call.ended"]
    assert [e["reason"] for e in ended] == ["rtp-timeout"]
    assert finals(events), "the audio before the caller vanished is transcribed"
    assert ended_at - sipp_done < 8


def test_sigterm_to_serve_flushes_finals_and_exits_0(tmp_path: Path, redis_server: RedisServer) -> None:
    sip_port, metrics_port = free_udp_port(), free_tcp_port()
    rtp_base = random.randrange(42_000, 60_000, 1_000)
    config = tmp_path / "serve.yaml"
    config.write_text(
        json.dumps(
            {
                "sip": {"host": "127.0.0.1", "port": sip_port, "transports": ["udp"]},
                "rtp": {"host": "127.0.0.1", "port_min": rtp_base, "port_max": rtp_base + 99},
                "engine": {"model_dir": str(MODEL), "max_streams": 4, "max_batch": 4},
                "redis": {"url": redis_server.url, "spool_dir": str(tmp_path / "spool")},
                "metrics": {"host": "127.0.0.1", "port": metrics_port},
                "routes": str(DATA_DIR / "routes.yaml"),
                "kb_hooks": {"kb_sets": {"hotline": str(DATA_DIR / "kb.yaml")},
                             "tag_rule_sets": {"hotline": str(DATA_DIR / "tags.yaml")},
                             "analytics_rule_sets": {"hotline": str(DATA_DIR / "analytics.yaml")},
                             "street_lists": {"hotline": str(DATA_DIR / "streets.txt")}},
                "logging": {"level": "warning", "format": "json"},
            }
        ),
        encoding="utf-8",
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASR_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "asr_gateway.cli", "serve", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for_health(metrics_port, server, 30)
        if allocator.jemalloc_installed():  # serve ran itself again on jemalloc (same PID), its finals child too
            children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
            assert children, "the finals search runs in a child process"
            for pid in [server.pid, *children]:
                assert allocator.jemalloc_loaded(Path(f"/proc/{pid}/maps")), f"process {pid} is not on jemalloc"

        async def scenario() -> None:
            calls = [
                asyncio.create_task(place_call(tmp_path / tag, sip_port, audio("hotline_seed"), 16000, call_tag=tag))
                for tag in ("t1", "t2")
            ]
            await asyncio.sleep(2.5)
            server.send_signal(signal.SIGTERM)
            await asyncio.to_thread(server.wait, 20)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)

        asyncio.run(scenario())
        output = server.stdout.read().decode(errors="replace") if server.stdout else ""
        assert server.returncode == 0, output[-3000:]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    client = redis.Redis.from_url(redis_server.url)
    entries: Any = client.xrange("asr:events")
    events = [json.loads(fields[b"event"]) for _, fields in entries]
    for tag in ("t1", "t2"):
        mine = [e for e in events if e["sip_call_id"].startswith(tag + "-")]
        kinds = [e["event_type"] for e in mine]
        assert kinds[0] == "call.started" and kinds[-1] == "call.ended", kinds
        assert "transcript.final" in kinds, f"finals of {tag} were not flushed: {kinds}"
        audio_ms = next(iter(mine[-1]["stats"]["audio_ms"].values()))
        assert 1000 < audio_ms < 5000, "the call was cut short by the shutdown, not played to its end"


def wait_for_health(port: int, server: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            output = server.stdout.read().decode(errors="replace") if server.stdout else ""
            raise AssertionError(f"asr-gateway serve exited with {server.returncode}: {output[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"asr-gateway serve was not healthy within {timeout_s} s")


STRANGER_HOST = "127.0.0.2"  # another loopback address: a distinct source from the caller's 127.0.0.1


async def speak_as_stranger(sock: socket.socket, ports: list[int], packets: list[bytes], stop: asyncio.Event) -> int:
    """Send a recording as RTP to every port in real time (one stream per port) until `stop`;
    returns how many datagrams were sent."""
    sent = 0
    for data in itertools.cycle(packets):
        if stop.is_set():
            return sent
        for port in ports:
            sock.sendto(data, ("127.0.0.1", port))
        sent += len(ports)
        await asyncio.sleep(0.02)
    return sent


def test_a_strangers_speech_on_the_rtp_ports_never_reaches_a_transcript(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """`rtp.latch: address` (default): speech sent from another host to every RTP port, from
    before the call opens its leg until the call ends, changes nothing in the transcript."""

    async def scenario() -> tuple[EventCollector, list[CallResult], int, list[dict[str, int]]]:
        config = config_for(redis_server.url, tmp_path)
        config = config.model_copy(update={"rtp": config.rtp.model_copy(update={"port_max": config.rtp.port_min + 63})})
        service = Service(config)
        ports = await service.start()
        assert ports.sip_udp is not None
        collector = EventCollector(redis_server.url)
        await collector.start()
        rtp_ports = list(range(config.rtp.port_min, config.rtp.port_max + 1, 2))
        speech = rtp_packets(audio("hotline_seed"), 16000, ssrc=0xBAD)
        try:
            rtp = [service.rtp_totals.snapshot()]
            clean = await place_call(tmp_path / "clean", ports.sip_udp, audio("hotline_1"), 16000, call_tag="clean")
            await collector.wait_for(["clean-"], 10)
            rtp.append(service.rtp_totals.snapshot())
            stop = asyncio.Event()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.bind((STRANGER_HOST, 0))
                stranger = asyncio.create_task(speak_as_stranger(sock, rtp_ports, speech, stop))
                await asyncio.sleep(0.2)  # the stranger speaks before the call's leg exists
                noisy = await place_call(  # and for 0.5 s after the leg opened, before the caller
                    tmp_path / "noisy", ports.sip_udp, audio("hotline_1"), 16000, call_tag="noisy", media_delay_ms=500
                )
                stop.set()
                sent = await stranger
            await collector.wait_for(["noisy-"], 10)
            rtp.append(service.rtp_totals.snapshot())
        finally:
            await service.stop(grace_s=5)
            await collector.stop()
        return collector, [clean, noisy], sent, rtp

    collector, results, sent, rtp = asyncio.run(scenario())
    assert sent > 1000
    assert all(r.returncode == 0 for r in results), [r.errors for r in results]
    clean_rtp, noisy_rtp = ({key: after[key] - before[key] for key in before} for before, after in pairwise(rtp))
    assert noisy_rtp["packets"] == clean_rtp["packets"], "every packet of the caller and nothing else was played"
    assert noisy_rtp["foreign_address"] > 0 and noisy_rtp["foreign_port"] == 0, noisy_rtp
    clean, noisy = events_of(collector, "clean"), events_of(collector, "noisy")
    assert finals(clean), "the clean call produced finals"
    assert finals(noisy) == finals(clean)


def slow_down(service: Service, step_delay_s: float) -> None:
    """Make every batched chunk step take ``step_delay_s`` longer: an engine far behind real
    time, as on an overloaded machine (the real step still runs, so the transcripts are real)."""
    runner = service.engine.runner
    step = runner.step

    def slow_step(*args: Any, **kwargs: Any) -> Any:
        time.sleep(step_delay_s)
        return step(*args, **kwargs)

    runner.step = slow_step  # type: ignore[method-assign]


def test_stop_while_the_engine_is_behind_loses_no_final_and_no_call_ended(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The calls have hung up but the engine is seconds behind when ``stop`` comes (a short
    grace): the audio already received is still decoded, and every call gets its finals and,
    last, its call.ended."""
    tags = ("s1", "s2")

    async def scenario() -> tuple[list[dict[str, Any]], list[CallResult], int]:
        service = Service(config_for(redis_server.url, tmp_path))
        submitted = record_submitted(service)
        ports = await service.start()
        assert ports.sip_udp is not None
        slow_down(service, 0.5)
        try:
            results = await asyncio.gather(
                *(place_call(tmp_path / tag, ports.sip_udp, audio("hotline_seed"), 16000, call_tag=tag) for tag in tags)
            )
            behind = service.engine.active_streams
        finally:
            await service.stop(grace_s=0.5)
        return submitted, list(results), behind

    submitted, results, behind = asyncio.run(scenario())
    assert all(r.returncode == 0 for r in results), [r.errors for r in results]
    assert behind > 0, "the engine was not behind when stop came: the test proves nothing"
    client = redis.Redis.from_url(redis_server.url)
    entries: Any = client.xrange("asr:events")
    published = {json.loads(fields[b"event"])["event_id"] for _, fields in entries}
    for tag in tags:
        mine = [
            e for e in submitted if e["sip_call_id"].startswith(tag + "-") and e["event_type"] != "transcript.partial"
        ]
        kinds = [e["event_type"] for e in mine]
        assert kinds and kinds[0] == "call.started" and kinds[-1] == "call.ended", kinds
        assert "transcript.final" in kinds, kinds
        assert "井盖" in "".join(e["text"] for e in mine if e["event_type"] == "transcript.final")
        lost = [e["event_type"] for e in mine if e["event_id"] not in published]
        assert not lost, f"{tag}: handed to the publisher but not in Redis after stop: {lost}"
