"""Requests we send on TCP/TLS when the peer has closed its connection (RFC 3261 18.1.1) and
connection reuse (RFC 5923 alias, connections keyed by remote address).

The PBX here is a small real TCP/TLS peer: it calls us on one connection, closes it after the
ACK, and listens on its Contact address, where our BYE must arrive on a connection we open.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from asr_common.audio import PcmSink
from calls.handler import CountingCallHandler
from sip.actions import SendMessage
from sip.config import SipSettings
from sip.header_values import NameAddr
from sip.message import Address
from sip.transport import SipServer
from sip.uas import UasCore
from tests.certs import self_signed_cert
from tests.test_sip_support import FakePorts, ack
from tests.test_sip_support import invite as udp_invite
from tests.test_sip_transport import FakeLeg

pytestmark = pytest.mark.timeout(30)
HOST = "127.0.0.1"


async def read_message(reader: asyncio.StreamReader) -> str:
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode()
    length = re.search(r"(?im)^content-length:\s*(\d+)", head)
    body = await reader.readexactly(int(length.group(1))) if length else b""
    return head + body.decode()


class Pbx:
    """Listens on its Contact address; answers each request it gets there 200 and keeps it."""

    def __init__(self, transport: str, server_context: ssl.SSLContext | None = None) -> None:
        self.transport = transport
        self.server_context = server_context
        self.accepted = 0
        self.requests: asyncio.Queue[str] = asyncio.Queue()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, 0, ssl=self.server_context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await answer_requests(reader, writer, self.requests)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


async def answer_requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, into: asyncio.Queue[str]) -> None:
    try:
        while True:
            request = await read_message(reader)
            await into.put(request)
            copied = [line for line in request.split("\r\n") if re.match(r"(?i)(via|from|to|call-id|cseq):", line)]
            writer.write(("SIP/2.0 200 OK\r\n" + "\r\n".join(copied) + "\r\nContent-Length: 0\r\n\r\n").encode())
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        writer.close()


def invite(pbx: Pbx, call: str, *, via_params: str = "") -> bytes:
    body = b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0\r\n"
    proto = pbx.transport.upper()
    head = (
        f"INVITE sip:rec@{HOST} SIP/2.0\r\n"
        f"Via: SIP/2.0/{proto} {HOST}:{pbx.port};branch=z9hG4bK-{call}{via_params}\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:pbx@{HOST}>;tag=f-{call}\r\n"
        f"To: <sip:rec@{HOST}>\r\n"
        f"Call-ID: {call}\r\n"
        "CSeq: 1 INVITE\r\n"
        f"Contact: <sip:pbx@{HOST}:{pbx.port};transport={pbx.transport}>\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def call_and_close(server: SipServer, pbx: Pbx, call: str, client: ssl.SSLContext | None = None) -> None:
    """INVITE on a connection of its own, 200, ACK, then close that connection."""
    reader, writer = await asyncio.open_connection(HOST, server.port(pbx.transport), ssl=client)
    writer.write(invite(pbx, call))
    while not (response := await read_message(reader)).startswith("SIP/2.0 200"):
        pass
    to = re.search(r"(?im)^to:.*$", response)
    assert to is not None
    lines = [
        f"ACK sip:rec@{HOST} SIP/2.0",
        f"Via: SIP/2.0/{pbx.transport.upper()} {HOST}:{pbx.port};branch=z9hG4bK-a{call}",
        "Max-Forwards: 70",
        f"From: <sip:pbx@{HOST}>;tag=f-{call}",
        to.group(0).strip(),
        f"Call-ID: {call}",
        "CSeq: 1 ACK",
        "Content-Length: 0",
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    writer.close()
    await writer.wait_closed()


@contextlib.asynccontextmanager
async def running(
    settings: SipSettings, transport: str = "tcp", server_context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[SipServer, CountingCallHandler, Pbx]]:
    """Our SIP server (fake RTP legs) and a PBX listening on its Contact address."""
    handler = CountingCallHandler()

    def factory(sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> FakeLeg:
        return FakeLeg(sink)

    server = SipServer(settings, handler, FakePorts(), leg_factory=factory)
    await server.start()
    pbx = Pbx(transport, server_context)
    await pbx.start()
    try:
        yield server, handler, pbx
    finally:
        await pbx.stop()
        await server.stop(grace_s=0.1)


async def wait_closed_by_server(server: SipServer, count: int) -> None:
    for _ in range(200):
        if server.active_calls == count and server.open_connections == 0:
            return
        await asyncio.sleep(0.01)


async def byes_after_stop(server: SipServer, pbx: Pbx, count: int) -> list[str]:
    """Stop the server (it hangs up every call with a BYE); the BYEs the PBX got, in order."""
    stopping = asyncio.create_task(server.stop(grace_s=5.0))
    byes = [await asyncio.wait_for(pbx.requests.get(), 5) for _ in range(count)]
    await asyncio.wait_for(stopping, 5)
    return byes


def test_bye_opens_a_new_tcp_connection_to_the_contact_and_is_reused() -> None:
    async def scenario() -> None:
        async with running(SipSettings(host=HOST, port=0, transports=["tcp"])) as (server, handler, pbx):
            await call_and_close(server, pbx, "c1")
            await call_and_close(server, pbx, "c2")
            await wait_closed_by_server(server, 2)
            byes = await byes_after_stop(server, pbx, 2)
        assert sorted(re.search(r"Call-ID: (\S+)", bye).group(1) for bye in byes) == ["c1", "c2"]  # type: ignore[union-attr]
        assert all(bye.startswith(f"BYE sip:pbx@{HOST}:{pbx.port};transport=tcp SIP/2.0") for bye in byes)
        assert pbx.accepted == 1  # the second BYE went on the connection the first one opened
        counters = server.counters
        assert (counters["connections.opened"], counters["connections.reused"]) == (1, 1)
        assert counters["dropped.no_connection"] == 0 and counters["bye.timeout"] == 0
        assert sorted(handler.ended.values()) == ["shutdown", "shutdown"]

    asyncio.run(scenario())


def test_bye_goes_on_the_connection_the_peer_offered_with_alias() -> None:
    async def scenario() -> None:
        async with running(SipSettings(host=HOST, port=0, transports=["tcp"])) as (server, _, pbx):
            await call_and_close(server, pbx, "c1")
            reader, writer = await asyncio.open_connection(HOST, server.port("tcp"))
            options = invite(pbx, "probe", via_params=";alias").replace(b"INVITE", b"OPTIONS")
            writer.write(options)
            assert (await read_message(reader)).startswith("SIP/2.0 200")
            requests: asyncio.Queue[str] = asyncio.Queue()
            answering = asyncio.create_task(answer_requests(reader, writer, requests))
            stopping = asyncio.create_task(server.stop(grace_s=5.0))
            bye = await asyncio.wait_for(requests.get(), 5)
            await asyncio.wait_for(stopping, 5)
            answering.cancel()
        assert bye.startswith("BYE ") and "Call-ID: c1" in bye
        assert pbx.accepted == 0
        assert (server.counters["connections.opened"], server.counters["connections.reused"]) == (0, 1)

    asyncio.run(scenario())


def test_unreachable_contact_is_counted_and_the_call_still_ends() -> None:
    async def scenario() -> None:
        async with running(SipSettings(host=HOST, port=0, transports=["tcp"], t1_ms=50)) as (server, handler, pbx):
            await pbx.stop()  # nobody listens at the Contact any more
            await call_and_close(server, pbx, "gone")
            await wait_closed_by_server(server, 1)
            await server.stop(grace_s=1.0)
        assert server.counters["connections.failed"] == 1
        assert list(handler.ended.values()) == ["shutdown"]

    asyncio.run(scenario())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_bye_over_tls_opens_a_verified_connection(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path, HOST)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))

    async def scenario() -> None:
        settings = SipSettings(
            host=HOST, port=0, tls_port=0, transports=["tls"], tls_cert=str(cert), tls_key=str(key), tls_ca=str(cert)
        )
        async with running(settings, "tls", server_context) as (server, handler, pbx):
            await call_and_close(server, pbx, "t1", client)
            await wait_closed_by_server(server, 1)
            (bye,) = await byes_after_stop(server, pbx, 1)
        assert bye.startswith(f"BYE sip:pbx@{HOST}:{pbx.port};transport=tls SIP/2.0")
        assert "Via: SIP/2.0/TLS " in bye
        assert server.counters["connections.opened"] == 1 and pbx.accepted == 1
        assert list(handler.ended.values()) == ["shutdown"]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("extra", "target"),
    [
        ("", Address("tcp", "10.0.0.5", 5062)),  # the Contact, on the dialog's transport
        ("Record-Route: <sip:sbc.example;lr>, <sip:core.example;lr>\r\n", Address("tcp", "sbc.example", 5060)),
        ("Record-Route: <sip:10.9.9.9:5070;transport=tls;lr>\r\n", Address("tls", "10.9.9.9", 5070)),
        ("Record-Route: <sips:[2001:db8::1];lr>\r\n", Address("tls", "2001:db8::1", 5061)),
        ("Record-Route: <sip:sbc.example;maddr=10.1.1.1;lr>\r\n", Address("tcp", "10.1.1.1", 5060)),
    ],
)
def test_next_hop_of_our_bye(extra: str, target: Address) -> None:
    """Where a new connection for our BYE goes: the first route (loose routing), else the Contact."""
    core = UasCore(SipSettings(host=HOST, port=5060, transports=["tcp"]), CountingCallHandler(), FakePorts())
    source = Address("tcp", "10.0.0.5", 40123)

    def tcp(data: bytes) -> bytes:
        return data.replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP")

    actions = core.receive(tcp(udp_invite(extra=extra)), source, 0.0)
    (ok,) = [a.message for a in actions if isinstance(a, SendMessage) and getattr(a.message, "status", 0) == 200]
    tag = NameAddr.parse(ok.headers.get("To") or "").tag or ""
    core.receive(tcp(ack(to_tag=tag)), source, 0.1)
    (bye,) = [a for a in core.hangup_all("test", 0.2) if isinstance(a, SendMessage)]
    assert (bye.dest, bye.target) == (source, target)


async def collect_messages(reader: asyncio.StreamReader, into: asyncio.Queue[str]) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        while True:
            await into.put(await read_message(reader))


def test_final_answer_after_the_peer_closed_opens_a_connection_to_its_via() -> None:
    """RFC 3261 18.2.2: the PBX closes its TCP connection while we still ring; our 200 OK goes on
    a new connection to its Via sent-by, the ACK comes back on it, and a second call's 200 and
    our BYEs reuse that connection rather than opening others."""

    async def scenario() -> None:
        settings = SipSettings(host=HOST, port=0, transports=["tcp"], answer_delay_ms=300)
        async with running(settings) as (server, handler, _):
            got: asyncio.Queue[str] = asyncio.Queue()
            accepted: list[asyncio.StreamWriter] = []

            async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                accepted.append(writer)
                await collect_messages(reader, got)

            listener = await asyncio.start_server(accept, HOST, 0)
            via_port = listener.sockets[0].getsockname()[1]
            pbx = Pbx("tcp")
            pbx.port = via_port
            for call in ("early-1", "early-2"):
                reader, writer = await asyncio.open_connection(HOST, server.port("tcp"))
                writer.write(invite(pbx, call))
                assert (await read_message(reader)).startswith("SIP/2.0 1")  # 100 Trying or 180 Ringing
                writer.close()
                await writer.wait_closed()
            answers = [await asyncio.wait_for(got.get(), 5) for _ in range(2)]
            assert all(answer.startswith("SIP/2.0 200 OK") for answer in answers)
            for answer in answers:
                call = re.search(r"(?im)^call-id:\s*(\S+)", answer).group(1)  # type: ignore[union-attr]
                to = re.search(r"(?im)^to:.*$", answer).group(0).strip()  # type: ignore[union-attr]
                lines = [
                    f"ACK sip:rec@{HOST} SIP/2.0",
                    f"Via: SIP/2.0/TCP {HOST}:{via_port};branch=z9hG4bK-a{call}",
                    f"From: <sip:pbx@{HOST}>;tag=f-{call}",
                    to,
                    f"Call-ID: {call}",
                    "CSeq: 1 ACK",
                    "Content-Length: 0",
                ]
                accepted[0].write(("\r\n".join(lines) + "\r\n\r\n").encode())
            stopping = asyncio.create_task(server.stop(grace_s=0.5))  # BYE each answered call
            byes = [await asyncio.wait_for(got.get(), 5) for _ in range(2)]
            await asyncio.wait_for(stopping, 5)
            listener.close()
            for _ in range(100):  # call_ended runs once the calls' legs are closed
                if len(handler.ended) == 2:
                    break
                await asyncio.sleep(0.01)
        assert sorted(re.search(r"Call-ID: (\S+)", bye).group(1) for bye in byes) == ["early-1", "early-2"]  # type: ignore[union-attr]
        assert all(bye.startswith("BYE ") for bye in byes)
        assert len(accepted) == 1  # one connection opened for the first 200; the rest reused it
        counters = server.counters
        assert (counters["connections.opened"], counters["connections.reused"]) == (1, 3)
        assert counters["dropped.no_connection"] == 0 and counters["calls.ack_timeout"] == 0
        assert sorted(handler.calls[call].source_call_id for call in handler.ended) == ["early-1", "early-2"]

    asyncio.run(scenario())
