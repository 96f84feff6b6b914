"""``asr_common.listener.TcpListener``: connection tasks and per-source counts follow the
connections, ``stop`` ends the open ones, and ``port`` before ``start`` says what was wrong."""

from __future__ import annotations

import asyncio

import pytest

from asr_common.listener import Peer, TcpListener
from tests.waiting import wait_until_async


class HoldingListener(TcpListener):
    """Holds every connection open until stopped; remembers what it saw of each."""

    def __init__(self, max_connections_per_source: int) -> None:
        super().__init__(max_connections_per_source)
        self.seen: list[tuple[str, bool]] = []
        self.cancelled = 0

    async def _serve(self, peer: Peer) -> None:
        self.seen.append((peer.host, self.over_source_cap(peer.host)))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def test_port_before_start_names_the_class() -> None:
    with pytest.raises(RuntimeError, match=r"HoldingListener\.port read before start\(\)"):
        _ = HoldingListener(1).port


def test_counts_follow_the_connections_and_stop_ends_them() -> None:
    async def scenario() -> HoldingListener:
        listener = HoldingListener(max_connections_per_source=1)
        await listener._listen("127.0.0.1", 0)
        clients = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(2)]
        await wait_until_async(lambda: len(listener.seen) == 2, 10.0, "both connections accepted")
        assert listener.connections == 2
        await listener.stop()
        assert listener.draining and listener.connections == 0
        for _, writer in clients:
            writer.close()
        return listener

    listener = asyncio.run(scenario())
    assert listener.seen == [("127.0.0.1", False), ("127.0.0.1", True)]
    assert listener.cancelled == 2
    assert not listener.over_source_cap("127.0.0.1")
