"""The AudioSocket door alone (a counting application, no engine): bad input gets an error
frame naming what was wrong and a counted reason, never a crash or a stuck leg; the per-source
connection cap, idle and slow-frame timeouts hold; 8 kHz audio reaches the sink at 16 kHz."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from audiosocket.config import AudioSocketSettings
from audiosocket.server import AudioSocketServer
from calls.handler import CountingCallHandler
from calls.routing import Router, RoutesFile
from tests.audio_clients import audiosocket_message

STREAM = uuid.UUID("0a0a0a0a-0000-4000-8000-000000000001")
HELLO = audiosocket_message(0x01, STREAM.bytes)


def run_door(
    scenario: Callable[[AudioSocketServer], Awaitable[None]],
    handler: CountingCallHandler,
    router: Router | None = None,
    **settings: object,
) -> AudioSocketServer:
    routes = router or Router()

    async def main() -> AudioSocketServer:
        door = AudioSocketServer(
            AudioSocketSettings(enabled=True, port=0, **settings),
            handler,
            lambda: routes,
        )
        await door.start()
        try:
            await scenario(door)
        finally:
            await door.stop()
        return door

    return asyncio.run(main())


async def exchange(port: int, data: bytes, *, close: bool = True) -> bytes:
    """Send ``data``, then read what comes back until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    if close:
        writer.write_eof()
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return reply


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def error_text(reply: bytes) -> str:
    assert reply[0] == 0xFF and int.from_bytes(reply[1:3], "big") == len(reply) - 3, reply
    return reply[3:].decode()


def test_8khz_audio_reaches_the_sink_at_16khz_and_the_leg_ends_on_hangup() -> None:
    handler = CountingCallHandler()
    pcm = (1000 * np.sin(np.arange(1600) / 5)).astype("<i2").tobytes()  # 200 ms at 8 kHz

    async def scenario(door: AudioSocketServer) -> None:
        frames = [audiosocket_message(0x10, pcm[i : i + 320]) for i in range(0, len(pcm), 320)]
        assert await exchange(door.port, HELLO + b"".join(frames) + audiosocket_message(0x00)) == b""

    run_door(scenario, handler)
    (sink,) = handler.sinks.values()
    assert sink.samples == 3200 and sink.finished == 1
    (call,) = handler.calls.values()
    assert call.source == "audiosocket" and call.source_call_id == str(STREAM) and call.legs[0].role == "mixed"
    assert handler.ended == {call.call_id: "hangup"} and handler.open_legs == 0


def test_bad_input_gets_an_error_frame_and_a_counted_reason() -> None:
    handler = CountingCallHandler()
    cases = [
        (audiosocket_message(0x10, b"\x00\x00"), "audio_before_uuid", "not allowed in state await_uuid"),
        (HELLO + audiosocket_message(0x10, b"\x00\x00\x00"), "odd_length", "3 bytes is not whole 16-bit samples"),
        (HELLO + bytes([0x10, 0x10, 0x01]), "oversized", "4097 bytes exceeds the limit of 4096"),
        (HELLO + audiosocket_message(0x16, b"\x00\x00"), "unsupported_rate", "48000 Hz; this server takes"),
        (b"GET / HTTP/1.1\r\n\r\n", "unknown_kind", "unknown AudioSocket frame kind 0x47"),
        (HELLO + b"\x16\x03\x01\x00\xa5", "truncated", "closed within a frame (5 bytes)"),
    ]

    async def scenario(door: AudioSocketServer) -> None:
        for data, _, message in cases:
            assert message in error_text(await exchange(door.port, data))

    door = run_door(scenario, handler, max_frame_bytes=4096)
    assert door.refusals == {reason: 1 for _, reason, _ in cases}
    assert handler.open_legs == 0 and len(handler.ended) == 4  # the legs opened by a UUID were ended
    assert set(handler.ended.values()) == {"protocol-error"}
    assert all(sink.finished == 1 for sink in handler.sinks.values())


def test_silence_a_slowloris_a_full_application_the_per_source_cap_and_draining_are_refused() -> None:
    handler = CountingCallHandler(capacity=1)

    async def scenario(door: AudioSocketServer) -> None:
        assert "no AudioSocket data for 0.3 s" in error_text(await exchange(door.port, HELLO, close=False))
        slow = HELLO + audiosocket_message(0x10, b"\x00" * 64)[:10]
        assert "frame incomplete after 0.2 s" in error_text(await exchange(door.port, slow, close=False))
        held = [await asyncio.open_connection("127.0.0.1", door.port) for _ in range(2)]
        await wait_until(lambda: door.connections == 2)
        assert "more than 2 connections" in error_text(await exchange(door.port, HELLO))
        held[0][1].write(HELLO)  # takes the application's only leg
        await held[0][1].drain()
        await wait_until(lambda: handler.open_legs == 1)
        held[1][1].write(HELLO)
        assert "no room for another call" in error_text(await held[1][0].read())
        for _, writer in held:
            writer.close()
        await wait_until(lambda: door.connections == 0)
        door.set_draining()
        assert "this node is draining" in error_text(await exchange(door.port, HELLO))

    door = run_door(scenario, handler, idle_timeout_s=0.3, frame_timeout_s=0.2, max_connections_per_source=2)
    assert door.refusals == {"idle_timeout": 1, "slow_frame": 1, "source_connections": 1, "busy": 1, "draining": 1}
    assert handler.open_legs == 0 and door.connections == 0


