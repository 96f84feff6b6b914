"""An RTCP BYE ends the call only when the peer's SIP BYE does not follow it within the grace time.

pjmedia-based callers send the RTCP BYE about 1 ms before the SIP BYE of a normal hangup;
tests/test_sip_pjsua2.py shows it with a real pjsua2, these tests pin the rule with a fake leg.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from asr_common.audio import PcmSink
from calls.handler import CountingCallHandler
from sip.config import SipSettings
from sip.header_values import NameAddr
from sip.message import Message, Request, Response, parse
from sip.transport import RTCP_BYE_GRACE_S, SipServer
from tests.test_sip_support import FakePorts, ack, invite
from tests.test_sip_transport import FakeLeg

pytestmark = pytest.mark.timeout(30)
LegEnds = list[Callable[[str], None]]


class Peer:
    """A UDP SIP peer on loopback that has placed one answered call to ``server``."""

    def __init__(self, server: SipServer) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.setblocking(False)
        self.target = ("127.0.0.1", server.port("udp"))
        self.loop = asyncio.get_running_loop()
        self.to_tag = ""

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendto(self.socket, data, self.target)

    async def receive(self, timeout_s: float = 5.0) -> Message:
        return parse(await asyncio.wait_for(self.loop.sock_recv(self.socket, 65536), timeout_s))

    async def call(self) -> None:
        await self.send(invite().replace(b"10.0.0.5:5062", b"127.0.0.1:%d" % self.socket.getsockname()[1]))
        assert isinstance(await self.receive(), Response)
        ok = await self.receive()
        assert isinstance(ok, Response) and ok.status == 200
        self.to_tag = NameAddr.parse(ok.headers.get("To") or "").tag or ""
        await self.send(ack(to_tag=self.to_tag))


async def run(scenario: Callable[[SipServer, Peer, LegEnds], Awaitable[None]]) -> CountingCallHandler:
    """Start a server whose legs are fakes (their ``on_end`` callbacks collected), place a call, run."""
    handler = CountingCallHandler()
    ends: LegEnds = []

    def factory(sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> FakeLeg:
        ends.append(on_end)
        return FakeLeg(sink)

    server = SipServer(
        SipSettings(host="127.0.0.1", port=0, transports=["udp"]), handler, FakePorts(), leg_factory=factory
    )
    await server.start()
    peer = Peer(server)
    try:
        await peer.call()
        for _ in range(100):
            if ends:
                break
            await asyncio.sleep(0.01)
        await scenario(server, peer, ends)
    finally:
        await server.stop(grace_s=1.0)
        peer.socket.close()
    return handler


def test_sip_bye_right_after_rtcp_bye_wins() -> None:
    async def scenario(server: SipServer, peer: Peer, ends: LegEnds) -> None:
        ends[0]("rtcp-bye")
        await asyncio.sleep(0.02)  # pacing: the RTCP BYE's end is under way when the SIP BYE comes
        await peer.send(invite(method="BYE", to_tag=peer.to_tag, cseq=2, branch="z9hG4bK-bye", body=""))
        ok = await peer.receive()
        assert isinstance(ok, Response) and ok.status == 200
        with pytest.raises(TimeoutError):
            await peer.receive(timeout_s=RTCP_BYE_GRACE_S + 0.3)  # no BYE of ours after the grace
        assert server.counters["bye.sent"] == 0
        assert server.counters["calls.ended.bye"] == 1

    handler = asyncio.run(run(scenario))
    assert list(handler.ended.values()) == ["bye"]


def test_rtcp_bye_alone_hangs_up_after_the_grace() -> None:
    async def scenario(server: SipServer, peer: Peer, ends: LegEnds) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        ends[0]("rtcp-bye")
        ends[0]("rtcp-bye")  # a second BYE (or leg) must not schedule a second hangup
        bye = await peer.receive()
        waited = loop.time() - started
        assert isinstance(bye, Request) and bye.method == "BYE"
        assert waited >= RTCP_BYE_GRACE_S * 0.9, waited
        await peer.send(bytes(Response(200, "OK", bye.headers)))
        with pytest.raises(TimeoutError):
            await peer.receive(timeout_s=RTCP_BYE_GRACE_S + 0.3)
        assert server.counters["bye.sent"] == 1
        assert server.counters["calls.ended.rtcp-bye"] == 1

    handler = asyncio.run(run(scenario))
    assert list(handler.ended.values()) == ["rtcp-bye"]
