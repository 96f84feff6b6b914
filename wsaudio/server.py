"""The WebSocket door's asyncio transport: wsproto (sans-IO) over asyncio streams.

A connection from outside the door's ``source_cidrs`` is refused by ``TcpListener`` before its
handshake is read: answered with HTTP 403 and closed. Per connection, its states kept by
``lifecycle.Lifecycle``: the upgrade request picks the dialect (``protocol.read_handshake``)
and must carry one of the door's ``bearer_tokens`` (when it has any) before anything else is
read; the first text message starts the stream: it is admitted through ``calls.admit`` (routed
by the peer's address and the stream's attributes, the route's own ``bearer_token`` checked on
top of the door's, room asked of the application, every leg opened or none); binary messages
are its audio, written at 16 kHz into the legs' sinks. The application's events for the call
come back through ``watch`` and are sent as text messages in the dialect's form, one at a time,
each after the transport drained the last (``_Outbox``); a client whose unread replies pass
``max_pending_replies`` or ``max_pending_reply_bytes`` is closed as a slow reader (1008), its
call's input ended (the call still ends and publishes as any other). The end signal (or, for
``mod_audio_fork``, the close) ends the input; the door closes after the call's last event
(``call.ended``). Bad input, a silent connection, a slow reader and the per-source cap close
the connection with an RFC 6455 code and the reason as text, counted in ``refusals`` by reason;
after its close the door reads and drops what the peer still sends until the peer's close
(``idle_timeout_s`` at most).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
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

from asr_common.listener import READ_BYTES, DoorError, Peer, TcpListener
from calls.admit import Refused, Routed, open_legs, require_room, route_call, transcribed
from calls.call import CallInfo, CallSource, LegInfo
from calls.handler import CallHandler
from calls.metadata import CallMetadata, listed_headers
from calls.profile import Profile
from calls.routing import CallFacts, Router
from rtp.pcm_leg import PcmLeg
from wsaudio.config import REPLY_WRITE_BUFFER_BYTES, WebSocketSettings
from wsaudio.errors import CLOSE_POLICY, CLOSE_TOO_BIG, CLOSE_TRY_LATER, PeerError
from wsaudio.lifecycle import Lifecycle, State, Trigger
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
    token_matches,
    wenet_reply,
)

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
RESULTS_TIMEOUT_S = 120.0
"""After the end of input, how long (s) the last finals may take before the connection closes."""
FLUSH_TIMEOUT_S = 1.0
"""Once closed, how long (s) the transport may take to hand its last bytes to the kernel."""
MAX_CLOSE_REASON = 120
"""Characters of a close frame's reason (RFC 6455: at most 123 bytes of payload)."""
Watch = Callable[[str, Callable[[dict[str, Any]], None]], None]
"""``CallBridge.watch``: hand a call's events to a listener (called on another thread)."""


