"""The asyncio transports: TCP framing with keep-alives, TLS, oversize messages, draining stop."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from asr_common.audio import PcmSink
from calls.handler import CountingCallHandler
from calls.profile import Profile
from calls.routing import Router, RoutesFile
from sip.config import SipSettings
from sip.header_values import NameAddr
from sip.message import Message, Request, Response, parse
from sip.transport import SipServer
from tests.test_sip_support import FakePorts, ack, invite

pytestmark = pytest.mark.timeout(30)
OPTIONS = invite(method="OPTIONS", body="").replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP")


async def read_response(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)


def test_tcp_byte_at_a_time_keepalive_and_oversize() -> None:
    async def scenario() -> None:
        server = SipServer(
            SipSettings(host="127.0.0.1", port=0, transports=["tcp"], max_message_bytes=2048),
            CountingCallHandler(),
            FakePorts(),
        )
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port("tcp"))
            writer.write(b"\r\n\r\n")
            for i in range(len(OPTIONS)):
                writer.write(OPTIONS[i : i + 1])
                await writer.drain()
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"\r\n"
            assert (await read_response(reader)).startswith(b"SIP/2.0 200 OK\r\n")
            writer.write(b"INVITE sip:x@y SIP/2.0\r\nContent-Length: 100000\r\n\r\n")
            assert await asyncio.wait_for(reader.read(), 5) == b""
            assert server.counters["dropped.stream_framing"] == 1
            writer.close()
        finally:
            await server.stop(0.1)

    asyncio.run(scenario())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_tls_options(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )

    async def scenario() -> None:
        settings = SipSettings(
            host="127.0.0.1", port=0, tls_port=0, transports=["tls"], tls_cert=str(cert), tls_key=str(key)
        )
        server = SipServer(settings, CountingCallHandler(), FakePorts())
        await server.start()
        try:
            client = ssl.create_default_context(cafile=str(cert))
            client.check_hostname = False
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port("tls"), ssl=client)
            writer.write(OPTIONS.replace(b"SIP/2.0/TCP", b"SIP/2.0/TLS"))
            assert (await read_response(reader)).startswith(b"SIP/2.0 200 OK\r\n")
            writer.close()
        finally:
            await server.stop(0.1)

    asyncio.run(scenario())


def test_tls_needs_cert_and_key() -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        SipSettings(transports=["tls"])


class FakeLeg:
    def __init__(self, sink: PcmSink) -> None:
        self.sink = sink
        self.closed = False

    async def open(self, host: str, port: int) -> None:
        return None

    def set_payload_types(self, payload_types: dict[int, str]) -> None:
        return None

    def set_hold(self, on_hold: bool) -> None:
        return None

    async def close(self) -> None:
        self.closed = True
        self.sink.input_finished()


def test_stop_drains_with_bye_and_refuses_new_work() -> None:
    async def scenario() -> None:
        handler = CountingCallHandler()
        legs: list[FakeLeg] = []

        def factory(sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> FakeLeg:
            legs.append(FakeLeg(sink))
            return legs[-1]

        server = SipServer(
            SipSettings(host="127.0.0.1", port=0, transports=["udp"]), handler, FakePorts(), leg_factory=factory
        )
        await server.start()
        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.bind(("127.0.0.1", 0))
        peer.setblocking(False)
        loop = asyncio.get_running_loop()
        target = ("127.0.0.1", server.port("udp"))

        async def receive() -> Message:
            return parse(await asyncio.wait_for(loop.sock_recv(peer, 65536), 5))

        port = peer.getsockname()[1]
        await loop.sock_sendto(peer, invite().replace(b"10.0.0.5:5062", b"127.0.0.1:%d" % port), target)
        assert isinstance(await receive(), Response)
        ok = await receive()
        assert isinstance(ok, Response) and ok.status == 200
        tag = NameAddr.parse(ok.headers.get("To") or "").tag or ""
        await loop.sock_sendto(peer, ack(to_tag=tag), target)
        stopping = asyncio.create_task(server.stop(grace_s=5.0))
        bye = await receive()
        assert isinstance(bye, Request) and bye.method == "BYE"
        await loop.sock_sendto(peer, invite(method="OPTIONS", body="", branch="z9hG4bK-o"), target)
        busy = await receive()
        assert isinstance(busy, Response) and busy.status == 503
        await loop.sock_sendto(peer, bytes(Response(200, "OK", bye.headers)), target)
        await asyncio.wait_for(stopping, 3)
        assert list(handler.ended.values()) == ["shutdown"]
        assert legs[0].closed and legs[0].sink.finished == 1  # type: ignore[attr-defined]
        peer.close()

    asyncio.run(scenario())


class AddressedFakeLeg(FakeLeg):
    """Records what the server tells a leg about its RTP source policy."""

    def __init__(self, sink: PcmSink) -> None:
        super().__init__(sink)
        self.calls: list[tuple[str, object]] = []

    def set_expected_remote(self, address: tuple[str, int] | None) -> None:
        self.calls.append(("expected_remote", address))

    def set_latch(self, mode: str) -> None:
        self.calls.append(("latch", mode))


@pytest.mark.parametrize("profile_latch", [None, "strict"])
def test_leg_gets_the_sdp_address_and_the_profiles_latch(profile_latch: str | None) -> None:
    """The offer's c=/m= address reaches the leg before it opens; a profile's ``rtp_latch``
    overrides the leg's own (the service's ``rtp.latch``) only when set."""

    async def scenario() -> None:
        legs: list[AddressedFakeLeg] = []

        def factory(sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> AddressedFakeLeg:
            legs.append(AddressedFakeLeg(sink))
            return legs[-1]

        routes = RoutesFile(profiles={"default": Profile(rtp_latch=profile_latch)})
        server = SipServer(
            SipSettings(host="127.0.0.1", port=0, transports=["udp"]),
            CountingCallHandler(),
            FakePorts(),
            Router(routes),
            leg_factory=factory,
        )
        await server.start()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            peer.setblocking(False)
            loop = asyncio.get_running_loop()
            target = ("127.0.0.1", server.port("udp"))
            port = peer.getsockname()[1]
            await loop.sock_sendto(peer, invite().replace(b"10.0.0.5:5062", b"127.0.0.1:%d" % port), target)
            for _ in range(2):
                parse(await asyncio.wait_for(loop.sock_recv(peer, 65536), 5))
            latch = [("latch", profile_latch)] if profile_latch else []
            assert legs[0].calls == [*latch, ("expected_remote", ("10.0.0.5", 40000))]
        await server.stop(0.1)

    asyncio.run(scenario())
