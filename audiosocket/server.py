"""The AudioSocket door's asyncio TCP transport: one connection is one call leg.

Per connection: read bytes, cut them into frames (``frames.FrameReader``), run them through
the connection's ``session.Session`` and act on its events. The UUID frame routes the stream
(``calls.routing.CallFacts``: the peer's address, the UUID as the ``uuid`` attribute), asks the
application for room (``has_capacity``, then ``open_leg``) and opens the leg; audio goes to
the leg's ``PcmSink`` at 16 kHz (8 kHz through rtp's shared upsampler); keys go to the sink's
``dtmf`` like RFC 4733 key presses. Hangup, an error frame, a closed connection, silence for
``idle_timeout_s``, a frame left incomplete for ``frame_timeout_s`` (a slowloris) or bad input
end the leg and the call; bad input is answered with an error frame whose payload is the
reason as text, and counted in ``refusals`` by reason. Nothing is ever sent back otherwise:
the reply direction stays silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable

from asr_common.audio import SAMPLE_RATE, TELEPHONE_RATE, PcmSink
from asr_common.errors import CapacityError
from asr_common.listener import Peer, TcpListener
from audiosocket.config import AudioSocketSettings
from audiosocket.errors import PeerError
from audiosocket.frames import FrameReader, Kind, encode
from audiosocket.session import Audio, HungUp, Identified, KeyPressed, PeerFailed, Session
from calls.call import CallInfo, LegInfo
from calls.handler import CallHandler
from calls.join import uuid_join_key
from calls.metadata import CallMetadata
from calls.routing import CallFacts, Router
from rtp.dtmf import KeyPress
from rtp.resample import PassThroughStream, UpsamplerStream, model_rate_stream
from rtp.sink import DtmfSink

log = logging.getLogger(__name__)

RATES = frozenset({TELEPHONE_RATE, SAMPLE_RATE})
"""Audio rates (Hz) the door takes: Asterisk's ``slin`` (0x10) and ``slin16`` (0x12)."""
READ_BYTES = 65536


class _Leg:
    """An open leg: the call, its sink, and the stream bringing its audio to 16 kHz."""

    def __init__(self, call: CallInfo, leg: LegInfo, sink: PcmSink) -> None:
        self.call = call
        self.leg = leg
        self.sink = sink
        self.resampler: UpsamplerStream | PassThroughStream | None = None
        self.samples = 0  # received, at the connection's rate

    def audio(self, event: Audio) -> None:
        if self.resampler is None:
            self.resampler = model_rate_stream(event.rate, self.sink.accept_waveform)
        self.resampler.submit(event.samples)
        self.samples += len(event.samples)

    def key(self, key: str, rate: int | None) -> None:
        if isinstance(self.sink, DtmfSink):
            at_ms = self.samples * 1000 // rate if rate else 0
            self.sink.dtmf(KeyPress(key, 0, at_ms))

    def finish(self) -> None:
        if self.resampler is not None:
            self.resampler.flush()
        self.sink.input_finished()


class AudioSocketServer(TcpListener):
    """Listens for AudioSocket connections and hands their legs to ``handler``.

    ``router`` returns the routes in force (the service swaps them on reload). ``refusals``
    counts connections ended for bad input or by a limit, by reason; ``legs`` counts legs opened.
    """

    def __init__(self, settings: AudioSocketSettings, handler: CallHandler, router: Callable[[], Router]) -> None:
        super().__init__(settings.max_connections_per_source)
        self.settings = settings
        self.handler = handler
        self.router = router
        self.legs = 0

    async def start(self) -> None:
        await self._listen(self.settings.host, self.settings.port)
        log.info("audiosocket listening on %s:%d", self.settings.host, self.port)

    async def _serve(self, peer: Peer) -> None:
        if self.draining:
            await self.refuse(peer.writer, PeerError("draining", "this node is draining; try another"))
        elif self.over_source_cap(peer.host):
            limit = self.max_connections_per_source
            error = PeerError("source_connections", f"more than {limit} connections from {peer.host}")
            await self.refuse(peer.writer, error)
        else:
            await _Connection(self, peer).run()

    async def refuse(self, writer: asyncio.StreamWriter, error: PeerError) -> None:
        """Count ``error`` and answer it with an error frame carrying its message."""
        self.refusals[error.reason] += 1
        log.info("audiosocket %s: %s", error.reason, error.message)
        writer.write(encode(Kind.ERROR, error.message.encode()))
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(writer.drain(), self.settings.frame_timeout_s)


class _Connection:
    """One connection's read loop and its leg."""

    def __init__(self, server: AudioSocketServer, peer: Peer) -> None:
        self.server = server
        self.peer = peer
        self.frames = FrameReader(server.settings.max_frame_bytes)
        self.session = Session(RATES)
        self.leg: _Leg | None = None

    async def run(self) -> None:
        reason = "shutdown"
        try:
            reason = await self._read()
        except PeerError as error:
            reason = "protocol-error"
            await self.server.refuse(self.peer.writer, error)
        except ConnectionError:
            reason = "peer-closed"
        finally:
            if self.leg is not None:
                self.leg.finish()
                self.server.handler.call_ended(self.leg.call, reason)

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
                        self.leg.audio(event)
                elif isinstance(event, KeyPressed):
                    if self.leg is not None:
                        self.leg.key(event.key, self.session.rate)
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
        """Route the stream named ``stream_id`` and open its leg (not when its role is not transcribed)."""
        server = self.server
        facts = CallFacts(self.peer.host, "", "", {"uuid": str(stream_id)}, siprec=False)
        decision = server.router().decide(facts)
        profile = decision.profile
        if profile is None:
            raise PeerError("no_route", f"no route takes AudioSocket stream {stream_id} (code {decision.reject_code})")
        if profile.role not in profile.transcribe:
            return
        if not server.handler.has_capacity(1):
            raise PeerError("busy", "no room for another stream; try another node")
        call_id = uuid.uuid4().hex
        leg = LegInfo(leg_id=f"{call_id}-0", label=None, role=profile.role, aor=None, codec="slin")
        call = CallInfo.unaddressed(
            call_id=call_id,
            source="audiosocket",
            source_call_id=str(stream_id),
            peer=(self.peer.host, self.peer.port, "tcp"),
            route=decision.route,
            profile=profile,
            legs=(leg,),
            metadata=CallMetadata(headers=(("uuid", str(stream_id)),)),
            join_key=uuid_join_key(profile.join_by, stream_id.hex),
        )
        try:
            sink = server.handler.open_leg(call, leg)
        except CapacityError as exc:
            raise PeerError("busy", f"no room for another stream ({exc}); try another node") from None
        server.legs += 1
        self.leg = _Leg(call, leg, sink)
