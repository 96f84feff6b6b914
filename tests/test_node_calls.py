"""Every door's calls are the node's calls (issue 54, item 1): for a call of each door — SIP (sipp),
AudioSocket, the WebSocket API (WeNet's protocol) and FreeSWITCH ``mod_audio_fork`` — ``/metrics``
(``asr_active_calls`` and ``asr_active_calls_by_source``) and the heartbeat count it, a drain
waits for it while the door refuses new calls, and the drain ends once the call has.

One service per door: a drain cannot be undone."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import websocket
from prometheus_client.parser import text_string_to_metric_families

from asr_core.model.bundled import BUNDLED_MODEL_DIR
from asr_gateway.dev.sipp_calls import place_call
from asr_gateway.heartbeat import nodes_key
from asr_gateway.service import Service
from calls.call import CallSource
from calls.registry import SOURCES
from tests.audio_clients import audiosocket_message, recording
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import read_valid_events, service_config
from tests.test_gateway_metrics import http_get, options_status
from tests.tool_marks import needs_redis_server, needs_sipp

__all__ = ["redis_server"]  # the fixture, used by name

pytestmark = [needs_redis_server, needs_sipp, pytest.mark.timeout(120)]

ROUTES = "profiles:\n  default: {redaction: keep}\nroutes: []\n"
DOORS = "audiosocket: {enabled: true, host: 127.0.0.1, port: 0}\nwebsocket: {enabled: true, host: 127.0.0.1, port: 0}\n"
DEADLINE_S = 60.0  # a loaded 2-core runner starts calls and ends them slowly; nothing here waits this long when well
FRAME_S = 0.02


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        await asyncio.sleep(0.05)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = http_get(port, "/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def heartbeat(service: Service) -> dict[str, Any]:
    """The node's latest heartbeat in Redis ({} before the first)."""
    beat = service.heartbeat
    assert beat is not None
    with redis.Redis.from_url(service.config.redis.url) as client:
        raw = client.hget(nodes_key(beat.prefix), beat.node_id)
    return dict(json.loads(raw)) if raw else {}


# -- one held call per door: it streams until ``hang_up`` is set (SIP: until its audio ends) ------


async def sip_call(service: Service, workdir: Path, hang_up: asyncio.Event) -> None:
    port = service.sip.port("udp")
    pcm = np.tile(recording("hotline_1", 8000), 4)  # ~16 s: up well past the checks below
    result = await place_call(workdir / "sip", port, pcm, 8000, call_tag="held")
    assert result.returncode == 0, result.errors


async def audiosocket_call(service: Service, workdir: Path, hang_up: asyncio.Event) -> None:
    assert service.doors.audiosocket is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", service.doors.audiosocket.port)
    writer.write(audiosocket_message(0x01, uuid.uuid4().bytes))
    silence = audiosocket_message(0x10, bytes(320))  # 20 ms at 8 kHz
    while not hang_up.is_set():
        writer.write(silence)
        await writer.drain()
        await asyncio.sleep(FRAME_S)
    writer.write(audiosocket_message(0x00))
    await writer.drain()
    await reader.read()
    writer.close()


def _stream_until(ws: websocket.WebSocket, frame: bytes, hang_up: threading.Event) -> None:
    while not hang_up.is_set():
        ws.send_binary(frame)
        time.sleep(FRAME_S)


def _wenet(url: str, hang_up: threading.Event) -> None:
    ws = websocket.create_connection(url, timeout=DEADLINE_S)
    try:
        ws.send(json.dumps({"signal": "start", "nbest": 1, "continuous_decoding": True}))
        assert json.loads(ws.recv())["type"] == "server_ready"
        _stream_until(ws, bytes(640), hang_up)  # 20 ms at 16 kHz
        ws.send(json.dumps({"signal": "end"}))
        while json.loads(ws.recv()).get("type") != "speech_end":
            pass
    finally:
        ws.close()


def _audio_fork(url: str, hang_up: threading.Event) -> None:
    ws = websocket.create_connection(url, timeout=DEADLINE_S, subprotocols=["audio.drachtio.org"])
    try:
        ws.send(json.dumps({"queue": "held"}))
        _stream_until(ws, bytes(320), hang_up)  # 20 ms at 8 kHz
    finally:
        ws.close()


async def websocket_call(service: Service, workdir: Path, hang_up: asyncio.Event) -> None:
    assert service.doors.websocket is not None
    await _threaded(_wenet, f"ws://127.0.0.1:{service.doors.websocket.port}/", hang_up)


