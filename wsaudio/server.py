"""The WebSocket door's asyncio transport: wsproto (sans-IO) over asyncio streams.

Per connection: the upgrade request picks the dialect (``protocol.read_handshake``); the first
text message starts the stream: it is routed (``calls.routing.CallFacts``: the peer's address
and the stream's attributes), its token checked against the route's ``bearer_token``, room
asked of the application (``has_capacity``, then ``open_leg`` per leg) and its legs opened;
binary messages are its audio, written at 16 kHz into the legs' sinks. The application's
events for the call come back through ``watch`` and are sent as text messages in the
dialect's form. The end signal (or, for ``mod_audio_fork``, the close) ends the input; the
connection closes after the call's last final (``call.ended``). Bad input, a silent
connection and the per-source cap close the connection with an RFC 6455 code and the reason
as text, counted in ``refusals`` by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import ssl
import time
import uuid
from collections.abc import Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from asr_common.audio import PcmSink
from asr_common.errors import CapacityError
from asr_common.listener import Peer, TcpListener
from calls.call import CallInfo, CallSource, LegInfo
from calls.handler import CallHandler
from calls.metadata import CallMetadata
from calls.profile import Profile
from calls.routing import CallFacts, Router
from rtp.resample import PassThroughStream, UpsamplerStream, model_rate_stream
from wsaudio.config import WebSocketSettings
from wsaudio.errors import CLOSE_POLICY, CLOSE_TOO_BIG, CLOSE_TRY_LATER, PeerError
from wsaudio.protocol import (
    SPEECH_END,
    Handshake,
    StreamStart,
    is_end,
    read_handshake,
    read_start,
    roles_of,
    server_ready,
    split_channels,
    wenet_reply,
)

log = logging.getLogger(__name__)

READ_BYTES = 65536
CLOSE_NORMAL = 1000
RESULTS_TIMEOUT_S = 120.0
"""After the end of input, how long (s) the last finals may take before the connection closes."""
Watch = Callable[[str, Callable[[dict[str, Any]], None]], None]
"""``CallBridge.watch``: hand a call's events to a listener (called on another thread)."""


