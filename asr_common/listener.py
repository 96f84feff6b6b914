"""``TcpListener``: the bookkeeping every asyncio TCP front door needs, written once.

A door (AudioSocket, WebSocket) listens on a port, runs one task per connection, refuses a
connection from outside its ``source_cidrs`` before its protocol reads a byte, counts the
connections from each source address, refuses new ones while draining, counts and logs its
refusals by reason, and on ``stop`` stops listening and cancels and awaits every connection's
task. The door subclasses ``TcpListener`` and keeps only its protocol: ``_serve`` runs one
connection (a ``Peer``), ``_answer_refusal`` tells a refused peer why in the protocol's own
words, and the door decides how (and when in its protocol) to refuse one that is ``draining``
or ``over_source_cap``. Its settings subclass ``ListenerSettings``, its errors ``DoorError``.
Front doors may not import each other; both may import this.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import ssl
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from asr_common.addresses import Network, host_inside

log = logging.getLogger(__name__)

READ_BYTES = 65536
"""The most a door reads from a connection at once (bytes)."""

ListenPort = Annotated[int, Field(ge=0, le=65535, description="TCP port; 0 picks a free one")]
"""A door's port; each door's settings give their own default."""


class ListenerSettings(BaseModel):
    """What every TCP front door's config section has (each door's settings subclass it and
    give ``port`` its default): off by default, on loopback until told otherwise.

    ``source_cidrs`` is the door's own check of who may connect, made before the protocol reads
    anything and so before routing: a route's own ``source_cidrs`` can narrow it, never widen it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    enabled: bool = Field(False, description="listen on this door")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: ListenPort
    source_cidrs: list[Network] = Field(
        default_factory=list,
        description="sources allowed to connect, checked before anything is read or routed; empty: any that can "
        "reach host",
    )
    idle_timeout_s: float = Field(10.0, gt=0, description="close a connection that sends nothing this long")
    max_connections_per_source: int = Field(200, ge=1, description="open connections per source IP; more are refused")


class DoorError(Exception):
    """A connection a door ends because of its peer (bad input, a limit, a source it does not
    take): ``reason`` is counted in ``TcpListener.refusals``, ``message`` is what the peer is
    told, in the door's own form. Each door's ``PeerError`` subclasses it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


SettingsT = TypeVar("SettingsT", bound=ListenerSettings)


@dataclass(frozen=True, slots=True)
class Peer:
    """One accepted connection: its two stream ends and the address it came from."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    host: str
    port: int


class TcpListener(abc.ABC, Generic[SettingsT]):
    """An asyncio TCP server, its connection tasks, the source check, per-source counts,
    draining and refusals.

    ``settings.max_connections_per_source`` caps the connections open at once from one address
    (the door refuses the one over it). ``refusals`` counts connections a door ended for bad
    input or by a limit, by reason (``forbidden_source``: refused here, by ``source_cidrs``).
    ``door`` names the door's config section in what it logs and tells a refused peer.
    """

    door: ClassVar[str]

    def __init__(self, settings: SettingsT) -> None:
        self.settings = settings
        self.refusals: Counter[str] = Counter()
        self.draining = False
        self._server: asyncio.Server | None = None
        self._per_source: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def max_connections_per_source(self) -> int:
        """The settings' cap on connections open at once from one source address."""
        return self.settings.max_connections_per_source

    @property
    def port(self) -> int:
        """The port listened on (the OS's choice when configured as 0)."""
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__}.port read before start()")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open now (refused ones included until they are closed)."""
        return len(self._tasks)

    async def _listen(self, tls: ssl.SSLContext | None = None, tls_handshake_timeout_s: float | None = None) -> None:
        """Start listening on the settings' host and port (0: any free port), over TLS when ``tls`` is given."""
        host, port = self.settings.host, self.settings.port
        self._server = await asyncio.start_server(
            self._accept, host, port, ssl=tls, ssl_handshake_timeout=tls_handshake_timeout_s if tls else None
        )
        log.info("%s listening on %s:%d%s", self.door, host, self.port, " (tls)" if tls else "")

    def set_draining(self) -> None:
        """Refuse new connections from now on; open ones go on until they end or ``stop``."""
        self.draining = True

    async def stop(self) -> None:
        """Stop listening, then cancel every open connection's task and wait for them to end."""
        self.draining = True
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def source_allowed(self, host: str) -> bool:
        """Whether the door's ``source_cidrs`` hold ``host`` (an empty list holds every source)."""
        cidrs = self.settings.source_cidrs
        return not cidrs or host_inside(host, cidrs)

    def over_source_cap(self, host: str) -> bool:
        """Whether ``host`` has more connections open than ``max_connections_per_source``."""
        return self._per_source[host] > self.max_connections_per_source

    def count_refusal(self, error: DoorError, host: str) -> None:
        """Count ``error`` by its reason and log it: every refusal of every door passes here once."""
        self.refusals[error.reason] += 1
        log.info("%s %s from %s: %s", self.door, error.reason, host, error.message)

    async def refuse(self, peer: Peer, error: DoorError) -> None:
        """Count ``error`` and tell ``peer`` (``_answer_refusal``)."""
        self.count_refusal(error, peer.host)
        await self._answer_refusal(peer, error)

    @abc.abstractmethod
    async def _serve(self, peer: Peer) -> None:
        """Run one connection until it ends; its writer is closed afterwards."""

    @abc.abstractmethod
    async def _answer_refusal(self, peer: Peer, error: DoorError) -> None:
        """Tell ``peer`` why it is refused (``error.message``) in the protocol's own form; its
        writer is closed afterwards. Called here for a source outside ``source_cidrs``, before
        the protocol read anything; a door may call it (through ``refuse``) for its own."""

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        address = writer.get_extra_info("peername") or ("", 0)
        peer = Peer(reader, writer, str(address[0]), int(address[1]))
        self._tasks.add(task)
        self._per_source[peer.host] += 1
        try:
            if self.source_allowed(peer.host):
                await self._serve(peer)
            else:
                error = DoorError("forbidden_source", f"source {peer.host} may not connect ({self.door}.source_cidrs)")
                await self.refuse(peer, error)
        finally:
            self._per_source[peer.host] -= 1
            if not self._per_source[peer.host]:
                del self._per_source[peer.host]
            self._tasks.discard(task)
            writer.close()
