"""Media load through the doors beside SIP (Asterisk AudioSocket, the WebSocket API), on loopback.

`asr-bench media --door audiosocket|websocket|all` (`media_load`) runs it. This process runs
the door's real server (`audiosocket.server.AudioSocketServer` or `wsaudio.server.WebSocketServer`)
on one event loop, its legs handed to `calls.handler.CountingCallHandler`'s counting sinks (no
model runs), as `asr-gateway serve` runs them. A child process is the load generator: it opens
`--calls` connections (legs), one after the other, each written from the protocol's public
description (AudioSocket: a UUID message, then signed-linear messages of kind 0x10 at 8 kHz or
0x12 at 16 kHz; WebSocket: an RFC 6455 handshake to `/v1/stream` with subprotocol
`hotline-asr.v1`, the start signal naming `sample_rate`, then masked binary messages), then
sends one 20 ms frame per leg every 20 ms for `--seconds` (blocking writes: a server that falls
behind slows the generator, counted in `sender_ticks_behind`), then closes every leg
(AudioSocket: a hangup message; WebSocket: a close frame).

What is counted, as for RTP: `server_cpu_us_per_20ms`, this process's CPU time (user + system,
every thread) from the start of streaming until the sinks stop receiving, over the 20 ms
frames the sinks received (16 kHz samples / 320), which holds the door's receive path (socket,
event loop, framing, WebSocket unmasking, upsampling to 16 kHz, sink) and the idle server
around it; connection set-up and close are outside it. `server_cpu_fraction` is that CPU time
over the window's wall time; `server_backlog_s` how long after the generator's last frame the
sinks stopped growing (resolution `DRAIN_POLL_S`); `setup_failures` legs the server did not
take; `refusals` the door's own counters (empty in a clean run); `calls_ended` the legs the
server ended after the generator closed them. `frames_received` may fall a little short of
`frames_sent` at 8 kHz: the upsampler holds its last few ms until a leg ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import multiprocessing
import os
import socket
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

import numpy as np

from audiosocket.config import AudioSocketSettings
from audiosocket.server import AudioSocketServer
from calls.handler import CountingCallHandler
from calls.profile import Profile
from calls.routing import Router, RoutesFile
from deploy.bench.sip_uac import PACKET_MS, StreamReport, paced_ticks
from wsaudio.config import WebSocketSettings
from wsaudio.server import WebSocketServer

Door = Literal["audiosocket", "websocket"]
DOORS: tuple[Door, ...] = ("audiosocket", "websocket")
MODEL_SAMPLES_PER_FRAME = 16000 * PACKET_MS // 1000
"""16 kHz samples the sinks get per 20 ms frame, whatever rate the door was sent."""
DRAIN_POLL_S = 0.05
DRAIN_LIMIT_S = 30.0
ENDED_LIMIT_S = 10.0
SOCKET_TIMEOUT_S = 10.0
SETUP_IDLE_S = 300.0
"""The doors' idle timeout in the bench: longer than opening every leg takes."""
AUDIOSOCKET_UUID, AUDIOSOCKET_HANGUP = 0x01, 0x00
AUDIOSOCKET_AUDIO = {8000: 0x10, 16000: 0x12}
"""AudioSocket message kinds: signed linear at 8 kHz (``slin``) and 16 kHz (``slin16``)."""
WS_TEXT, WS_BINARY, WS_CLOSE = 0x1, 0x2, 0x8


@dataclass(frozen=True)
class DoorLoad:
    """What the child process needs: which door, where, how many legs, how long, at what rate."""

    door: Door
    host: str
    port: int
    legs: int
    seconds: float
    rate: int  # Hz of the audio sent: 8000 or 16000


def tone_frames(rate: int) -> list[bytes]:
    """One second of a 440 Hz tone as 50 frames of 16-bit little-endian PCM at ``rate`` Hz."""
    tone = (np.sin(2 * np.pi * 440 * np.arange(rate) / rate) * 8000).astype("<i2")
    step = rate * PACKET_MS // 1000
    return [tone[i : i + step].tobytes() for i in range(0, rate, step)]


def audiosocket_message(kind: int, payload: bytes = b"") -> bytes:
    """One AudioSocket message: kind (1 byte), payload length (2 bytes, big-endian), payload."""
    return struct.pack("!BH", kind, len(payload)) + payload