async def audio_fork_call(service: Service, workdir: Path, hang_up: asyncio.Event) -> None:
    assert service.doors.websocket is not None
    url = f"ws://127.0.0.1:{service.doors.websocket.port}/?mix=mono&rate=8000&uuid=held-fork"
    await _threaded(_audio_fork, url, hang_up)


async def _threaded(client: Callable[[str, threading.Event], None], url: str, hang_up: asyncio.Event) -> None:
    """Run a synchronous client in a thread; ``hang_up`` reaches it as a thread event."""
    stop = threading.Event()
    task = asyncio.create_task(asyncio.to_thread(client, url, stop))
    waiter = asyncio.create_task(hang_up.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    waiter.cancel()
    await task


HeldCall = Callable[[Service, Path, asyncio.Event], Any]
CALLS: dict[CallSource, HeldCall] = {
    "sip": sip_call,
    "audiosocket": audiosocket_call,
    "websocket": websocket_call,
    "audio_fork": audio_fork_call,
}


# -- a new call of the door while draining --------------------------------------------------------


async def refused_while_draining(service: Service, source: CallSource) -> None:
    if source == "sip":
        assert await asyncio.to_thread(options_status, service.sip.port("udp")) == 503
        return
    door = service.doors.audiosocket if source == "audiosocket" else service.doors.websocket
    assert door is not None
    if source == "audiosocket":
        reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
        writer.write(audiosocket_message(0x01, uuid.uuid4().bytes))
        reply = await reader.read()
        writer.close()
        assert reply[:1] == b"\xff", reply  # an error frame
    else:
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            await asyncio.to_thread(websocket.create_connection, f"ws://127.0.0.1:{door.port}/", timeout=10)
        assert refused.value.status_code == 503
    assert door.refusals["draining"] == 1


@pytest.mark.parametrize("source", SOURCES)
def test_a_drain_waits_for_a_call_of_every_door_and_metrics_and_heartbeat_count_it(
    source: CallSource, tmp_path: Path, redis_server: RedisServer
) -> None:
    config = service_config(tmp_path, redis_server.url, ROUTES, DOORS)
    config = config.model_copy(update={"sip": config.sip.model_copy(update={"drain_wait_s": DEADLINE_S})})

    async def scenario() -> None:
        service = Service(config)
        ports = await service.start()
        assert ports.metrics is not None
        hang_up = asyncio.Event()
        call = asyncio.create_task(CALLS[source](service, tmp_path, hang_up))
        try:
            await wait_until(lambda: service.calls.active == 1 or call.done(), f"{source} call")
            assert service.calls.by_source() == {s: int(s == source) for s in SOURCES}

            samples = await asyncio.to_thread(scrape, ports.metrics)
            assert samples[("asr_active_calls", ())] == 1
            for door in SOURCES:
                assert samples[("asr_active_calls_by_source", (("source", door),))] == int(door == source), door

            reports: list[dict[str, Any]] = []

            def counted() -> bool:
                reports.append(heartbeat(service))
                return reports[-1].get("active_calls") == 1

            await wait_until(counted, "heartbeat that counts the call")
            assert reports[-1]["active_calls_by_source"] == {s: int(s == source) for s in SOURCES}
            assert reports[-1]["model"] == {"dir": str(BUNDLED_MODEL_DIR), "demo": True}  # the console warns of it

            service.request_stop()
            assert service.calls.active == 1, "the call is still up as the drain starts"
            drain = asyncio.create_task(service.wait_for_calls())
            await asyncio.sleep(0)  # the drain's first look at the calls
            assert not drain.done(), f"the drain did not wait for the {source} call"
            await refused_while_draining(service, source)
            assert not drain.done()

            hang_up.set()
            await asyncio.wait_for(drain, DEADLINE_S)
            assert service.calls.active == 0
            await asyncio.wait_for(call, DEADLINE_S)
        finally:
            hang_up.set()
            await service.stop(grace_s=5)
            await asyncio.gather(call, return_exceptions=True)  # its own failure is reported above

    asyncio.run(scenario())
    ended = [e for e in read_valid_events(redis_server.url) if e["event_type"] == "call.ended"]
    assert len(ended) == 1 and ended[0]["reason"] in ("hangup", "bye"), ended
    started = [e for e in read_valid_events(redis_server.url) if e["event_type"] == "call.started"]
    assert [e["source"] for e in started] == [source]
