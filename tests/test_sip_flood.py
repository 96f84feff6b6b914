"""Per-source fairness with real sockets: one loopback address (127.0.0.2, .4, ...) floods the
SIP listener while another (127.0.0.3, .5) places calls, and every call of the good source is
answered 200. Floods are bounded (a few thousand datagrams, ~100 connections, a few seconds)
and only ever aimed at 127.0.0.x. Run with ``-s`` to see the numbers."""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import Callable

import pytest

from asr_common.audio import PcmSink
from calls.handler import CountingCallHandler
from sip.config import SipSettings
from sip.message import Response, parse
from sip.transport import SipServer
from tests.test_sip_support import FakePorts, ack, invite
from tests.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)
FLOODER, CALLER = "127.0.0.2", "127.0.0.3"
TCP_FLOODER, TCP_CALLER, SLOW = "127.0.0.4", "127.0.0.5", "127.0.0.6"
FLOOD_REQUESTS = 2400
CALLS = 20


class NullLeg:
    """An RTP leg that binds nothing: these tests are about SIP only."""

    async def open(self, host: str, port: int) -> None:
        return None

    def set_payload_types(self, payload_types: dict[int, str]) -> None:
        return None

    def set_hold(self, on_hold: bool) -> None:
        return None

    async def close(self) -> None:
        return None


