"""Calls through a real record-routing proxy (Kamailio).

Our BYE after the connection the dialog came on has closed: sipp (the PBX) calls over TCP
through Kamailio, which record-routes and relays to us over TCP. Our idle timeout closes
Kamailio's connection; when the RTP inactivity timeout ends the call, the BYE must open a new
connection to the first Record-Route hop (Kamailio, RFC 3261 18.1.1), which relays it to sipp
on sipp's own connection.

A SIPREC session through the proxy (RFC 7866 over UDP): our 200 carries the Record-Route set
and a ``+sip.srs`` Contact, so the SRC's ACK and BYE come back through Kamailio; the service
admits SIP only from Kamailio's address, so a request that bypassed it would be refused.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from asr_gateway.dev.sipp_calls import place_call
from calls.handler import CountingCallHandler
from rtp.ports import PortAllocator
from sip.config import SipSettings
from sip.transport import SipServer
from tests.test_sip_sipp import free_port, run_sipp
from tests.tool_marks import needs_sipp
from tests.waiting import wait_until_async

KAMAILIO = shutil.which("kamailio")
pytestmark = [
    pytest.mark.skipif(KAMAILIO is None, reason="kamailio not installed"),
    needs_sipp,
    pytest.mark.timeout(60),
]

CONFIG = """#!KAMAILIO
debug=1
log_stderror=yes
children=1
tcp_children=1
auto_aliases=no
listen={transport}:127.0.0.1:{proxy_port}
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
    $du = "sip:127.0.0.1:{asr_port};transport={transport}";
    t_relay();
}}
"""


PBX_HOST = "127.0.0.100"  # sipp; Kamailio and the service are on 127.0.0.1


def start_kamailio(tmp_path: Path, transport: str, proxy_port: int, asr_port: int) -> subprocess.Popen[bytes]:
    """Kamailio record-routing every dialog-creating request to us on ``transport`` (tcp/udp)."""
    config = tmp_path / "kamailio.cfg"
    text = CONFIG.format(transport=transport, proxy_port=proxy_port, asr_port=asr_port, modules=modules_dir())
    config.write_text(text, encoding="utf-8")
    assert KAMAILIO is not None
    return subprocess.Popen(
        [KAMAILIO, "-f", str(config), "-DD", "-E", "-m", "32", "-M", "4", "-Y", str(tmp_path), "-w", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


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
        proxy = start_kamailio(tmp_path, "tcp", proxy_port, server.port("tcp"))
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


def udp_bound(port: int) -> bool:
    """Whether a socket is bound to UDP ``port`` on IPv4 (read from /proc, without touching the port)."""
    rows = Path("/proc/net/udp").read_text().splitlines()[1:]  # sl local_address rem_address ...
    return any(row.split()[1].endswith(f":{port:04X}") for row in rows)


def test_siprec_session_through_the_record_routing_proxy(tmp_path: Path) -> None:
    seconds = 2.0
    t = np.arange(int(8000 * seconds)) / 8000
    caller, agent = ((np.sin(2 * np.pi * hz * t) * 6000).astype(np.float32) for hz in (440, 900))

    async def scenario() -> None:
        settings = SipSettings(host="127.0.0.1", port=0, transports=["udp"], acl_cidrs=["127.0.0.1/32"])
        handler = CountingCallHandler()
        server = SipServer(settings, handler, PortAllocator("127.0.0.1", 43000, 43999))
        await server.start()
        proxy_port = free_port()
        proxy = start_kamailio(tmp_path, "udp", proxy_port, server.port("udp"))
        try:
            await wait_until_async(lambda: udp_bound(proxy_port), 10.0, f"kamailio bound UDP port {proxy_port}")
            result = await place_call(
                tmp_path / "sipp", proxy_port, caller, 8000, siprec=True, second_pcm=agent, host=PBX_HOST,
                target_host="127.0.0.1", via_proxy=True, call_tag="rec", timeout_s=30,
            )  # fmt: skip
            assert result.returncode == 0, result.errors[-3000:]
            for _ in range(100):
                if handler.ended:
                    break
                await asyncio.sleep(0.05)
        finally:
            proxy.terminate()
            _, stderr = proxy.communicate(timeout=10)
            await server.stop(0.5)
        assert list(handler.ended.values()) == ["bye"], stderr[-2000:]
        (call,) = handler.calls.values()
        assert call.siprec and call.peer[0] == "127.0.0.1"  # it came from Kamailio
        assert sorted(leg.role for leg in handler.legs.values()) == ["agent", "caller"]
        assert all(sink.samples >= 16000 * (seconds - 0.2) for sink in handler.sinks.values())
        counters = server.counters
        assert counters["acl.denied"] == 0 and counters["calls.ack_timeout"] == 0

    asyncio.run(scenario())
