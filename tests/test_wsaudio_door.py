"""The WebSocket door alone (a counting application, no engine), driven by ``websocket-client``:
bad input closes the connection with an RFC 6455 code and a reason a user can act on, counted
by reason, and never leaves a leg open; the token, the per-source cap and the idle and
handshake timeouts hold. The dialects' sans-IO parts: handshake, start messages, stereo split."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websocket

from asr_common.yamlconf import ConfigError
from asr_gateway.config import ServiceConfig
from asr_gateway.doors import websocket_tls
from calls.handler import CallHandler, CountingCallHandler
from calls.registry import CallRegistry
from calls.routing import Router, RoutesFile
from tests.certs import self_signed_cert
from tests.waiting import wait_until_async
from wsaudio.config import WebSocketSettings
from wsaudio.errors import PeerError
from wsaudio.protocol import read_handshake, read_start, split_channels
from wsaudio.server import WebSocketServer

ROUTES = RoutesFile.model_validate(
    {
        "profiles": {"default": {}, "locked": {"bearer_token": "a-token-of-16-chars"}},
        "routes": [{"name": "locked", "match": {"headers": {"app": "^locked$"}}, "profile": "locked"}],
    }
)
START = json.dumps({"signal": "start", "nbest": 1, "continuous_decoding": True})


def closed_with(ws: websocket.WebSocket) -> tuple[int, str]:
    """The code and reason of the server's close frame (replies before it are skipped)."""
    while True:
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return struct.unpack("!H", frame.data[:2])[0], frame.data[2:].decode()


def run_door(
    clients: Callable[[str], None],
    handler: CallHandler,
    tls: ssl.SSLContext | None = None,
    routes: RoutesFile = ROUTES,
    **settings: Any,
) -> WebSocketServer:
    async def main() -> WebSocketServer:
        watched: dict[str, Any] = {}
        door = WebSocketServer(
            WebSocketSettings(enabled=True, port=0, **settings), handler, lambda: Router(routes),
            watched.__setitem__, lambda call_id: watched.pop(call_id, None), (160, 320, 640), tls,
        )  # fmt: skip
        await door.start()
        try:
            await asyncio.to_thread(clients, f"{'wss' if tls else 'ws'}://127.0.0.1:{door.port}")
            await wait_until_async(lambda: door.connections == 0, 10.0, "the door closed every client's connection")
        finally:
            await door.stop()
        return door

    return asyncio.run(main())


def test_bad_input_closes_with_a_code_and_a_counted_reason() -> None:
    handler = CountingCallHandler()

    def clients(base: str) -> None:
        cases: list[tuple[str, list[str], list[str | bytes], int, str]] = [
            (base, [], [b"\x00\x00"], 1008, "binary message before the start message"),
            (base, [], [START, b"\x00\x00\x00"], 1003, "3 bytes is not whole 1-channel 16-bit frames"),
            (base, [], [START, b"\x00" * 70000], 1009, "message exceeds 65536 bytes"),
            (base, [], ["not json"], 1007, "text message is not JSON"),
            (base, [], [START, '{"signal": "pause"}'], 1008, "only the end signal may follow the start"),
            (base + "/?app=locked&token=wrong", [], [START], 1008, "route locked needs its bearer token"),
            (base + "/v1/stream", [], ['{"signal": "start", "sample_rate": 44100}'], 1003, "sample rate 44100"),
            (base, ["hotline-asr.v1"], ['{"signal": "start", "chunk_ms": 240}'], 1008, "chunk_ms 240 is not one"),
            (base + "/?mix=quad", ["audio.drachtio.org"], ["{}"], 1003, "mix 'quad' is not one of"),
        ]
        for url, subprotocols, messages, code, reason in cases:
            ws = websocket.create_connection(url, timeout=10, subprotocols=subprotocols or None)
            for message in messages:
                if isinstance(message, bytes):
                    ws.send_binary(message)
                else:
                    ws.send(message)
            got = closed_with(ws)
            assert got[0] == code and reason in got[1], (url, got)
            ws.close()

    door = run_door(clients, handler)
    assert door.refusals == {
        "audio_before_start": 1, "odd_length": 1, "oversized": 1, "bad_json": 1, "unexpected_text": 1,
        "unauthorized": 1, "unsupported_rate": 1, "bad_start": 2,
    }  # fmt: skip
    assert handler.open_legs == 0 and all(sink.finished == 1 for sink in handler.sinks.values())
    assert set(handler.ended.values()) == {"protocol-error"}


