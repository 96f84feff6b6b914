"""The AudioSocket door's asyncio TCP transport: one connection is one call leg.

A connection from outside the door's ``source_cidrs`` is refused by ``TcpListener`` before a
byte of it is read, answered with an error frame. Per connection: read bytes, cut them into
frames (``frames.FrameReader``), run them through the connection's ``session.Session`` and act
on its events. The UUID frame admits the stream through ``calls.admit`` (route by
``calls.routing.CallFacts``: the peer's address, the UUID as the ``uuid`` attribute, which the
profile's ``metadata_headers`` may publish; the role the route transcribes; room; the leg
opened), its refusals counted as ``no_route``, ``busy`` or ``draining``. Audio goes to the
leg's ``PcmSink`` at 16 kHz (8 kHz through rtp's shared upsampler); keys go to the sink's
``dtmf`` like RFC 4733 key presses. Hangup, an error frame, a closed connection, silence for
``idle_timeout_s``, a frame left incomplete for ``frame_timeout_s`` (a slowloris) or bad input
end the leg and the call; bad input is answered with an error frame whose payload is the reason
as text, and counted in ``refusals`` by reason. Nothing is ever sent back otherwise: the reply
direction stays silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable

from asr_common.addresses import is_loopback_host
from asr_common.audio import SAMPLE_RATE, TELEPHONE_RATE
from asr_common.listener import READ_BYTES, DoorError, Peer, TcpListener
from audiosocket.config import AudioSocketSettings
from audiosocket.errors import PeerError
from audiosocket.frames import FrameReader, Kind, encode
from audiosocket.session import Audio, HungUp, Identified, KeyPressed, PeerFailed, Session
from calls.admit import Refused, open_legs, require_room, route_call, transcribed
from calls.call import CallInfo, LegInfo
from calls.handler import CallHandler
from calls.join import uuid_join_key
from calls.metadata import CallMetadata, listed_headers
from calls.routing import CallFacts, Router
from rtp.dtmf import KeyPress
from rtp.pcm_leg import PcmLeg
from rtp.sink import DtmfSink

log = logging.getLogger(__name__)

RATES = frozenset({TELEPHONE_RATE, SAMPLE_RATE})
"""Audio rates (Hz) the door takes: Asterisk's ``slin`` (0x10) and ``slin16`` (0x12)."""


def _draining_error() -> PeerError:
    return PeerError("draining", "this node is draining; try another")


def _press(leg: PcmLeg, key: str) -> None:
    """Hand ``key`` to the leg's sink like an RFC 4733 key press, timed by the audio received so far."""
    if isinstance(leg.sink, DtmfSink):
        leg.sink.dtmf(KeyPress(key, 0, leg.received_ms))


class AudioSocketServer(TcpListener[AudioSocketSettings]):
    """Listens for AudioSocket connections and hands their legs to ``handler``.

    ``router`` returns the routes in force (the service swaps them on reload). ``refusals``
    counts connections ended for bad input or by a limit, by reason; ``legs`` counts legs opened.
    """

    door = "audiosocket"

    def __init__(self, settings: AudioSocketSettings, handler: CallHandler, router: Callable[[], Router]) -> None:
        super().__init__(settings)
        self.handler = handler
        self.router = router
        self.legs = 0

    async def start(self) -> None:
        await self._listen()
        if not self.settings.source_cidrs and not is_loopback_host(self.settings.host):
            log.warning(
                "audiosocket listens on %s and takes any source: AudioSocket has no authentication; "
                "list your Asterisk servers in audiosocket.source_cidrs",
                self.settings.host,
            )

    async def _serve(self, peer: Peer) -> None:
        if self.draining:
            await self.refuse(peer, _draining_error())
        elif self.over_source_cap(peer.host):
            limit = self.max_connections_per_source
            error = PeerError("source_connections", f"more than {limit} connections from {peer.host}")
            await self.refuse(peer, error)
        else:
            await _Connection(self, peer).run()

    async def _answer_refusal(self, peer: Peer, error: DoorError) -> None:
        """An error frame carrying ``error.message``, whenever in the stream the door refuses."""
        peer.writer.write(encode(Kind.ERROR, error.message.encode()))
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(peer.writer.drain(), self.settings.frame_timeout_s)


