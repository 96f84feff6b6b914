"""rtp.poller.DatagramPoller on real loopback sockets: delivery per socket, both reading modes,
the per-callback budget, removal, and a failing handler."""

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from rtp import poller
from rtp.poller import DatagramPoller

HOST = "127.0.0.1"
INTERVALS_S = [0.0, 0.005]


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((HOST, 0))
    sock.setblocking(False)
    return sock


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def collector() -> tuple[list[tuple[bytes, tuple[Any, ...]]], Callable[[bytes, tuple[Any, ...]], None]]:
    received: list[tuple[bytes, tuple[Any, ...]]] = []
    return received, lambda data, address: received.append((data, address))


@pytest.mark.parametrize("interval_s", INTERVALS_S)
def test_each_socket_gets_its_own_datagrams_in_order(interval_s: float) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        pollster = DatagramPoller.for_loop(loop, interval_s)
        assert DatagramPoller.for_loop(loop, interval_s) is pollster
        sockets = [bound_socket() for _ in range(3)]
        inboxes = []
        for sock in sockets:
            received, handler = collector()
            pollster.add(sock, handler)
            inboxes.append(received)
        assert len(pollster) == 3
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.bind((HOST, 0))
            for n in range(20):
                for index, sock in enumerate(sockets):
                    sender.sendto(bytes([index, n]) + b"x" * 2000, sock.getsockname())
            await wait_for(lambda: all(len(inbox) == 20 for inbox in inboxes))
            for index, inbox in enumerate(inboxes):
                assert [data[:2] for data, _ in inbox] == [bytes([index, n]) for n in range(20)]
                assert all(len(data) == 2002 and address == sender.getsockname() for data, address in inbox)
        for sock in sockets:
            pollster.remove(sock)
            sock.close()
        assert len(pollster) == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("interval_s", INTERVALS_S)
def test_more_datagrams_than_one_callback_reads(interval_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the per-callback budget the rest are read in later callbacks, none lost."""
    monkeypatch.setattr(poller, "MAX_DATAGRAMS_PER_CALLBACK", 4)

    async def scenario() -> None:
        pollster = DatagramPoller.for_loop(asyncio.get_running_loop(), interval_s)
        sock = bound_socket()
        received, handler = collector()
        pollster.add(sock, handler)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for n in range(50):
                sender.sendto(n.to_bytes(2, "big"), sock.getsockname())
        await wait_for(lambda: len(received) == 50)
        assert [int.from_bytes(data, "big") for data, _ in received] == list(range(50))
        pollster.remove(sock)
        sock.close()

    asyncio.run(scenario())


def test_removed_socket_is_not_read_and_the_last_removal_closes_the_poller() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        pollster = DatagramPoller.for_loop(loop, 0.005)
        kept, removed = bound_socket(), bound_socket()
        kept_inbox, kept_handler = collector()
        removed_inbox, removed_handler = collector()
        pollster.add(kept, kept_handler)
        pollster.add(removed, removed_handler)
        pollster.remove(removed)
        pollster.remove(removed)  # a second removal is a no-op
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"to-removed", removed.getsockname())
            sender.sendto(b"to-kept", kept.getsockname())
            await wait_for(lambda: len(kept_inbox) == 1)
            await asyncio.sleep(0.03)  # a window in which the removed socket must not be read
        assert removed_inbox == []
        assert removed.recv(100) == b"to-removed"  # still queued on the socket, unread
        pollster.remove(kept)
        assert DatagramPoller.for_loop(loop, 0.005) is not pollster
        for sock in (kept, removed):
            sock.close()

    asyncio.run(scenario())


def test_a_failing_handler_does_not_stop_the_timer() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        pollster = DatagramPoller.for_loop(loop, 0.005)
        sock = bound_socket()
        received: list[bytes] = []

        def handler(data: bytes, _address: tuple[Any, ...]) -> None:
            if data == b"boom":
                raise RuntimeError("handler failed")
            received.append(data)

        pollster.add(sock, handler)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"boom", sock.getsockname())
            await wait_for(lambda: bool(errors))
            sender.sendto(b"after", sock.getsockname())
            await wait_for(lambda: received == [b"after"])
        assert isinstance(errors[0]["exception"], RuntimeError)
        pollster.remove(sock)
        sock.close()

    asyncio.run(scenario())


def test_bad_arguments() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(ValueError, match="poll interval must be >= 0 s, got -1"):
            DatagramPoller(loop, -1)
        pollster = DatagramPoller.for_loop(loop, 0.005)
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blocking,
            pytest.raises(ValueError, match="non-blocking"),
        ):
            pollster.add(blocking, lambda _data, _address: None)

    asyncio.run(scenario())
