"""The WebSocket door's replies are bounded (issue 54): a client that reads nothing through a
10-minute call is closed as a slow reader once its unread replies pass the door's bound, its
call's input ends cleanly (the application still ends the call), the door never holds more
than ``max_pending_reply_bytes`` of its replies, and the refusal is counted; a client that
reads gets every reply. The application emits a partial per 200 ms of audio, from its own
worker thread, as the service's bridge does."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import websocket

from asr_common.audio import CountingPcmSink
from calls.call import CallInfo, LegInfo
from calls.handler import CountingCallHandler
from calls.routing import Router, RoutesFile
from tests.waiting import wait_until_async
from wsaudio.config import WebSocketSettings
from wsaudio.server import WebSocketServer

RATE = 16000
FRAME = b"\x01\x00" * (RATE // 50)  # 20 ms of 16-bit mono PCM
CALL_FRAMES = 30_000  # 10 minutes of 20 ms frames
PARTIAL_EVERY = RATE // 5  # samples: a partial per 200 ms of audio
TEXT = "早上七点多北京路附近暖气不热"
START = json.dumps({"signal": "start", "sample_rate": RATE})
CLIENT_RCVBUF = 32 * 1024  # bytes (the kernel doubles it); the call's partials are about 1.3 MB
Listener = Callable[[dict[str, Any]], None]


class PartialsSink(CountingPcmSink):
    """Counts a leg's audio and emits a partial each time another 200 ms arrived."""

    def __init__(self, application: PartialsApplication, call: CallInfo, leg: LegInfo) -> None:
        super().__init__()
        self.application = application
        self.call = call
        self.leg = leg

    def accept_waveform(self, samples: np.ndarray) -> None:
        before = self.samples
        super().accept_waveform(samples)
        for n in range(before // PARTIAL_EVERY + 1, self.samples // PARTIAL_EVERY + 1):
            self.application.emit(self.call.call_id, {
                "schema": "hotline.asr.event.v1", "event_type": "transcript.partial", "call_id": self.call.call_id,
                "seq": n, "participant": {"role": self.leg.role, "leg_id": self.leg.leg_id}, "text": TEXT,
                "start_ms": (n - 1) * 200, "end_ms": n * 200,
            })  # fmt: skip


class PartialsApplication(CountingCallHandler):
    """A ``CallHandler`` whose legs emit a ``transcript.partial`` per 200 ms of audio and whose
    calls end with ``call.ended``, handed to the watching door on a worker thread."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: dict[str, Listener] = {}
        self.emitted = 0
        self.emitted_bytes = 0
        self._events: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._hand_over, name="partials-worker")
        self._worker.start()

    def watch(self, call_id: str, listener: Listener) -> None:
        with self._lock:
            self.listeners[call_id] = listener

    def unwatch(self, call_id: str) -> None:
        with self._lock:
            self.listeners.pop(call_id, None)

    def open_leg(self, call: CallInfo, leg: LegInfo) -> PartialsSink:
        sink = PartialsSink(self, call, leg)
        super().open_leg(call, leg)
        self.sinks[leg.leg_id] = sink
        return sink

    def call_ended(self, call: CallInfo, reason: str) -> None:
        super().call_ended(call, reason)
        self.emit(call.call_id, {"event_type": "call.ended", "call_id": call.call_id, "reason": reason})

    def emit(self, call_id: str, event: dict[str, Any]) -> None:
        self._events.put((call_id, event))

    def stop(self) -> None:
        self._events.put(None)
        self._worker.join()

    def _hand_over(self) -> None:
        while (item := self._events.get()) is not None:
            call_id, event = item
            with self._lock:
                listener = self.listeners.get(call_id)
            if listener is not None:
                self.emitted += 1
                self.emitted_bytes += len(json.dumps(event, ensure_ascii=False).encode())
                listener(event)


def run_door(client: Callable[[str], Any], application: PartialsApplication, **settings: Any) -> WebSocketServer:
    async def main() -> WebSocketServer:
        door = WebSocketServer(
            WebSocketSettings(enabled=True, port=0, **settings), application, lambda: Router(RoutesFile()),
            application.watch, application.unwatch, (160, 320, 640),
        )  # fmt: skip
        await door.start()
        try:
            await asyncio.to_thread(client, f"ws://127.0.0.1:{door.port}/v1/stream")
            await wait_until_async(lambda: door.connections == 0, 30.0, "the door closed the client's connection")
        finally:
            await door.stop()
            application.stop()
        return door

    return asyncio.run(main())


def read_until_close(ws: websocket.WebSocket) -> tuple[list[dict[str, Any]], int, str]:
    """The replies (text messages) read before the server's close frame, and its code and reason."""
    replies: list[dict[str, Any]] = []
    while True:
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return replies, struct.unpack("!H", frame.data[:2])[0], frame.data[2:].decode()
        if opcode == websocket.ABNF.OPCODE_TEXT:  # pongs skipped
            replies.append(json.loads(frame.data))


def test_a_client_that_reads_nothing_through_a_10_minute_call_is_closed_as_a_slow_reader() -> None:
    application = PartialsApplication()
    settings = WebSocketSettings()  # the defaults
    closed: list[tuple[int, str]] = []
    read: list[dict[str, Any]] = []

    def client(url: str) -> None:
        # A fixed, small receive buffer: left to autotune on loopback the kernel grows it to
        # megabytes, which would hold every reply of the call and hide the door's bound.
        small_buffer = ((socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF),)
        ws = websocket.create_connection(url, timeout=60, sockopt=small_buffer)
        ws.send(START)
        for _ in range(CALL_FRAMES):  # as fast as it can, reading nothing
            ws.send_binary(FRAME)
        ws.send(json.dumps({"signal": "end"}))
        replies, code, reason = read_until_close(ws)
        read.extend(replies)
        closed.append((code, reason))
        ws.close()

    door = run_door(client, application, idle_timeout_s=60)  # time enough to send the rest of the call after its close

    ((code, reason),) = closed
    assert code == 1008 and reason.startswith("slow reader: "), reason
    assert door.refusals == {"slow_reader": 1}
    (call_id,) = application.ended
    assert application.ended[call_id] == "slow-reader"  # the call's input ended; the application ends the call
    assert application.open_legs == 0 and all(sink.finished == 1 for sink in application.sinks.values())
    assert not application.listeners  # the door no longer watches the call
    reply_bytes = max(len(json.dumps(e, ensure_ascii=False).encode()) for e in read)
    assert 0 < door.peak_pending_reply_bytes <= settings.max_pending_reply_bytes + reply_bytes
    # the replies the door dropped when it closed: more than it may hold, and never sent
    assert application.emitted - (len(read) - 1) > settings.max_pending_replies
    assert read[0]["type"] == "server_ready" and read[-1]["event_type"] == "transcript.partial"


def test_a_client_that_reads_gets_every_reply_and_the_normal_close() -> None:
    application = PartialsApplication()
    result: list[tuple[list[dict[str, Any]], int, str]] = []

    def client(url: str) -> None:
        ws = websocket.create_connection(url, timeout=60)
        reader = threading.Thread(target=lambda: result.append(read_until_close(ws)))
        reader.start()
        ws.send(START)
        for _ in range(CALL_FRAMES):  # as fast as it can, read as it goes
            ws.send_binary(FRAME)
        ws.send(json.dumps({"signal": "end"}))
        reader.join()
        ws.close()

    door = run_door(client, application)
    ((replies, code, reason),) = result
    assert (code, reason) == (1000, "end of stream") and not door.refusals
    partials = [e for e in replies[1:] if e["event_type"] == "transcript.partial"]
    assert [e["seq"] for e in partials] == list(range(1, CALL_FRAMES // 10 + 1))
    assert replies[-1]["event_type"] == "call.ended" and replies[-1]["reason"] == "hangup"


def test_a_client_that_pings_and_never_reads_the_pongs_is_closed_as_a_slow_reader() -> None:
    application = PartialsApplication()
    settings = WebSocketSettings()
    closed: list[tuple[int, str]] = []

    def client(url: str) -> None:
        ws = websocket.create_connection(url, timeout=60)
        ws.send(START)
        for _ in range(4 * settings.max_pending_reply_bytes // 125):  # 4 times the bound in pongs
            ws.ping(b"p" * 125)
        *_, code, reason = read_until_close(ws)
        closed.append((code, reason))
        ws.close()

    door = run_door(client, application, idle_timeout_s=60)
    ((code, reason),) = closed
    assert code == 1008 and reason.startswith("slow reader: "), reason
    assert door.refusals == {"slow_reader": 1}
    assert door.peak_pending_reply_bytes <= settings.max_pending_reply_bytes + 127  # one pong past the bound
    assert application.open_legs == 0 and list(application.ended.values()) == ["slow-reader"]