def test_token_capacity_timeouts_and_the_per_source_cap() -> None:
    handler = CountingCallHandler(capacity=1)

    def clients(base: str) -> None:
        ws = websocket.create_connection(
            base + "/?app=locked", timeout=10, header=["Authorization: Bearer a-token-of-16-chars"]
        )
        ws.send(START)
        assert json.loads(ws.recv()) == {"status": "ok", "type": "server_ready"}
        busy = websocket.create_connection(base, timeout=10)
        with pytest.raises(websocket.WebSocketBadStatusException) as info:
            websocket.create_connection(base, timeout=10)  # a third connection from this address
        assert info.value.status_code == 503
        busy.send(START)
        assert closed_with(busy) == (1013, "no room for another call; try another node")
        assert closed_with(ws) == (1008, "no data for 0.4 s")
        ws.close()
        busy.close()
        with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1]))) as slow:
            slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finishes its handshake
            slow.settimeout(5)
            assert slow.recv(100) == b""

    door = run_door(clients, handler, idle_timeout_s=0.4, handshake_timeout_s=0.3, max_connections_per_source=2)
    assert door.refusals == {"busy": 1, "source_connections": 1, "idle_timeout": 1, "slow_handshake": 1}
    assert handler.open_legs == 0 and door.connections == 0