def ws_client_frame(opcode: int, payload: bytes) -> bytes:
    """One final, masked client-to-server WebSocket frame (RFC 6455 5.2, 5.3)."""
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    keys = np.frombuffer(mask * (length // 4 + 1), dtype=np.uint8)[:length]
    return header + mask + (np.frombuffer(payload, dtype=np.uint8) ^ keys).tobytes()


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data


def _ws_server_message(sock: socket.socket) -> tuple[int, bytes]:
    """(opcode, payload) of the server's next unmasked, unfragmented frame."""
    first, second = _read_exactly(sock, 2)
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", _read_exactly(sock, 2))
    elif length == 127:
        (length,) = struct.unpack("!Q", _read_exactly(sock, 8))
    return first & 0x0F, _read_exactly(sock, length)


def _ws_open(sock: socket.socket, load: DoorLoad) -> None:
    """Handshake to our dialect and the start signal; returns once the server is ready."""
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /v1/stream?app=bench HTTP/1.1\r\nHost: {load.host}:{load.port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: hotline-asr.v1\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += _read_exactly(sock, 1)
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 101 " not in status + " ":
        raise ConnectionError(f"handshake answered {status!r}")
    sock.sendall(ws_client_frame(WS_TEXT, json.dumps({"signal": "start", "sample_rate": load.rate}).encode()))
    opcode, payload = _ws_server_message(sock)
    if opcode != WS_TEXT or json.loads(payload).get("type") != "server_ready":
        raise ConnectionError(f"start answered opcode {opcode}: {payload[:200]!r}")


def _open_leg(load: DoorLoad) -> socket.socket:
    sock = socket.create_connection((load.host, load.port), timeout=SOCKET_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if load.door == "audiosocket":
        sock.sendall(audiosocket_message(AUDIOSOCKET_UUID, uuid.uuid4().bytes))
    else:
        _ws_open(sock, load)
    return sock


def _frames_for(load: DoorLoad) -> Callable[[bytes], bytes]:
    """How a 20 ms PCM frame goes on the wire of ``load.door``."""
    if load.door == "audiosocket":
        kind = AUDIOSOCKET_AUDIO[load.rate]
        return lambda pcm: audiosocket_message(kind, pcm)
    return lambda pcm: ws_client_frame(WS_BINARY, pcm)


def _stream(sockets: list[socket.socket], frames: list[list[bytes]], seconds: float) -> StreamReport:
    """One frame to every leg per tick for ``seconds``, paced by the clock (as ``stream_rtp``)."""
    report = StreamReport()
    for tick in paced_ticks(seconds, report):
        for sock, leg_frames in zip(sockets, frames, strict=True):
            try:
                sock.sendall(leg_frames[tick % len(leg_frames)])
            except OSError:
                report.send_errors += 1
                continue
            report.packets_sent += 1
    return report


def run_generator(conn: Connection, load: DoorLoad) -> None:
    """Child process: open the legs, stream when told, close them when told; see the module doc."""
    sockets: list[socket.socket] = []
    failures: dict[str, int] = {}
    for _ in range(load.legs):
        try:
            sockets.append(_open_leg(load))
        except (OSError, ValueError) as exc:
            reason = type(exc).__name__ + (f": {exc}" if isinstance(exc, ConnectionError) else "")
            failures[reason] = failures.get(reason, 0) + 1
    conn.send({"event": "ready", "legs_up": len(sockets), "setup_failures": sum(failures.values()),
               "failure_reasons": failures})  # fmt: skip
    if conn.recv() != "stream":
        return
    wire = _frames_for(load)
    pcm = tone_frames(load.rate)
    # the same second of tone for every leg; WebSocket frames are masked once per leg, not per send
    if load.door == "websocket":
        frames = [[wire(frame) for frame in pcm] for _ in sockets]
    else:
        frames = [[wire(frame) for frame in pcm]] * len(sockets)
    report = _stream(sockets, frames, load.seconds)
    message = report.message()
    message["frames_sent"] = message.pop("packets_sent")
    conn.send(message)
    if conn.recv() != "hangup":
        return
    goodbye = audiosocket_message(AUDIOSOCKET_HANGUP) if load.door == "audiosocket" else None
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.sendall(goodbye or ws_client_frame(WS_CLOSE, struct.pack("!H", 1000)))
        sock.close()
    conn.send({"event": "closed"})


def _door_server(door: Door, host: str, legs: int, handler: CountingCallHandler) -> AudioSocketServer | WebSocketServer:
    """The door's real server on a free port; one generator address opens every leg, so its
    per-source connection budget is raised to the leg count (as the SIP bench trusts its UAC),
    and the legs opened first wait silent while the others open, so the idle timeout is long."""
    routes = Router(RoutesFile(profiles={"default": Profile()}))
    limits = {"max_connections_per_source": legs + 1, "idle_timeout_s": SETUP_IDLE_S}
    if door == "audiosocket":
        settings = AudioSocketSettings(enabled=True, host=host, port=0, **limits)
        return AudioSocketServer(settings, handler, lambda: routes)
    ws = WebSocketSettings(enabled=True, host=host, port=0, **limits)
    return WebSocketServer(ws, handler, lambda: routes, lambda _call, _listener: None, lambda _call: None,
                           (160, 240, 320, 640))  # fmt: skip


def _received(handler: CountingCallHandler) -> int:
    return sum(sink.samples for sink in handler.sinks.values())


def spawn_generator(target: Callable[..., None], *args: Any) -> tuple[Connection, multiprocessing.process.BaseProcess]:
    """Start ``target(pipe_end, *args)`` in a spawned daemon process; our end of the pipe and the process."""
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    process = context.Process(target=target, args=(child_conn, *args), daemon=True)
    process.start()
    return conn, process


async def receive_from(conn: Connection, process: multiprocessing.process.BaseProcess) -> Any:
    """The next message of the load generator ``process`` on ``conn``; RuntimeError when it died instead."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    except EOFError:
        process.join(timeout=5)
        raise RuntimeError(f"the load generator exited (code {process.exitcode}) before reporting") from None


async def run_door(door: Door, host: str, legs: int, seconds: float, rate: int) -> dict[str, Any]:
    """One door's run: server here, generator in a child process; the report (see the module doc)."""
    handler = CountingCallHandler(capacity=legs)
    server = _door_server(door, host, legs, handler)
    await server.start()
    load = DoorLoad(door, host, server.port, legs, seconds, rate)
    conn, generator = spawn_generator(run_generator, load)
    try:
        ready = await receive_from(conn, generator)
        cpu_start, wall_start = time.process_time(), time.monotonic()
        conn.send("stream")
        streamed = await receive_from(conn, generator)
        received, last_growth = _received(handler), time.monotonic()
        while time.monotonic() - last_growth < 4 * DRAIN_POLL_S and time.monotonic() - wall_start < DRAIN_LIMIT_S:
            await asyncio.sleep(DRAIN_POLL_S)
            previous, received = received, _received(handler)
            if received != previous:
                last_growth = time.monotonic()
        cpu_s, wall_s = time.process_time() - cpu_start, time.monotonic() - wall_start
        conn.send("hangup")
        await receive_from(conn, generator)
        deadline = time.monotonic() + ENDED_LIMIT_S
        while len(handler.ended) < ready["legs_up"] and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
    finally:
        generator.join(timeout=5)
        if generator.is_alive():
            generator.kill()
        await server.stop()
    frames = received / MODEL_SAMPLES_PER_FRAME
    return {
        "door": door,
        "legs": legs,
        "legs_up": ready["legs_up"],
        "setup_failures": ready["setup_failures"],
        "setup_failure_reasons": ready["failure_reasons"],
        "seconds": seconds,
        "sample_rate": rate,
        "frames_sent": streamed["frames_sent"],
        "frames_received": round(frames),
        "server_cpu_us_per_20ms": round(cpu_s * 1e6 / max(1.0, frames), 2),
        "server_cpu_fraction": round(cpu_s / wall_s, 3),
        "server_backlog_s": round(max(0.0, last_growth - streamed["send_end_time"]), 3),
        "sender_cpu_us_per_frame": round(streamed["sender_cpu_s"] * 1e6 / max(1, streamed["frames_sent"]), 2),
        "sender_ticks_behind": streamed["sender_ticks_behind"],
        "send_errors": streamed["send_errors"],
        "refusals": dict(server.refusals),
        "calls_ended": len(handler.ended),
    }
