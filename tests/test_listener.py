"""``asr_common.listener.TcpListener``: connection tasks and per-source counts follow the
connections, ``stop`` ends the open ones, and ``port`` before ``start`` says what was wrong."""

from __future__ import annotations

import asyncio

import pytest

from asr_common.listener import DoorError, ListenerSettings, Peer, TcpListener
from tests.waiting import wait_until_async


class HoldingListener(TcpListener[ListenerSettings]):
    """Holds every connection open until stopped; remembers what it saw of each, and what it
    told the sources it refused."""

    door = "holding"

    def __init__(self, max_connections_per_source: int, source_cidrs: tuple[str, ...] = ()) -> None:
        super().__init__(
            ListenerSettings.model_validate(
                {"port": 0, "max_connections_per_source": max_connections_per_source, "source_cidrs": source_cidrs}
            )
        )
        self.seen: list[tuple[str, bool]] = []
        self.answered: list[DoorError] = []
        self.cancelled = 0

    async def _serve(self, peer: Peer) -> None:
        self.seen.append((peer.host, self.over_source_cap(peer.host)))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _answer_refusal(self, peer: Peer, error: DoorError) -> None:
        self.answered.append(error)
        peer.writer.write(error.message.encode())


def test_port_before_start_names_the_class() -> None:
    with pytest.raises(RuntimeError, match=r"HoldingListener\.port read before start\(\)"):
        _ = HoldingListener(1).port


def test_counts_follow_the_connections_and_stop_ends_them() -> None:
    async def scenario() -> HoldingListener:
        listener = HoldingListener(max_connections_per_source=1)
        await listener._listen()
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


def test_a_source_outside_the_cidrs_is_refused_before_the_door_serves_it() -> None:
    """The listener's check: the door's ``_serve`` never runs, its ``_answer_refusal`` does,
    the refusal is counted ``forbidden_source`` and the connection is closed."""

    async def scenario(cidrs: tuple[str, ...]) -> tuple[HoldingListener, bytes]:
        listener = HoldingListener(max_connections_per_source=1, source_cidrs=cidrs)
        await listener._listen()
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        try:
            if cidrs == ("10.0.0.0/8",):
                return listener, await asyncio.wait_for(reader.read(), 10)
            await wait_until_async(lambda: listener.seen, 10.0, "the connection served")
            return listener, b""
        finally:
            writer.close()
            await listener.stop()

    refused, told = asyncio.run(scenario(("10.0.0.0/8",)))
    assert refused.seen == [] and refused.refusals == {"forbidden_source": 1}
    assert told == b"source 127.0.0.1 may not connect (holding.source_cidrs)"
    assert [error.reason for error in refused.answered] == ["forbidden_source"]
    assert refused.connections == 0
    served, _ = asyncio.run(scenario(("192.0.2.0/24", "127.0.0.0/8")))
    assert served.seen == [("127.0.0.1", False)] and served.refusals == {} and served.answered == []