def test_the_dialects_sans_io() -> None:
    assert read_handshake("/", [], []).dialect == "wenet"
    ours = read_handshake("/v1/stream?app=x&token=t", [], [(b"Authorization", b"Bearer abc")])
    assert (ours.dialect, ours.attributes, ours.token) == ("hotline", {"app": "x"}, "abc")
    fork = read_handshake("/any?mix=stereo&rate=16k", ["audio.drachtio.org"], [])
    assert (fork.dialect, fork.subprotocol) == ("audio_fork", "audio.drachtio.org")
    start = read_start(fork, json.dumps({"queue": "sales", "nested": {"x": 1}, "flag": True}))
    assert (start.sample_rate, start.channels) == (16000, 2)
    assert start.attributes == {"mix": "stereo", "rate": "16k", "queue": "sales"}
    stereo = np.array([1, -1, 2, -2, 3, -3], dtype="<i2").tobytes()
    left, right = split_channels(stereo, 2)
    assert left.tolist() == [1, 2, 3] and right.tolist() == [-1, -2, -3]
    in_metadata = read_start(read_handshake("/audio_fork", [], []), '{"mix": "mixed", "rate": 16000}')
    assert (in_metadata.mix, in_metadata.sample_rate) == ("mixed", 16000)
    with pytest.raises(PeerError, match="not whole 2-channel"):
        split_channels(stereo[:6], 2)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_wss_with_the_sip_certificate_and_a_client_chosen_chunk_size(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    with pytest.raises(ConfigError, match=r"websocket\.tls needs sip\.tls_cert and sip\.tls_key"):
        websocket_tls(ServiceConfig.model_validate({"websocket": {"tls": True}}))
    sip = {"tls_cert": str(cert), "tls_key": str(key)}
    context = websocket_tls(ServiceConfig.model_validate({"websocket": {"tls": True}, "sip": sip}))
    handler = CountingCallHandler()

    def client(base: str) -> None:
        ws = websocket.create_connection(base + "/v1/stream", timeout=10, sslopt={"ca_certs": str(cert)})
        ws.send(json.dumps({"signal": "start", "sample_rate": 8000, "chunk_ms": 160, "left_chunks": 2}))
        ready = json.loads(ws.recv())
        assert (ready["type"], ready["chunk_ms"], ready["left_chunks"], ready["sample_rate"]) == (
            "server_ready",
            160,
            2,
            8000,
        )
        ws.close()

    run_door(client, handler, context)
    (call,) = handler.calls.values()  # the stream's engine stream is opened with the call's profile
    assert (call.source, call.profile.chunk_ms, call.profile.left_chunks) == ("websocket", 160, 2)
    assert handler.open_legs == 0 and len(handler.ended) == 1


def test_a_door_with_tokens_refuses_a_client_without_one_whatever_it_sends_and_a_route_token_adds_to_it() -> None:
    handler = CountingCallHandler()
    door_token, route_token = "the-door-token-of-16", "a-token-of-16-chars"  # the locked route's token
    door_refusal = (1008, "this door needs a bearer token (Authorization: Bearer, or ?token=)")

    def clients(base: str) -> None:
        for url, header, subprotocols in [
            (base + "/", [], None),
            (base + "/?queue=sales&app=softphone", [], None),  # attributes choose the route, not the door
            (base + "/v1/stream?token=not-one-of-the-door-tokens", [], ["hotline-asr.v1"]),
            (base + "/audio_fork?mix=mono&uuid=x", ["Authorization: Bearer wrong-token-of-16-chars"], None),
            (base + "/?app=locked", ["Authorization: Basic dXNlcjpwYXNz"], ["audio.drachtio.org"]),
        ]:
            ws = websocket.create_connection(url, timeout=10, header=header, subprotocols=subprotocols)
            assert closed_with(ws) == door_refusal, url  # before the client sent anything
            ws.close()
        opened = websocket.create_connection(f"{base}/?token={door_token}", timeout=10)
        opened.send(START)  # the default route asks no more than the door
        assert json.loads(opened.recv()) == {"status": "ok", "type": "server_ready"}
        locked = websocket.create_connection(f"{base}/?app=locked&token={door_token}", timeout=10)
        locked.send(START)  # the door's token opens the door; the locked route asks its own on top
        assert closed_with(locked) == (1008, "route locked needs its bearer token")
        both = websocket.create_connection(
            f"{base}/?app=locked", timeout=10, header=[f"Authorization: Bearer {route_token}"]
        )
        both.send(START)  # the route's token, listed at the door too, passes both
        assert json.loads(both.recv()) == {"status": "ok", "type": "server_ready"}
        for ws in (opened, locked, both):
            ws.close()

    door = run_door(clients, handler, bearer_tokens=[door_token, route_token])
    assert door.refusals == {"unauthorized": 6}
    assert sorted(call.route or "default" for call in handler.calls.values()) == ["default", "locked"]
    assert handler.open_legs == 0


def test_a_source_outside_the_doors_cidrs_gets_403_before_its_handshake_is_read() -> None:
    """The door's source check comes before its token and before routing: a right token does not
    open it to an outsider, and a route that takes every source lets none in. A door whose
    ``source_cidrs`` hold the client serves it."""
    token = "a-door-token-of-16-chars"
    routes = RoutesFile.model_validate(
        {"routes": [{"name": "anyone", "match": {"source_cidrs": ["0.0.0.0/0", "::/0"]}, "profile": "default"}]}
    )
    handler = CountingCallHandler()

    def refused(base: str) -> None:
        for url in (base, f"{base}/v1/stream?token={token}"):
            with pytest.raises(websocket.WebSocketBadStatusException) as info:
                websocket.create_connection(url, timeout=10)
            assert info.value.status_code == 403
            assert info.value.resp_body == b"source 127.0.0.1 may not connect (websocket.source_cidrs)"

    door = run_door(
        refused, handler, routes=routes, bearer_tokens=[token], source_cidrs=["10.0.0.0/8", "2001:db8::/32"]
    )
    assert door.refusals == {"forbidden_source": 2} and handler.calls == {}

    def served(base: str) -> None:
        ws = websocket.create_connection(f"{base}/?token={token}", timeout=10)
        ws.send(START)
        assert json.loads(ws.recv()) == {"status": "ok", "type": "server_ready"}
        ws.close()

    door = run_door(served, handler, routes=routes, bearer_tokens=[token], source_cidrs=["10.0.0.0/8", "127.0.0.0/8"])
    assert door.refusals == {} and [call.route for call in handler.calls.values()] == ["anyone"]


def test_door_tokens_are_secret_and_long() -> None:
    settings = WebSocketSettings(bearer_tokens=["x" * 16])
    assert "x" * 16 not in repr(settings) and "x" * 16 not in settings.model_dump_json()
    with pytest.raises(ValueError, match=r"bearer_tokens\.0\n.*at least 16"):
        WebSocketSettings(bearer_tokens=["short"])


def test_streams_are_admitted_through_calls_admit() -> None:
    routes = RoutesFile.model_validate(
        {
            "default_profile": None,  # an access list: only what a rule takes
            "reject_code": 403,
            "profiles": {"sales": {"metadata_headers": ["Queue", "Agent-Id", "Absent"]}},
            "routes": [{"name": "sales", "match": {"headers": {"queue": "^sales$"}}, "profile": "sales"}],
        }
    )
    counting = CountingCallHandler()
    registry = CallRegistry(counting, max_calls=1)

    def clients(base: str) -> None:
        nowhere = websocket.create_connection(base + "/?queue=support", timeout=10)
        nowhere.send(START)
        assert closed_with(nowhere) == (1008, "no route takes this stream (code 403)")
        first = websocket.create_connection(base + "/?queue=sales&agent-id=%207%20", timeout=10)
        first.send(START)
        assert json.loads(first.recv()) == {"status": "ok", "type": "server_ready"}
        second = websocket.create_connection(base + "/?queue=sales", timeout=10)
        second.send(START)  # the node's one call is in progress
        assert closed_with(second) == (1013, "no room for another call; try another node")
        first.send(json.dumps({"signal": "end"}))
        for ws in (nowhere, first, second):
            ws.close()

    door = run_door(clients, registry, routes=routes)
    assert door.refusals == {"no_route": 1, "busy": 1}
    (call,) = counting.calls.values()
    assert call.route == "sales" and call.metadata.headers == (("Queue", "sales"), ("Agent-Id", "7"))
    assert registry.active == 0 and counting.ended == {call.call_id: "hangup"}