class _Connection:
    """One connection's read loop and its leg."""

    def __init__(self, server: AudioSocketServer, peer: Peer) -> None:
        self.server = server
        self.peer = peer
        self.frames = FrameReader(server.settings.max_frame_bytes)
        self.session = Session(RATES)
        self.call: CallInfo | None = None
        self.leg: PcmLeg | None = None

    async def run(self) -> None:
        reason = "shutdown"
        try:
            reason = await self._read()
        except PeerError as error:
            reason = "protocol-error"
            await self.server.refuse(self.peer, error)
        except ConnectionError:
            reason = "peer-closed"
        finally:
            if self.leg is not None and self.call is not None:
                self.leg.finish()
                self.server.handler.call_ended(self.call, reason)

    async def _read(self) -> str:
        """Read until the stream ends; the call's end reason."""
        settings = self.server.settings
        partial_since: float | None = None  # when the incomplete frame's first byte came
        while True:
            timeout = settings.idle_timeout_s
            if partial_since is not None:
                timeout = min(timeout, partial_since + settings.frame_timeout_s - time.monotonic())
            try:
                data = await asyncio.wait_for(self.peer.reader.read(READ_BYTES), max(timeout, 0.0))
            except TimeoutError:
                if partial_since is not None and self.frames.buffered:
                    message = f"AudioSocket frame incomplete after {settings.frame_timeout_s} s"
                    raise PeerError("slow_frame", message) from None
                raise PeerError("idle_timeout", f"no AudioSocket data for {settings.idle_timeout_s} s") from None
            if not data:
                if self.frames.buffered:
                    raise PeerError(
                        "truncated", f"AudioSocket connection closed within a frame ({self.frames.buffered} bytes)"
                    )
                return "peer-closed"
            self.frames.receive_data(data)
            while (frame := self.frames.next_frame()) is not None:
                event = self.session.handle(frame)
                if isinstance(event, Identified):
                    self._open(event.stream_id)
                elif isinstance(event, Audio):
                    if self.leg is not None:
                        self.leg.submit(event.samples, event.rate)
                elif isinstance(event, KeyPressed):
                    if self.leg is not None:
                        _press(self.leg, event.key)
                elif isinstance(event, HungUp):
                    return "hangup"
                elif isinstance(event, PeerFailed):
                    self.server.refusals["peer_error"] += 1
                    return "peer-error"
            if self.frames.buffered:
                partial_since = partial_since or time.monotonic()
            else:
                partial_since = None

    def _open(self, stream_id: uuid.UUID) -> None:
        """Admit the stream named ``stream_id`` and open its leg (none when the route does not
        transcribe its role); a refusal is a ``PeerError`` with ``calls.admit``'s reason."""
        server = self.server
        if server.draining:  # the connection came before the drain, its UUID after
            raise _draining_error()
        attributes = {"uuid": str(stream_id)}
        facts = CallFacts(self.peer.host, "", "", attributes, siprec=False)
        try:
            routed = route_call(server.router(), facts, f"AudioSocket stream {stream_id}")
            profile = routed.profile
            if not transcribed([profile.role], profile):
                return
            require_room(server.handler, 1)
            call_id = uuid.uuid4().hex
            leg = LegInfo(leg_id=f"{call_id}-0", label=None, role=profile.role, aor=None, codec="slin")
            call = CallInfo.unaddressed(
                call_id=call_id,
                source="audiosocket",
                source_call_id=str(stream_id),
                peer=(self.peer.host, self.peer.port, "tcp"),
                route=routed.route,
                profile=profile,
                legs=(leg,),
                metadata=CallMetadata(headers=listed_headers(attributes, profile.metadata_headers)),
                join_key=uuid_join_key(profile.join_by, stream_id.hex),
            )
            (sink,) = open_legs(server.handler, call)
        except Refused as refused:
            raise PeerError(refused.reason, refused.message) from None
        server.legs += 1
        self.call, self.leg = call, PcmLeg(sink)