class WebSocketServer(TcpListener[WebSocketSettings]):
    """Listens for WebSocket audio streams and hands their legs to ``handler``.

    ``router`` returns the routes in force; ``watch``/``unwatch`` subscribe a call's events;
    ``allowed_chunk_ms`` are the chunk sizes the engine serves (a client of our dialect picks
    one of them); ``tls``, when given, makes it a wss:// server. ``refusals`` counts
    connections closed for bad input or by a limit; ``legs`` the legs opened;
    ``peak_pending_reply_bytes`` the most reply bytes one connection held unread at once
    (queued, and in its transport's buffer), never above ``max_pending_reply_bytes`` plus the
    one reply that passed it.
    """

    def __init__(
        self, settings: WebSocketSettings, handler: CallHandler, router: Callable[[], Router], watch: Watch,
        unwatch: Callable[[str], None], allowed_chunk_ms: tuple[int, ...], tls: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        super().__init__(settings)
        self.handler = handler
        self.router = router
        self.watch = watch
        self.unwatch = unwatch
        self.allowed_chunk_ms = allowed_chunk_ms
        self.tls = tls
        self.legs = 0
        self.peak_pending_reply_bytes = 0

    door = "websocket"

    async def start(self) -> None:
        await self._listen(self.tls, self.settings.handshake_timeout_s)

    async def _serve(self, peer: Peer) -> None:
        await _Connection(self, peer).run()

    async def _answer_refusal(self, peer: Peer, error: DoorError) -> None:
        """HTTP 403 with the reason as text, written before the peer's handshake is read."""
        peer.writer.write(http_refusal(403, "Forbidden", error.message))
        with contextlib.suppress(TimeoutError, ConnectionError, ssl.SSLError):
            await asyncio.wait_for(peer.writer.drain(), FLUSH_TIMEOUT_S)


def http_refusal(status: int, phrase: str, text: str) -> bytes:
    """A whole HTTP/1.1 response refusing the upgrade: ``status`` with ``text`` as its body."""
    body = text.encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class _Outbox:
    """A connection's replies (WebSocket frames) waiting for the transport, in order, counted.

    A reply goes straight to the transport while the transport keeps up (its buffer under
    ``REPLY_WRITE_BUFFER_BYTES``); once it falls behind, replies wait here (``put``, on the
    event loop) and the connection's sender task writes them one at a time, each after the
    transport drained, so what a client does not read piles up here, where the connection
    bounds it, not in the transport."""

    def __init__(self) -> None:
        self._frames: deque[tuple[bytes, bool]] = deque()
        self._ready = asyncio.Event()
        self.bytes = 0
        """Bytes of the frames queued."""

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame: bytes, last: bool) -> None:
        """Queue ``frame``; ``last``: the call's last event, after which the door closes."""
        self._frames.append((frame, last))
        self.bytes += len(frame)
        self._ready.set()

    async def get(self) -> tuple[bytes, bool]:
        while not self._frames:
            self._ready.clear()
            await self._ready.wait()
        frame, last = self._frames.popleft()
        self.bytes -= len(frame)
        return frame, last

    def clear(self) -> None:
        self._frames.clear()
        self.bytes = 0


