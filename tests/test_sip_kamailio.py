"""Our BYE through a real record-routing proxy after the connection the dialog came on has
closed: sipp (the PBX) calls over TCP through Kamailio, which record-routes and relays to us
over TCP. Our idle timeout closes Kamailio's connection; when the RTP inactivity timeout ends
the call, the BYE must open a new connection to the first Record-Route hop (Kamailio, RFC 3261
18.1.1), which relays it to sipp on sipp's own connection.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rtp.ports import PortAllocator
from sip.app import CountingCallHandler
from sip.config import SipSettings
from sip.transport import SipServer
from tests.test_sip_sipp import free_port, run_sipp

KAMAILIO = shutil.which("kamailio")
pytestmark = [
    pytest.mark.skipif(KAMAILIO is None, reason="kamailio not installed"),
    pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp not installed (Debian package sip-tester)"),
    pytest.mark.timeout(60),
]

CONFIG = """#!KAMAILIO
debug=1
log_stderror=yes
children=1
tcp_children=1
auto_aliases=no
listen=tcp:127.0.0.1:{proxy_port}
mpath="{modules}"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "rr.so"
loadmodule "pv.so"
loadmodule "siputils.so"
request_route {{
    if (has_totag()) {{
        if (loose_route()) {{ t_relay(); exit; }}
        sl_send_reply("404", "Not here");
        exit;
    }}
    record_route();
    $du = "sip:127.0.0.1:{asr_port};transport=tcp";
    t_relay();
}}
"""


def modules_dir() -> str:
    for path in (
        "/usr/lib/x86_64-linux-gnu/kamailio/modules",
        "/usr/lib/kamailio/modules",
        "/usr/lib64/kamailio/modules",
    ):
        if Path(path, "tm.so").exists():
            return path
    pytest.skip("kamailio modules (tm, rr) not found")


def wait_listening(port: int, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"kamailio did not listen on {port}")


def test_bye_reopens_a_connection_to_the_record_route_proxy(tmp_path: Path) -> None:
    async def scenario() -> None:
        settings = SipSettings(
            host="127.0.0.1", port=0, transports=["tcp"], stream_idle_timeout_s=1.0, rtp_inactivity_timeout_s=3.0
        )
        handler = CountingCallHandler()
        server = SipServer(settings, handler, PortAllocator("127.0.0.1", 42000, 42999))
        await server.start()
        proxy_port = free_port(socket.SOCK_STREAM)
        config = tmp_path / "kamailio.cfg"
        config.write_text(
            CONFIG.format(proxy_port=proxy_port, asr_port=server.port("tcp"), modules=modules_dir()), encoding="utf-8"
        )
        assert KAMAILIO is not None
        proxy = subprocess.Popen(
            [KAMAILIO, "-f", str(config), "-DD", "-E", "-m", "32", "-M", "4", "-Y", str(tmp_path), "-w", str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_listening(proxy_port)
            rc, errors = await run_sipp(
                "uac_via_proxy_bye.xml", proxy_port, tmp_path, {"service": "asr"}, transport="t1"
            )
            assert rc == 0, errors[-3000:]
        finally:
            proxy.terminate()
            _, stderr = proxy.communicate(timeout=10)
            await server.stop(0.5)
        assert list(handler.ended.values()) == ["rtp-timeout"], stderr[-2000:]
        counters = server.counters
        assert counters["dropped.stream_idle_timeout"] >= 1  # we closed Kamailio's idle connection
        assert counters["connections.opened"] == 1 and counters["bye.sent"] == 1
        assert counters["bye.timeout"] == 0 and counters["dropped.no_connection"] == 0

    asyncio.run(scenario())