def null_leg(sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> NullLeg:
    return NullLeg()


def server_for(**settings: object) -> SipServer:
    base: dict[str, object] = {"host": "127.0.0.1", "port": 0, "max_calls": 64}
    return SipServer(
        SipSettings.model_validate(base | settings),
        CountingCallHandler(capacity=64),
        FakePorts(count=200),
        leg_factory=null_leg,
    )


def final_status(data: bytes) -> tuple[str, int] | None:
    """(Call-ID, status) of a final response, None for a provisional one."""
    message = parse(data)
    assert isinstance(message, Response)
    if message.status < 200:
        return None
    return message.headers.get("Call-ID") or "", message.status


def to_tag_of(data: bytes) -> str:
    message = parse(data)
    assert isinstance(message, Response)
    to = message.headers.get("To") or ""
    return to.split("tag=", 1)[1].split(";", 1)[0]


def call_request(i: int, transport: str = "UDP", **kwargs: object) -> bytes:
    data = invite(call_id=f"good-{i}", branch=f"z9hG4bK-good-{i}-{kwargs.get('method', 'INVITE')}", **kwargs)  # type: ignore[arg-type]
    return data.replace(b"SIP/2.0/UDP", b"SIP/2.0/" + transport.encode())


async def udp_calls(port: int, answers: Counter[int]) -> None:
    """``CALLS`` calls from CALLER over UDP, one after another: INVITE, 200, ACK, BYE, 200."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((CALLER, 0))
    sock.setblocking(False)
    target = ("127.0.0.1", port)

    async def final(call_id: str) -> tuple[int, bytes]:
        while True:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
            got = final_status(data)
            if got is not None and got[0] == call_id:
                return got[1], data

    try:
        for i in range(CALLS):
            await loop.sock_sendto(sock, call_request(i), target)
            status, data = await final(f"good-{i}")
            answers[status] += 1
            if status != 200:
                continue
            tag = to_tag_of(data)
            await loop.sock_sendto(sock, ack(to_tag=tag, call_id=f"good-{i}", branch=f"z9hG4bK-ack-{i}"), target)
            await loop.sock_sendto(sock, call_request(i, method="BYE", to_tag=tag, cseq=2, body=""), target)
            bye_status, _ = await final(f"good-{i}")
            answers[bye_status] += 1
            await asyncio.sleep(0.02)
    finally:
        sock.close()


async def udp_flood(port: int) -> int:
    """``FLOOD_REQUESTS`` OPTIONS with fresh branches from FLOODER in about a second."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((FLOODER, 0))
    sock.setblocking(False)
    sent = 0
    try:
        for batch in range(FLOOD_REQUESTS // 50):
            for i in range(50):
                branch = f"z9hG4bK-flood-{batch}-{i}"
                data = invite(method="OPTIONS", body="", branch=branch, call_id=f"flood-{batch}-{i}")
                try:
                    sock.sendto(data, ("127.0.0.1", port))
                    sent += 1
                except BlockingIOError:
                    pass
            await asyncio.sleep(0.02)
    finally:
        sock.close()
    return sent


@pytest.mark.parametrize(
    "budget",
    [
        pytest.param({}, id="request-rate"),
        pytest.param({"source_rate_per_s": 100000, "source_burst": 100000}, id="transactions"),
    ],
)
def test_udp_flood_from_one_source_leaves_other_callers_answered(budget: dict[str, object]) -> None:
    async def scenario() -> None:
        server = server_for(transports=["udp"], **budget)
        await server.start()
        try:
            answers: Counter[int] = Counter()
            calls = asyncio.create_task(udp_calls(server.port("udp"), answers))
            sent = await udp_flood(server.port("udp"))
            await calls

            def flood_counted() -> bool:
                counters = server.counters
                return counters["flood.rate_dropped"] + counters["flood.source_transactions"] > 0

            await wait_until_async(flood_counted, 10.0, "the flood counted as dropped")
            counters = server.counters
            print(
                json.dumps(
                    {
                        "budget": budget or "defaults",
                        "flood_sent": sent,
                        "good_answers": dict(answers),
                        "flood.rate_dropped": counters["flood.rate_dropped"],
                        "flood.source_transactions": counters["flood.source_transactions"],
                        "dropped.tx_table_full": counters["dropped.tx_table_full"],
                    }
                )
            )
            assert answers == Counter({200: 2 * CALLS})
            assert counters["dropped.tx_table_full"] == 0
            assert counters["flood.rate_dropped"] + counters["flood.source_transactions"] > 0
        finally:
            await server.stop(0.1)

    asyncio.run(scenario())


async def tcp_call_over(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> list[int]:
    """One call over an open TCP connection; the final statuses of its INVITE and BYE."""

    async def final(call_id: str) -> tuple[int, bytes]:
        while True:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            _, found, rest = head.partition(b"Content-Length: ")
            length = int(rest.split(b"\r\n", 1)[0]) if found else 0
            data = head + (await reader.readexactly(length) if length else b"")
            got = final_status(data)
            if got is not None and got[0] == call_id:
                return got[1], data

    writer.write(call_request(i, "TCP"))
    status, data = await final(f"good-{i}")
    if status != 200:
        return [status]
    tag = to_tag_of(data)
    writer.write(ack(to_tag=tag, call_id=f"good-{i}", branch=f"z9hG4bK-ack-{i}").replace(b"/UDP", b"/TCP"))
    writer.write(call_request(i, "TCP", method="BYE", to_tag=tag, cseq=2, body=""))
    bye_status, _ = await final(f"good-{i}")
    return [status, bye_status]


async def is_closed(reader: asyncio.StreamReader, within_s: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within_s) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def test_idle_tcp_connection_flood_and_slowloris_leave_other_callers_answered() -> None:
    async def scenario() -> None:
        # max_calls 16: the node-wide cap is 16 * 2 + 64 = 96 connections, one source may hold 32.
        server = server_for(transports=["tcp"], max_calls=16, stream_idle_timeout_s=3.0, stream_message_timeout_s=0.5)
        await server.start()
        port = server.port("tcp")
        flood = []
        try:
            for _ in range(100):
                flood.append(await asyncio.open_connection("127.0.0.1", port, local_addr=(TCP_FLOODER, 0)))
            closed_at_once = sum(await asyncio.gather(*(is_closed(r, 0.3) for r, _ in flood)))
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(TCP_CALLER, 0))
            slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(SLOW, 0))
            slow_writer.write(call_request(999, "TCP")[:40])
            statuses: list[int] = []
            for i in range(CALLS):
                statuses += await tcp_call_over(reader, writer, i)
            slow_closed = await is_closed(slow_reader, 2.0)
            idle_closed = sum(await asyncio.gather(*(is_closed(r, 6.0) for r, _ in flood)))
            counters = server.counters
            print(
                json.dumps(
                    {
                        "flood_connections": len(flood),
                        "closed_at_once": closed_at_once,
                        "closed_idle_later": idle_closed - closed_at_once,
                        "good_answers": dict(Counter(statuses)),
                        "flood.source_connections": counters["flood.source_connections"],
                        "dropped.stream_idle_timeout": counters["dropped.stream_idle_timeout"],
                        "dropped.stream_message_timeout": counters["dropped.stream_message_timeout"],
                    }
                )
            )
            assert statuses == [200] * (2 * CALLS)
            assert closed_at_once == 100 - 32 == counters["flood.source_connections"]
            assert idle_closed == 100 and counters["dropped.stream_idle_timeout"] >= 32
            assert slow_closed and counters["dropped.stream_message_timeout"] == 1
            writer.close()
            slow_writer.close()
        finally:
            for _, w in flood:
                w.close()
            await server.stop(0.1)

    asyncio.run(scenario())


def test_start_says_who_may_send(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(**settings: object) -> None:
        server = server_for(transports=["udp"], **settings)
        await server.start()
        await server.stop(0.1)

    with caplog.at_level("INFO", logger="sip.transport"):
        asyncio.run(scenario())
    assert "admitting loopback and private sources only" in caplog.text
    assert "open setting" not in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="sip.transport"):
        asyncio.run(scenario(acl_cidrs=["0.0.0.0/0"]))
    assert "open setting: sip.acl_cidrs admits public sources (0.0.0.0/0)" in caplog.text