class _Connection:
    """One connection: the handshake, the stream's legs, and the replies."""

    def __init__(self, server: WebSocketServer, peer: Peer) -> None:
        self.server = server
        self.settings = server.settings
        self.peer = peer
        self.ws = WSConnection(ConnectionType.SERVER)
        self.lifecycle = Lifecycle()
        self.handshake: Handshake | None = None
        self.start: StreamStart | None = None
        self.call: CallInfo | None = None
        self.legs: list[tuple[int, PcmLeg]] = []
        """The transcribed legs, each with its channel of the stream's audio."""
        self.outbox: _Outbox | None = None
        """The replies waiting for the transport; None when the stream gets none (or no more)."""
        self._watched: str | None = None
        self._sender: asyncio.Task[None] | None = None
        self._message = bytearray()
        self._closing_deadline = 0.0
        transport = peer.writer.transport
        transport.set_write_buffer_limits(high=REPLY_WRITE_BUFFER_BYTES)
        sock = peer.writer.get_extra_info("socket")
        if sock is not None:  # what the kernel holds for a peer that does not read is bounded too
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, REPLY_WRITE_BUFFER_BYTES)

    # -- read loop ------------------------------------------------------------------------

    async def run(self) -> None:
        reason = "shutdown"
        try:
            await self._read()
        except (ConnectionError, ssl.SSLError):
            reason = "peer-closed"
        finally:
            if self.lifecycle.state is not State.CLOSED:
                self._advance(Trigger.ABORT, reason)
            await self._close_transport()

    async def _read(self) -> None:
        opened = time.monotonic()
        while self.lifecycle.state is not State.CLOSED:
            timeout = self._deadline(opened) - time.monotonic()
            try:
                data = await asyncio.wait_for(self.peer.reader.read(READ_BYTES), max(timeout, 0.0))
            except TimeoutError:
                self._on_timeout()
                continue
            self.ws.receive_data(data or None)
            try:
                for event in self.ws.events():
                    if self.lifecycle.state is State.CLOSED:
                        break
                    self._on_event(event)
            except PeerError as error:
                self._refuse(error)
            except (RemoteProtocolError, LocalProtocolError) as exc:
                self._refuse(PeerError("bad_frame", f"WebSocket protocol error: {exc}"))
            if not data and self.lifecycle.state is not State.CLOSED:
                self._advance(Trigger.PEER_CLOSED, "peer-closed")

    def _deadline(self, opened: float) -> float:
        """When (monotonic s) the door stops waiting for the peer in the state it is in."""
        state = self.lifecycle.state
        if state is State.AWAITING_HANDSHAKE:
            return opened + self.settings.handshake_timeout_s
        if state is State.CLOSING:
            return self._closing_deadline
        return time.monotonic() + (RESULTS_TIMEOUT_S if state is State.INPUT_ENDED else self.settings.idle_timeout_s)

    def _on_timeout(self) -> None:
        state = self.lifecycle.state
        if state is State.AWAITING_HANDSHAKE:
            limit = self.settings.handshake_timeout_s
            self._refuse(PeerError("slow_handshake", f"no WebSocket handshake in {limit:g} s"))
        elif state is State.CLOSING:
            log.info("websocket %s did not answer the close in %g s", self.peer.host, self.settings.idle_timeout_s)
            self._advance(Trigger.ABORT)
        elif state is State.INPUT_ENDED:
            self._refuse(PeerError("idle_timeout", f"the call's last results took over {RESULTS_TIMEOUT_S:g} s"))
        else:
            self._refuse(PeerError("idle_timeout", f"no data for {self.settings.idle_timeout_s:g} s"))

    def _on_event(self, event: Event) -> None:
        if isinstance(event, Request):
            self._on_request(event)
        elif isinstance(event, Message):
            if self.lifecycle.state is State.CLOSING:  # after our close: read and dropped
                self._advance(Trigger.AUDIO if isinstance(event, BytesMessage) else Trigger.TEXT)
                return
            self._message += event.data.encode() if isinstance(event, TextMessage) else event.data
            if len(self._message) > self.settings.max_message_bytes:
                limit = self.settings.max_message_bytes
                raise PeerError("oversized", f"message exceeds {limit} bytes", CLOSE_TOO_BIG)
            if event.message_finished:
                data, self._message = bytes(self._message), bytearray()
                if isinstance(event, TextMessage):
                    self._on_text(data.decode())
                else:
                    self._on_audio(data)
        elif isinstance(event, Ping):
            if self.ws.state is ConnectionState.OPEN:
                self._send(event.response())
                self._check_pending()
        elif isinstance(event, CloseConnection):
            self._on_close(event)

    def _on_close(self, event: CloseConnection) -> None:
        if self.ws.state is ConnectionState.REMOTE_CLOSING:  # the peer closes first: answer it
            self._send(event.response())
        elif self.ws.state is not ConnectionState.CLOSED:  # wsproto could not read the peer's frames
            self._refuse(PeerError("bad_frame", f"WebSocket protocol error: {event.reason}", event.code))
            if self.lifecycle.state is not State.CLOSED:
                self._advance(Trigger.ABORT)
            return
        self._advance(Trigger.PEER_CLOSED, "hangup")

    def _on_request(self, request: Request) -> None:
        server = self.server
        if server.draining or server.over_source_cap(self.peer.host):
            if server.draining:
                error = PeerError("draining", "draining; try another node")
            else:
                error = PeerError("source_connections", "too many connections from this address")
            server.count_refusal(error, self.peer.host)
            body = error.message.encode()
            headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
            self._send(RejectConnection(status_code=503, headers=headers, has_body=True))
            self._send(RejectData(data=body))
            self._advance(Trigger.REJECT)
            return
        self.handshake = read_handshake(request.target, list(request.subprotocols), list(request.extra_headers))
        self._send(AcceptConnection(subprotocol=self.handshake.subprotocol))
        self._advance(Trigger.REQUEST)
        tokens = self.settings.bearer_tokens
        if tokens and not token_matches(self.handshake.token, tokens):
            raise PeerError("unauthorized", "this door needs a bearer token (Authorization: Bearer, or ?token=)")

    # -- the stream ----------------------------------------------------------------------

    def _on_text(self, text: str) -> None:
        assert self.handshake is not None
        if self.lifecycle.state is State.AWAITING_START:
            self._open(read_start(self.handshake, text))
        elif self.handshake.dialect == "audio_fork":
            self._advance(Trigger.TEXT)  # mod_audio_fork sends no other text; what a later one adds is ignored
        elif is_end(text):
            self._advance(Trigger.END, "hangup")

    def _on_audio(self, data: bytes) -> None:
        self._advance(Trigger.AUDIO)
        assert self.start is not None
        channels = split_channels(data, self.start.channels)  # checked even when no leg is transcribed
        for channel, leg in self.legs:
            leg.submit(channels[channel], self.start.sample_rate)

    def _open(self, start: StreamStart) -> None:
        """Admit the stream (``calls.admit``), open its legs, start its replies and say ready;
        a refusal is a ``PeerError`` with ``calls.admit``'s reason."""
        server, handshake = self.server, self.handshake
        assert handshake is not None
        facts = CallFacts(self.peer.host, "", "", start.attributes, siprec=False)
        try:
            routed = route_call(server.router(), facts, "this stream")
            self._check_route_token(routed, handshake.token)
            profile = self._stream_profile(routed.profile, start)
            chosen = transcribed(roles_of(start.mix, tuple(profile.roles.label_order)), profile)
            require_room(server.handler, len(chosen))
            call_id = uuid.uuid4().hex
            legs = tuple(
                LegInfo(leg_id=f"{call_id}-{i}", label=str(i), role=role, aor=None, codec=f"L16/{start.sample_rate}")
                for i, role in chosen
            )
            source: CallSource = "audio_fork" if handshake.dialect == "audio_fork" else "websocket"
            call = CallInfo.unaddressed(
                call_id=call_id,
                source=source,
                source_call_id=start.attributes.get("uuid") or call_id,
                peer=(self.peer.host, self.peer.port, "ws"),
                route=routed.route,
                profile=profile,
                legs=legs,
                metadata=CallMetadata(headers=listed_headers(start.attributes, profile.metadata_headers)),
            )
            if handshake.dialect != "audio_fork" or profile.send_events:
                self._start_replies(call_id)  # before the legs open, so call.started is not missed
            try:
                sinks = open_legs(server.handler, call)
            except BaseException:
                self._stop_replies()
                raise
        except Refused as refused:
            code = CLOSE_POLICY if refused.reason == "no_route" else CLOSE_TRY_LATER
            raise PeerError(refused.reason, refused.message, code) from None
        self.call, self.start = call, start
        self.legs = [(int(leg.label or 0), PcmLeg(sink)) for leg, sink in zip(legs, sinks, strict=True)]
        server.legs += len(self.legs)
        self._advance(Trigger.START)
        ready = server_ready(handshake.dialect, call_id, start, profile.chunk_ms, profile.left_chunks)
        if ready is not None:
            self._send(TextMessage(data=ready))

    @staticmethod
    def _check_route_token(routed: Routed, offered: str | None) -> None:
        """A route's own token, asked on top of the door's: PeerError unless ``offered`` is it."""
        required = routed.profile.bearer_token
        if required is not None and not token_matches(offered, [required]):
            raise PeerError("unauthorized", f"route {routed.route or 'default'} needs its bearer token")

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

    def _advance(self, trigger: Trigger, reason: str = "hangup") -> None:
        """Move the lifecycle on by ``trigger`` and do what leaving a state asks; ``reason`` is the
        call's end reason when this ends its input."""
        transition = self.lifecycle.handle(trigger)
        if transition.stops_replies:
            self._stop_replies()
        if transition.ends_input:
            for _, leg in self.legs:
                leg.finish()
            if self.call is not None:
                self.server.handler.call_ended(self.call, reason)

    # -- replies -------------------------------------------------------------------------

    def _start_replies(self, call_id: str) -> None:
        loop = asyncio.get_running_loop()

        def listener(event: dict[str, Any]) -> None:  # on the application's worker thread
            loop.call_soon_threadsafe(self._on_reply, event)

        self.outbox = _Outbox()
        self._watched = call_id
        self.server.watch(call_id, listener)
        self._sender = asyncio.create_task(self._send_replies(self.outbox), name=f"ws-replies-{call_id}")

    def _stop_replies(self) -> None:
        """No more replies: forget the call's listener, drop what is queued, stop the sender."""
        if self.outbox is None:
            return
        self.outbox.clear()
        self.outbox = None
        if self._watched is not None:
            self.server.unwatch(self._watched)
        if self._sender is not None and self._sender is not asyncio.current_task():
            self._sender.cancel()

    def _on_reply(self, event: dict[str, Any]) -> None:
        """One event of the call (on the event loop), in the dialect's form: written while the
        transport keeps up, else queued behind the replies already waiting."""
        outbox = self.outbox
        if outbox is None or not self.lifecycle.replying:
            return
        assert self.handshake is not None and self.start is not None
        last = event.get("event_type") == "call.ended"
        if self.handshake.dialect == "wenet":
            text = SPEECH_END if last else wenet_reply(event, self.start.nbest)
        else:
            text = json.dumps(event, ensure_ascii=False)
        if text is None:
            return
        frame = self.ws.send(TextMessage(data=text))
        if outbox or self.peer.writer.transport.get_write_buffer_size() > REPLY_WRITE_BUFFER_BYTES:
            outbox.put(frame, last)  # the client is behind: the sender writes it once the transport drained
            self._check_pending()
        elif not self.peer.writer.is_closing():
            self.peer.writer.write(frame)
            if last:
                self._close(Trigger.CALL_ENDED, CLOSE_NORMAL, "end of stream")

    def _check_pending(self) -> None:
        """Close the connection as a slow reader once what it has not read passes the door's bounds:
        replies queued (``max_pending_replies``), their bytes and the transport's
        (``max_pending_reply_bytes``)."""
        queued, queued_bytes = (len(self.outbox), self.outbox.bytes) if self.outbox is not None else (0, 0)
        pending = queued_bytes + self.peer.writer.transport.get_write_buffer_size()
        server = self.server
        server.peak_pending_reply_bytes = max(server.peak_pending_reply_bytes, pending)
        if queued > self.settings.max_pending_replies or pending > self.settings.max_pending_reply_bytes:
            error = PeerError(
                "slow_reader",
                f"slow reader: {queued} replies ({pending} bytes) not read; the door keeps "
                f"{self.settings.max_pending_replies} ({self.settings.max_pending_reply_bytes} bytes)",
            )
            self._refuse(error, ended="slow-reader")

    async def _send_replies(self, outbox: _Outbox) -> None:
        """Write the call's replies, each once the transport drained the last, until ``call.ended``;
        then close (1000)."""
        writer = self.peer.writer
        try:
            while True:
                frame, last = await outbox.get()
                if writer.is_closing():
                    return
                writer.write(frame)
                await writer.drain()
                if last:
                    break
        except (ConnectionError, ssl.SSLError):
            return  # the read loop sees the connection's end
        if self.lifecycle.replying:
            self._close(Trigger.CALL_ENDED, CLOSE_NORMAL, "end of stream")

    # -- closing -------------------------------------------------------------------------

    def _refuse(self, error: PeerError, ended: str = "protocol-error") -> None:
        """Count ``error`` (once per connection) and close with its code; ``ended``: the call's end reason."""
        state = self.lifecycle.state
        if state in (State.CLOSING, State.CLOSED):
            if state is State.CLOSING:
                self._advance(Trigger.ABORT)
            return
        self.server.count_refusal(error, self.peer.host)
        if state is State.AWAITING_HANDSHAKE:  # no WebSocket yet to close
            self._advance(Trigger.ABORT, ended)
        else:
            self._close(Trigger.REFUSE, error.close_code or CLOSE_POLICY, error.message, ended)

    def _close(self, trigger: Trigger, code: int, reason: str, ended: str = "hangup") -> None:
        """Send the door's close frame and wait (``idle_timeout_s`` at most) for the peer's."""
        self._advance(trigger, ended)
        with contextlib.suppress(LocalProtocolError):
            self._send(CloseConnection(code=code, reason=reason[:MAX_CLOSE_REASON]))
        self._closing_deadline = time.monotonic() + self.settings.idle_timeout_s

    async def _close_transport(self) -> None:
        """Close the socket once the transport has written what it holds, or drop it."""
        writer = self.peer.writer
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), FLUSH_TIMEOUT_S)
        except (TimeoutError, OSError):
            writer.transport.abort()

    def _send(self, event: Event) -> None:
        if not self.peer.writer.is_closing():
            self.peer.writer.write(self.ws.send(event))
