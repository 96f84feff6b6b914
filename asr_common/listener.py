"""``TcpListener``: the bookkeeping every asyncio TCP front door needs, written once.

A door (AudioSocket, WebSocket) listens on a port, runs one task per connection, counts the
connections from each source address, refuses new ones while draining, counts its refusals by
reason, and on ``stop`` stops listening and cancels and awaits every connection's task. The
door subclasses ``TcpListener`` and keeps only its protocol: ``_serve`` runs one connection
(a ``Peer``), and the door decides how (and when in its protocol) to refuse one that is
``draining`` or ``over_source_cap``. Front doors may not import each other; both may import this.
"""

from __future__ import annotations

import abc
import asyncio
import ssl
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Peer:
    """One accepted connection: its two stream ends and the address it came from."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    host: str
    port: int


class TcpListener(abc.ABC):
    """An asyncio TCP server, its connection tasks, per-source counts, draining and refusals.

    ``max_connections_per_source`` caps the connections open at once from one address (the
    door refuses the one over it). ``refusals`` counts connections a door ended for bad input
    or by a limit, by reason.
    """

    def __init__(self, max_connections_per_source: int) -> None:
        self.max_connections_per_source = max_connections_per_source
        self.refusals: Counter[str] = Counter()
        self.draining = False
        self._server: asyncio.Server | None = None
        self._per_source: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

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

    async def _listen(
        self, host: str, port: int, tls: ssl.SSLContext | None = None, tls_handshake_timeout_s: float | None = None
    ) -> None:
        """Start listening on ``host``:``port`` (0: any free port), over TLS when ``tls`` is given."""
        self._server = await asyncio.start_server(
            self._accept, host, port, ssl=tls, ssl_handshake_timeout=tls_handshake_timeout_s if tls else None
        )

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

    def over_source_cap(self, host: str) -> bool:
        """Whether ``host`` has more connections open than ``max_connections_per_source``."""
        return self._per_source[host] > self.max_connections_per_source

    @abc.abstractmethod
    async def _serve(self, peer: Peer) -> None:
        """Run one connection until it ends; its writer is closed afterwards."""

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        address = writer.get_extra_info("peername") or ("", 0)
        host = str(address[0])
        self._tasks.add(task)
        self._per_source[host] += 1
        try:
            await self._serve(Peer(reader, writer, host, int(address[1])))
        finally:
            self._per_source[host] -= 1
            if not self._per_source[host]:
                del self._per_source[host]
            self._tasks.discard(task)
            writer.close()