def test_a_source_outside_the_doors_cidrs_is_refused_before_it_is_read() -> None:
    handler = CountingCallHandler()

    async def scenario(door: AudioSocketServer) -> None:
        reply = error_text(await exchange(door.port, HELLO))
        assert "source 127.0.0.1 may not connect" in reply

    door = run_door(scenario, handler, source_cidrs=["10.0.0.0/8", "2001:db8::/32"])
    assert door.refusals == {"forbidden_source": 1} and handler.calls == {}


def test_a_route_narrows_the_doors_sources_and_never_widens_them() -> None:
    """The door's check comes before routing: a route that takes every source lets no outsider
    in, and a route's own ``source_cidrs`` refuses a source the door allows."""
    routes = RoutesFile.model_validate(
        {
            "default_profile": None,
            "reject_code": 403,
            "routes": [
                {
                    "name": "anyone",
                    "match": {"source_cidrs": ["0.0.0.0/0"], "headers": {"uuid": "^0a0a"}},
                    "profile": "default",
                },
                {"name": "lan-only", "match": {"source_cidrs": ["10.0.0.0/8"]}, "profile": "default"},
            ],
        }
    )
    other = uuid.UUID("0b0b0b0b-0000-4000-8000-000000000001")

    async def scenario(door: AudioSocketServer) -> None:
        if door.settings.source_cidrs:
            assert "may not connect" in error_text(await exchange(door.port, HELLO))
        else:
            other_hello = audiosocket_message(0x01, other.bytes)
            assert "no route takes AudioSocket stream" in error_text(await exchange(door.port, other_hello))
            assert await exchange(door.port, HELLO + audiosocket_message(0x00)) == b""

    closed = run_door(scenario, CountingCallHandler(), Router(routes), source_cidrs=["192.0.2.0/24"])
    assert closed.refusals == {"forbidden_source": 1}
    handler = CountingCallHandler()
    opened = run_door(scenario, handler, Router(routes))
    assert opened.refusals == {"no_route": 1}
    assert [call.route for call in handler.calls.values()] == ["anyone"]


def test_the_profiles_metadata_headers_publish_the_streams_attributes() -> None:
    routes = RoutesFile.model_validate(
        {"profiles": {"listed": {"metadata_headers": ["UUID", "X-Queue"]}, "plain": {}}, "default_profile": "listed"}
    )
    handler = CountingCallHandler()

    async def scenario(door: AudioSocketServer) -> None:
        assert await exchange(door.port, HELLO + audiosocket_message(0x00)) == b""

    run_door(scenario, handler, Router(routes))
    (call,) = handler.calls.values()
    assert call.metadata.headers == (("UUID", str(STREAM)),)
    plain = CountingCallHandler()
    run_door(scenario, plain, Router(routes.model_copy(update={"default_profile": "plain"})))
    (call,) = plain.calls.values()
    assert call.metadata.headers == () and call.source_call_id == str(STREAM)


def test_a_door_open_beyond_loopback_to_any_source_warns_at_start(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(door: AudioSocketServer) -> None:
        assert await exchange(door.port, HELLO + audiosocket_message(0x00)) == b""

    with caplog.at_level(logging.WARNING, logger="audiosocket"):
        run_door(scenario, CountingCallHandler(), host="0.0.0.0")
        run_door(scenario, CountingCallHandler(), host="0.0.0.0", source_cidrs=["127.0.0.0/8"])
        run_door(scenario, CountingCallHandler())
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "takes any source" in warning and "audiosocket.source_cidrs" in warning


def test_a_stream_named_after_the_drain_began_is_refused_as_draining() -> None:
    handler = CountingCallHandler()

    async def scenario(door: AudioSocketServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
        await wait_until(lambda: door.connections == 1)
        door.set_draining()
        writer.write(HELLO)
        assert "this node is draining" in error_text(await reader.read())
        writer.close()

    door = run_door(scenario, handler)
    assert door.refusals == {"draining": 1} and handler.calls == {}
