"""asyncio transports around the sans-IO ``UasCore``: UDP, TCP and TLS listeners, RTP legs.

``SipServer`` owns the sockets and one worker task that performs the core's actions in order
(send, open/update/close RTP legs, tell the application a call ended once its legs are
flushed). The core's timers run on ``loop.call_at``; the core's clock is ``loop.time()``.

Connections (RFC 3261 18, RFC 5923): a response goes back on the connection its request came
on; when that one has closed (a peer that hung up its TCP before our final answer), on an open
or new connection to the top Via's address (``SendMessage.connection_target``, 18.2.2), found
and opened the same way as a request's. A request we send in a dialog (BYE, session refresh
UPDATE) over TCP/TLS uses, in order: the connection the dialog came on, a connection the peer
offered for its address with a Via ``alias``, an open connection to or from the next hop's
address, or a new connection to the next hop (``Call.next_hop``), which is then read like an
accepted one and kept for reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, runtime_checkable

from asr_common.audio import PcmSink
from calls.handler import CallHandler
from calls.routing import Router
from rtp.leg import END_RTCP_BYE, RtpLeg
from rtp.srtp import SrtpKeys
from sip.actions import Action, CallEnded, LegUpdated, SendMessage, StartMedia, StopMedia, UpdateMedia
from sip.call_media import PortSource
from sip.config import SipSettings
from sip.errors import SipParseError
from sip.framing import StreamFramer
from sip.message import Address
from sip.uas import UasCore

log = logging.getLogger(__name__)
_READ_BYTES = 65536
# A peer that hangs up often stops its stream first: pjmedia (pjsua, many softphones) sends its
# RTCP BYE about 1 ms before the SIP BYE. Hanging up on the RTCP BYE at once records the wrong
# end reason and crosses our BYE with the peer's; waiting this long lets the peer's BYE arrive.
RTCP_BYE_GRACE_S = 0.5


class MediaLeg(Protocol):
    """What the server needs of an RTP leg (``rtp.leg.RtpLeg``)."""

    async def open(self, host: str, port: int) -> None: ...

    def set_payload_types(self, payload_types: dict[int, str]) -> None: ...

    def set_hold(self, on_hold: bool) -> None: ...

    async def close(self) -> object: ...


@runtime_checkable
class AddressedMediaLeg(MediaLeg, Protocol):
    """A leg that checks packet sources against the peer's SDP address (``RtpLeg`` does);
    legs without it (test doubles) simply are not told the address."""

    def set_expected_remote(self, address: tuple[str, int] | None) -> None: ...

    def set_latch(self, mode: str) -> None: ...


@runtime_checkable
class SrtpMediaLeg(MediaLeg, Protocol):
    """A leg that can unprotect SRTP (``RtpLeg`` does). An SRTP stream given to a leg without
    it is hung up (``srtp-unsupported``) rather than decoded as ciphertext."""

    def set_srtp(self, keys: SrtpKeys | None) -> None: ...


LegFactory = Callable[[PcmSink, dict[int, str], Callable[[str], None]], MediaLeg]


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: SipServer) -> None:
        self._server = server

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        self._server.feed(data, Address("udp", str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        log.debug("sip udp error: %s", exc)


class SipServer:
    """The SIP service: ``await start()``, then ``await stop(grace_s)`` to drain and close."""

    def __init__(
        self,
        settings: SipSettings,
        handler: CallHandler,
        ports: PortSource,
        router: Router | None = None,
        *,
        leg_factory: LegFactory | None = None,
        media_host: str | None = None,
    ) -> None:
        self.settings = settings
        self.handler = handler
        self.ports = ports
        self.core = UasCore(settings, handler, ports, router)
        self.media_host = media_host or settings.public_host()
        self._leg_factory = leg_factory or self._rtp_leg
        self._legs: dict[str, tuple[MediaLeg, int]] = {}
        self._closing: dict[str, list[asyncio.Task[None]]] = {}
        self._udp: asyncio.DatagramTransport | None = None
        self._servers: list[asyncio.Server] = []
        self._streams: dict[Address, asyncio.StreamWriter] = {}
        self._streams_by_host: Counter[str] = Counter()
        self._queue: asyncio.Queue[list[Action]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._calls_gone = asyncio.Event()
        self._rtcp_bye_hangups: dict[str, asyncio.TimerHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        settings = self.settings
        if "udp" in settings.transports:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Udp(self), local_addr=(settings.host, settings.port)
            )
            self._udp = transport
            self.core.local_ports["udp"] = transport.get_extra_info("sockname")[1]
        if "tcp" in settings.transports:
            port = self.core.local_ports["udp"] if "udp" in settings.transports else settings.port
            server = await asyncio.start_server(self._serve_stream("tcp"), settings.host, port)
            self._servers.append(server)
            self.core.local_ports["tcp"] = server.sockets[0].getsockname()[1]
        if "tls" in settings.transports:
            if not settings.tls_cert or not settings.tls_key:
                raise ValueError("the tls transport needs sip.tls_cert and sip.tls_key (PEM files)")
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(settings.tls_cert, settings.tls_key)
            server = await asyncio.start_server(
                self._serve_stream("tls"),
                settings.host,
                settings.tls_port,
                ssl=context,
                ssl_handshake_timeout=settings.stream_message_timeout_s,
            )
            self._servers.append(server)
            self.core.local_ports["tls"] = server.sockets[0].getsockname()[1]
        self._worker = asyncio.create_task(self._work())
        log.info("%s", settings.acl_summary())
        for warning in settings.open_settings():
            log.warning("open setting: %s", warning)

    def set_draining(self) -> None:
        self.core.set_draining()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new calls, BYE the active ones, wait up to ``grace_s`` for them to end, then close."""
        self.core.set_draining()
        self._submit(self.core.hangup_all("shutdown", self._now()))
        if self.core.active_calls:
            self._calls_gone.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._calls_gone.wait(), grace_s)
        await self._queue.join()
        for leg_id in list(self._legs):
            self._close_leg(leg_id, "")
        for tasks in list(self._closing.values()):
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()
        for handle in self._rtcp_bye_hangups.values():
            handle.cancel()
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        for writer in list(self._streams.values()):
            writer.close()
        for server in self._servers:
            server.close()
            await server.wait_closed()
        if self._udp is not None:
            self._udp.close()

    @property
    def active_calls(self) -> int:
        return self.core.active_calls

    @property
    def open_connections(self) -> int:
        """TCP/TLS connections open now, accepted or opened by us."""
        return len(self._streams)

    @property
    def counters(self) -> Counter[str]:
        """Everything the core counted; ``responses.<code>`` are the responses by status code."""
        return self.core.counters

    def port(self, transport: str = "udp") -> int:
        return self.core.local_ports[transport]

    # ---- input -------------------------------------------------------------------------

    def _now(self) -> float:
        return (self._loop or asyncio.get_running_loop()).time()

    def feed(self, data: bytes, source: Address) -> None:
        """One datagram or framed message from ``source``: let the core decide, then act."""
        try:
            actions = self.core.receive(data, source, self._now())
        except Exception:
            log.exception("sip core failed on a message from %s:%s", source.host, source.port)
            self.core.counters["errors.internal"] += 1
            return
        self._submit(actions)

    def _serve_stream(
        self, transport: str
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peername")
            source = Address(transport, str(peer[0]), int(peer[1]))
            refusal = self._refuse_connection(source.host)
            if refusal is not None:
                self.core.counters[refusal] += 1
                writer.close()
                return
            self._streams[source] = writer
            await self._run_stream(reader, writer, source)

        return serve

    async def _run_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, source: Address) -> None:
        """Read a registered connection (accepted or opened by us) until it ends, then forget it."""
        self._streams_by_host[source.host] += 1
        try:
            await self._read_stream(reader, writer, source)
        except SipParseError as exc:
            log.info("closing %s connection with %s: %s", source.transport, source.host, exc)
            self.core.counters["dropped.stream_framing"] += 1
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            if self._streams.get(source) is writer:
                del self._streams[source]
            self.core.connection_closed(source)
            self._streams_by_host[source.host] -= 1
            if self._streams_by_host[source.host] <= 0:
                del self._streams_by_host[source.host]
            writer.close()

    def _refuse_connection(self, host: str) -> str | None:
        """Why a new connection from ``host`` is closed at once (the counter to bump), or None."""
        admission = self.core.admission
        if not admission.allowed(host) and self.settings.acl_action == "drop":
            return "acl.denied_connections"
        if not admission.connections_ok(host, self._streams_by_host[host]):
            return "flood.source_connections"
        if len(self._streams) >= admission.max_connections and not admission.trusted(host):
            return "dropped.connections"
        return None

    async def _read_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, source: Address) -> None:
        """Frame and feed messages until the peer closes, stays silent ``stream_idle_timeout_s``,
        or leaves a message incomplete ``stream_message_timeout_s`` after its first byte (slowloris)."""
        settings = self.settings
        framer = StreamFramer(settings.max_message_bytes, settings.max_header_bytes)
        message_deadline: float | None = None
        while True:
            timeout = settings.stream_idle_timeout_s
            if message_deadline is not None:
                timeout = min(timeout, max(0.0, message_deadline - self._now()))
            try:
                data = await asyncio.wait_for(reader.read(_READ_BYTES), timeout)
            except TimeoutError:
                reason = "idle" if message_deadline is None else "message"
                self.core.counters[f"dropped.stream_{reason}_timeout"] += 1
                log.info("closing %s connection from %s: %s timeout", source.transport, source.host, reason)
                return
            if not data:
                return
            framer.feed(data)
            for message in framer:
                self.feed(message, source)
            if framer.keepalives:
                framer.keepalives = 0
                writer.write(b"\r\n")
            if not framer.pending:
                message_deadline = None
            elif message_deadline is None:
                message_deadline = self._now() + settings.stream_message_timeout_s

    # ---- actions -----------------------------------------------------------------------

    def _submit(self, actions: list[Action]) -> None:
        if actions:
            self._queue.put_nowait(actions)
        if not self.core.active_calls:
            self._calls_gone.set()
        self._arm_timer()

    def _arm_timer(self) -> None:
        deadline = self.core.next_deadline()
        if deadline == self._armed_at or self._loop is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = deadline
        self._timer = self._loop.call_at(deadline, self._fire_timers) if deadline is not None else None

    def _fire_timers(self) -> None:
        self._timer = None
        self._armed_at = None
        self._submit(self.core.on_timer(self._now()))

    async def _work(self) -> None:
        while True:
            actions = await self._queue.get()
            try:
                for action in actions:
                    await self._perform(action)
            except Exception:
                log.exception("sip action failed")
                self.core.counters["errors.internal"] += 1
            finally:
                self._queue.task_done()

    async def _perform(self, action: Action) -> None:
        if isinstance(action, SendMessage):
            await self._send(action)
        elif isinstance(action, StartMedia):
            await self._start_media(action)
        elif isinstance(action, UpdateMedia):
            entry = self._legs.get(action.leg.leg_id)
            if entry is not None:
                entry[0].set_payload_types(action.payload_types)
                entry[0].set_hold(action.on_hold)
                if isinstance(entry[0], AddressedMediaLeg):
                    entry[0].set_expected_remote(action.remote)
                if isinstance(entry[0], SrtpMediaLeg):
                    entry[0].set_srtp(action.srtp)
        elif isinstance(action, StopMedia):
            self._close_leg(action.leg_id, action.call_id)
        elif isinstance(action, LegUpdated):
            self.handler.leg_updated(action.call, action.leg)
        elif isinstance(action, CallEnded):
            self._spawn(self._end_call(action))

    async def _send(self, action: SendMessage) -> None:
        data, dest = bytes(action.message), action.dest
        if dest.transport == "udp":
            if self._udp is not None:
                self._udp.sendto(data, (dest.host, dest.port))
            return
        writer = self._open_stream(dest)
        target = action.connection_target() if writer is None else None
        if writer is None and target is not None:
            writer = self._open_stream(self.core.connection_aliases.get(target)) or self._open_stream(target)
            if writer is not None:
                self.core.counters["connections.reused"] += 1
            else:
                writer = await self._connect(target)
        if writer is None:
            self.core.counters["dropped.no_connection"] += 1
            log.info("no %s connection to %s:%s for an outgoing message", dest.transport, dest.host, dest.port)
            return
        writer.write(data)

    def _open_stream(self, address: Address | None) -> asyncio.StreamWriter | None:
        writer = self._streams.get(address) if address is not None else None
        return writer if writer is not None and not writer.is_closing() else None

    async def _connect(self, target: Address) -> asyncio.StreamWriter | None:
        """A new connection to ``target`` (RFC 3261 18.1.1, 18.2.2), read like an accepted
        one; None (counted, logged) when it cannot be opened in ``connect_timeout_s``."""
        settings = self.settings
        context: ssl.SSLContext | None = None
        if target.transport == "tls":
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.tls_ca)
            if not settings.tls_verify_peer:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        elif target.transport != "tcp":
            return None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(target.host, target.port, ssl=context), settings.connect_timeout_s
            )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            self.core.counters["connections.failed"] += 1
            log.warning("cannot open a %s connection to %s:%s: %s", target.transport, target.host, target.port, exc)
            return None
        self.core.counters["connections.opened"] += 1
        self._streams[target] = writer
        self._spawn(self._run_stream(reader, writer, target))
        return writer

    def _rtp_leg(self, sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> MediaLeg:
        return RtpLeg(
            sink=sink,
            payload_types=payload_types,
            reorder_ms=self.settings.rtp_reorder_ms,
            inactivity_timeout_s=self.settings.rtp_inactivity_timeout_s,
            on_end=on_end,
        )

    async def _start_media(self, action: StartMedia) -> None:
        call_id = action.call.call_id

        def on_end(reason: str) -> None:
            if reason != END_RTCP_BYE or self._loop is None:
                self._media_ended(call_id, reason)
            elif call_id not in self._rtcp_bye_hangups:
                self._rtcp_bye_hangups[call_id] = self._loop.call_later(
                    RTCP_BYE_GRACE_S, self._media_ended, call_id, reason
                )

        leg = self._leg_factory(action.sink, action.payload_types, on_end)
        if isinstance(leg, AddressedMediaLeg):
            if action.call.profile.rtp_latch is not None:
                leg.set_latch(action.call.profile.rtp_latch)
            leg.set_expected_remote(action.remote)
        if isinstance(leg, SrtpMediaLeg):
            leg.set_srtp(action.srtp)
        elif action.srtp is not None:
            log.warning("call %s: this media leg cannot unprotect SRTP; hanging up", call_id)
            self.ports.release(action.port)
            self._submit(self.core.media_ended(call_id, "srtp-unsupported", self._now()))
            return
        try:
            await leg.open(self.media_host, action.port)
        except OSError as exc:
            log.warning("cannot bind RTP port %s for call %s: %s", action.port, call_id, exc)
            self.ports.release(action.port)
            self._submit(self.core.media_ended(call_id, "media-bind-failed", self._now()))
            return
        if action.on_hold:
            leg.set_hold(True)
        self._legs[action.leg.leg_id] = (leg, action.port)

    def _media_ended(self, call_id: str, reason: str) -> None:
        """Hang up because the media ended (a no-op when the call has ended meanwhile)."""
        self._rtcp_bye_hangups.pop(call_id, None)
        self._submit(self.core.media_ended(call_id, reason, self._now()))

    def _close_leg(self, leg_id: str, call_id: str) -> None:
        entry = self._legs.pop(leg_id, None)
        if entry is None:
            return
        leg, port = entry

        async def close() -> None:
            try:
                await leg.close()
            finally:
                self.ports.release(port)

        task = asyncio.create_task(close())
        self._closing.setdefault(call_id, []).append(task)

    async def _end_call(self, action: CallEnded) -> None:
        tasks = self._closing.pop(action.call.call_id, [])
        await asyncio.gather(*tasks, return_exceptions=True)
        self.handler.call_ended(action.call, action.reason)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
