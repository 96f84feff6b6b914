"""The asyncio transports: TCP framing with keep-alives, TLS, oversize messages, draining stop."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from sip.app import CountingCallHandler
from sip.config import SipSettings
from sip.transport import SipServer
from tests.test_sip_support import FakePorts, invite

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
    async def scenario() -> None:
        server = SipServer(SipSettings(transports=["tls"]), CountingCallHandler(), FakePorts())
        with pytest.raises(ValueError, match=r"tls_cert and sip\.tls_key"):
            await server.start()

    asyncio.run(scenario())