class WebSocketServer(TcpListener):
    """Listens for WebSocket audio streams and hands their legs to ``handler``.

    ``router`` returns the routes in force; ``watch``/``unwatch`` subscribe a call's events;
    ``allowed_chunk_ms`` are the chunk sizes the engine serves (a client of our dialect picks
    one of them); ``tls``, when given, makes it a wss:// server. ``refusals`` counts
    connections closed for bad input or by a limit; ``legs`` the legs opened.
    """

    def __init__(
        self, settings: WebSocketSettings, handler: CallHandler, router: Callable[[], Router], watch: Watch,
        unwatch: Callable[[str], None], allowed_chunk_ms: tuple[int, ...], tls: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        super().__init__(settings.max_connections_per_source)
        self.settings = settings
        self.handler = handler
        self.router = router
        self.watch = watch
        self.unwatch = unwatch
        self.allowed_chunk_ms = allowed_chunk_ms
        self.tls = tls
        self.legs = 0

    async def start(self) -> None:
        await self._listen(self.settings.host, self.settings.port, self.tls, self.settings.handshake_timeout_s)
        log.info("websocket listening on %s:%d%s", self.settings.host, self.port, " (tls)" if self.tls else "")

    async def _serve(self, peer: Peer) -> None:
        await _Connection(self, peer).run()


class _Leg:
    def __init__(self, leg: LegInfo, sink: PcmSink, rate: int) -> None:
        self.leg = leg
        self.sink = sink
        self.resampler: UpsamplerStream | PassThroughStream = model_rate_stream(rate, sink.accept_waveform)

    def finish(self) -> None:
        self.resampler.flush()
        self.sink.input_finished()


class _Connection:
    """One connection: the handshake, the stream's legs, and the replies."""

    def __init__(self, server: WebSocketServer, peer: Peer) -> None:
        self.server = server
        self.peer = peer
        self.ws = WSConnection(ConnectionType.SERVER)
        self.handshake: Handshake | None = None
        self.start: StreamStart | None = None
        self.call: CallInfo | None = None
        self.legs: list[_Leg] = []
        self.send_events = False
        self.input_ended = False
        self.closed = False
        self._message = bytearray()
        self._replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None

    # -- read loop ------------------------------------------------------------------------

    async def run(self) -> None:
        reason = "shutdown"
        try:
            reason = await self._read()
        except PeerError as error:
            reason = "protocol-error"
            self._refuse(error)
        except (RemoteProtocolError, LocalProtocolError) as exc:
            reason = "protocol-error"
            self._refuse(PeerError("bad_frame", f"WebSocket protocol error: {exc}"))
        except (ConnectionError, ssl.SSLError):
            reason = "peer-closed"
        finally:
            self._end_input(reason)
            if self._sender is not None:
                self._sender.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.peer.writer.drain(), 1.0)

    async def _read(self) -> str:
        settings = self.server.settings
        opened = time.monotonic()
        while not self.closed:
            if self.handshake is None:
                timeout = opened + settings.handshake_timeout_s - time.monotonic()
            elif self.input_ended:
                timeout = RESULTS_TIMEOUT_S
            else:
                timeout = settings.idle_timeout_s
            try:
                data = await asyncio.wait_for(self.peer.reader.read(READ_BYTES), max(timeout, 0.0))
            except TimeoutError:
                if self.handshake is None:
                    self.server.refusals["slow_handshake"] += 1
                    return "protocol-error"
                what = "the last results" if self.input_ended else "data"
                raise PeerError("idle_timeout", f"no {what} for {timeout:g} s") from None
            self.ws.receive_data(data or None)
            for event in self.ws.events():
                self._on_event(event)
            if not data:
                return "hangup" if self.input_ended else "peer-closed"
        return "hangup"

    def _on_event(self, event: Event) -> None:
        if isinstance(event, Request):
            self._on_request(event)
        elif isinstance(event, Message):
            self._message += event.data.encode() if isinstance(event, TextMessage) else event.data
            if len(self._message) > self.server.settings.max_message_bytes:
                limit = self.server.settings.max_message_bytes
                raise PeerError("oversized", f"message exceeds {limit} bytes", CLOSE_TOO_BIG)
            if event.message_finished:
                data, self._message = bytes(self._message), bytearray()
                if isinstance(event, TextMessage):
                    self._on_text(data.decode())
                else:
                    self._on_audio(data)
        elif isinstance(event, Ping):
            self._send(event.response())
        elif isinstance(event, CloseConnection):
            if self.ws.state is not ConnectionState.CLOSED:
                self._send(event.response())
            self.closed = True

    def _on_request(self, request: Request) -> None:
        server = self.server
        if server.draining or server.over_source_cap(self.peer.host):
            reason = "draining" if server.draining else "source_connections"
            server.refusals[reason] += 1
            body = b"draining; try another node" if server.draining else b"too many connections from this address"
            headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
            self._send(RejectConnection(status_code=503, headers=headers, has_body=True))
            self._send(RejectData(data=body))
            self.closed = True
            return
        self.handshake = read_handshake(request.target, list(request.subprotocols), list(request.extra_headers))
        self._send(AcceptConnection(subprotocol=self.handshake.subprotocol))

    # -- the stream ----------------------------------------------------------------------

    def _on_text(self, text: str) -> None:
        assert self.handshake is not None
        if self.start is None:
            self._open(read_start(self.handshake, text))
        elif self.handshake.dialect == "audio_fork":
            return  # mod_audio_fork sends no other text; ignore what a later version might add
        elif is_end(text) and not self.input_ended:
            self._end_input("hangup")

    def _on_audio(self, data: bytes) -> None:
        if self.start is None:
            raise PeerError("audio_before_start", "binary message before the start message")
        if self.input_ended:
            raise PeerError("audio_after_end", "binary message after the end signal")
        channels = split_channels(data, self.start.channels)  # checked even when no leg is transcribed
        for leg in self.legs:
            leg.resampler.submit(channels[int(leg.leg.label or 0)])

    def _open(self, start: StreamStart) -> None:
        server, handshake = self.server, self.handshake
        assert handshake is not None
        decision = server.router().decide(CallFacts(self.peer.host, "", "", start.attributes, siprec=False))
        profile = decision.profile
        if profile is None:
            raise PeerError("no_route", f"no route takes this stream (code {decision.reject_code})")
        if profile.bearer_token is not None and not hmac.compare_digest(
            (handshake.token or "").encode(), profile.bearer_token.get_secret_value().encode()
        ):
            raise PeerError("unauthorized", f"route {decision.route or 'default'} needs its bearer token")
        profile = self._stream_profile(profile, start)
        roles = roles_of(start.mix, tuple(profile.roles.label_order))
        transcribed = [(i, role) for i, role in enumerate(roles) if role in profile.transcribe]
        if not server.handler.has_capacity(len(transcribed)):
            raise PeerError("busy", "no room for another stream; try another node", CLOSE_TRY_LATER)
        call_id = uuid.uuid4().hex
        source: CallSource = "audio_fork" if handshake.dialect == "audio_fork" else "websocket"
        listed = {name.lower(): name for name in profile.metadata_headers}
        headers = tuple((listed[k.lower()], v) for k, v in start.attributes.items() if k.lower() in listed)
        legs = tuple(
            LegInfo(leg_id=f"{call_id}-{i}", label=str(i), role=role, aor=None, codec=f"L16/{start.sample_rate}")
            for i, role in transcribed
        )
        self.call = CallInfo.unaddressed(
            call_id=call_id,
            source=source,
            source_call_id=start.attributes.get("uuid") or call_id,
            peer=(self.peer.host, self.peer.port, "ws"),
            route=decision.route,
            profile=profile,
            legs=legs,
            metadata=CallMetadata(headers=headers),
        )
        self.start = start
        self.send_events = handshake.dialect != "audio_fork" or profile.send_events
        if self.send_events:
            loop = asyncio.get_running_loop()

            def listener(event: dict[str, Any]) -> None:  # on the application's worker thread
                loop.call_soon_threadsafe(self._replies.put_nowait, event)

            server.watch(call_id, listener)
            self._sender = asyncio.create_task(self._send_replies(), name=f"ws-replies-{call_id}")
        for leg in legs:
            try:
                sink = server.handler.open_leg(self.call, leg)
            except CapacityError as exc:
                if not self.legs:
                    server.unwatch(call_id)
                    self.call = None
                raise PeerError("busy", f"no room for another stream ({exc})", CLOSE_TRY_LATER) from None
            self.legs.append(_Leg(leg, sink, start.sample_rate))
            server.legs += 1
        ready = server_ready(handshake.dialect, call_id, start, profile.chunk_ms, profile.left_chunks)
        if ready is not None:
            self._send(TextMessage(data=ready))

    def _stream_profile(self, profile: Profile, start: StreamStart) -> Profile:
        """The route's profile with the chunk size and left chunks our client asked for, within
        the route's bounds: a chunk size the engine serves, at most the route's left chunks."""
        update: dict[str, int] = {}
        if start.chunk_ms is not None:
            if start.chunk_ms not in self.server.allowed_chunk_ms:
                allowed = ", ".join(map(str, self.server.allowed_chunk_ms))
                raise PeerError("bad_start", f"chunk_ms {start.chunk_ms} is not one this server serves ({allowed})")
            update["chunk_ms"] = start.chunk_ms
        if start.left_chunks is not None:
            if not 1 <= start.left_chunks <= profile.left_chunks:
                raise PeerError("bad_start", f"left_chunks {start.left_chunks} is not in 1-{profile.left_chunks}")
            update["left_chunks"] = start.left_chunks
        return profile.model_copy(update=update) if update else profile

    def _end_input(self, reason: str) -> None:
        """No more audio: finish the legs and end the call (once)."""
        if self.input_ended:
            return
        self.input_ended = True
        for leg in self.legs:
            leg.finish()
        if self.call is not None:
            self.server.handler.call_ended(self.call, reason)

    # -- replies -------------------------------------------------------------------------

    async def _send_replies(self) -> None:
        """Send the call's events in the dialect's form until ``call.ended``, then close."""
        assert self.handshake is not None and self.start is not None
        while True:
            event = await self._replies.get()
            kind = event.get("event_type")
            if self.handshake.dialect == "wenet":
                text = wenet_reply(event, self.start.nbest)
                if kind == "call.ended":
                    text = SPEECH_END
            else:
                text = json.dumps(event, ensure_ascii=False)
            if text is not None and not self.closed:
                self._send(TextMessage(data=text))
            if kind == "call.ended":
                break
        if not self.closed:
            self._send(CloseConnection(code=CLOSE_NORMAL, reason="end of stream"))
            self.closed = True
        self.peer.writer.close()

    def _refuse(self, error: PeerError) -> None:
        self.server.refusals[error.reason] += 1
        log.info("websocket %s from %s: %s", error.reason, self.peer.host, error.message)
        if self.handshake is not None and not self.closed:
            with contextlib.suppress(LocalProtocolError):
                self._send(CloseConnection(code=error.close_code or CLOSE_POLICY, reason=error.message[:120]))
        self.closed = True

    def _send(self, event: Event) -> None:
        if not self.peer.writer.is_closing():
            self.peer.writer.write(self.ws.send(event))
