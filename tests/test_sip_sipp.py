"""Interop with a real, independent SIP peer: sipp (Debian's sip-tester) against our SipServer.

sipp runs the hand-written scenarios in tests/sipp/ as the UAC on loopback; our server runs
in-process on asyncio with a CountingCallHandler and real rtp.leg.RtpLeg legs. Audio comes from
a pcap of G.711 RTP that the test writes (sipp's play_pcap_audio replays it to our SDP port).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from asr_common.audio import PcmSink
from asr_gateway.dev import sipp_calls
from calls.handler import CountingCallHandler
from calls.profile import Profile, RoleRuleModel
from calls.routing import Router, RoutesFile
from rtp.g711 import encode
from rtp.leg import RtpLeg
from rtp.ports import PortAllocator
from rtp.srtp import SrtpKeys, SrtpSender
from sip.config import SipSettings
from sip.message import Address
from sip.transport import LegFactory, SipServer
from tests.test_rtp_leg import tone_packets

SIPP = shutil.which("sipp")
SCENARIOS = Path(__file__).resolve().parent / "sipp"
pytestmark = [
    pytest.mark.skipif(SIPP is None, reason="sipp not installed (Debian package sip-tester)"),
    pytest.mark.timeout(60),
]


def free_port(kind: int = socket.SOCK_DGRAM, pair: bool = False) -> int:
    """A free loopback port (an even one with a free successor when ``pair``)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, kind) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if not pair:
            return port
        port -= port % 2
        try:
            with (
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a,
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b,
            ):
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair on loopback")


def _ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack("!10H", header))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def write_rtp_pcap(path: Path, payload_type: int, seconds: float = 1.0, first_seq: int = 0) -> int:
    """A pcap (Ethernet/IPv4/UDP) of 20 ms G.711 RTP packets of a 440 Hz tone; returns the packet count.

    sipp replays the packets as they are, so a second playback in one call needs later
    sequence numbers and timestamps (``first_seq``) or the receiver drops them as duplicates.
    """
    codec = {0: "PCMU", 8: "PCMA"}[payload_type]
    count = int(seconds * 50)
    tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(count * 160) / 8000)).astype(np.int16)
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for i in range(count):
        payload = encode(codec, tone[i * 160 : (i + 1) * 160])
        seq = first_seq + i
        marker = 0x80 if i == 0 else 0
        rtp = struct.pack("!BBHII", 0x80, payload_type | marker, seq, seq * 160, 0x1234ABCD) + payload
        udp = struct.pack("!HHHH", 4000, 4002, 8 + len(rtp), 0) + rtp
        ip = struct.pack(
            "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i, 0, 64, 17, 0, bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
        )
        ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
        frame = b"\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\x08\x00" + ip + udp
        micros = i * 20_000
        out += struct.pack("<IIII", micros // 1_000_000, micros % 1_000_000, len(frame), len(frame)) + frame
    path.write_bytes(bytes(out))
    return count


async def run_sipp(
    scenario: str,
    server_port: int,
    workdir: Path,
    keys: dict[str, str] | None = None,
    timeout_s: float = 20.0,
    transport: str = "u1",
) -> tuple[int, str]:
    """Run one sipp call of ``scenario``; returns (exit code, its error log). sipp_calls.run_sipp
    starts it again on other ports when a port picked for it was taken before sipp bound it."""

    def arguments(sip_local: int, media_base: int) -> list[str]:
        args = [
            "-sf", str(SCENARIOS / scenario), "-m", "1", "-l", "1", "-t", transport,
            "-i", "127.0.0.1", "-p", str(sip_local), "-mp", str(media_base), "-s", "4000",
            "-timeout", f"{int(timeout_s)}s", "-timeout_error", "-nostdin",
            "-trace_err", "-error_file", str(workdir / "errors.log"),
        ]  # fmt: skip
        for key, value in (keys or {}).items():
            args += ["-key", key, value]
        return [*args, f"127.0.0.1:{server_port}"]

    return await asyncio.wait_for(
        sipp_calls.run_sipp(workdir, "127.0.0.1", arguments, tcp=transport.startswith("t")), 3 * (timeout_s + 10)
    )


class Harness:
    def __init__(
        self,
        tmp_path: Path,
        capacity: int = 100,
        router: Router | None = None,
        leg_factory: LegFactory | None = None,
        **settings: object,
    ) -> None:
        base = free_port(pair=True)
        self.ports = PortAllocator("127.0.0.1", 30000 + base % 20000, 30000 + base % 20000 + 40)
        self.handler = CountingCallHandler(capacity)
        config = SipSettings(host="127.0.0.1", port=0, transports=["udp", "tcp"], **settings)
        self.server = SipServer(config, self.handler, self.ports, router, leg_factory=leg_factory)
        self.tmp_path = tmp_path

    async def __aenter__(self) -> Harness:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(grace_s=2.0)

    async def sipp(self, scenario: str, transport: str = "u1", **keys: str) -> None:
        port = self.server.port("udp" if transport == "u1" else "tcp")
        rc, errors = await run_sipp(scenario, port, self.tmp_path, keys, transport=transport)
        assert rc == 0, f"sipp {scenario} failed (rc {rc}):\n{errors[-3000:]}"

    async def settle(self) -> None:
        """Let the server finish closing legs and notifying the handler."""
        for _ in range(100):
            if not self.server.active_calls and self.handler.open_legs == 0:
                return
            await asyncio.sleep(0.02)


@pytest.mark.parametrize(("payload_type", "codec"), [(0, "PCMU"), (8, "PCMA")])
def test_basic_call_with_rtp(tmp_path: Path, payload_type: int, codec: str) -> None:
    write_rtp_pcap(tmp_path / "audio.pcap", payload_type)

    async def scenario() -> None:
        async with Harness(tmp_path) as h:
            await h.sipp("uac_call.xml", codec=str(payload_type), codec_name=codec)
            await h.settle()
            assert list(h.handler.ended.values()) == ["bye"]
            (leg,) = h.handler.legs.values()
            assert (leg.codec, leg.role) == (codec, "mixed")
            sink = h.handler.sinks[leg.leg_id]
            assert sink.finished == 1
            assert sink.samples >= 0.8 * 16000, sink.samples
            assert h.server.counters["responses.200"] >= 2

    asyncio.run(scenario())


def call_through_while_bound(tmp_path: Path, taken: socket.socket) -> None:
    """One sipp call through the harness while ``taken`` holds a port sipp is handed first: it
    must go through (sipp started again elsewhere) and end with a BYE."""

    async def scenario() -> None:
        async with Harness(tmp_path) as h:
            await h.sipp("uac_call.xml", codec="0", codec_name="PCMU")
            await h.settle()
            assert list(h.handler.ended.values()) == ["bye"]

    with taken:
        asyncio.run(scenario())


def test_sipp_started_again_when_its_port_is_taken_before_it_binds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a free-port probe leaves open: another process binds the port first. sipp exits at
    start-up ("Unable to bind main socket"), is started again on a fresh port, and the call goes through."""
    write_rtp_pcap(tmp_path / "audio.pcap", 0)
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    handed: list[int] = []
    real_free_port = sipp_calls._free_port

    def first_one_taken(host: str, tcp: bool) -> int:
        handed.append(taken.getsockname()[1] if not handed else real_free_port(host, tcp))
        return handed[-1]

    monkeypatch.setattr(sipp_calls, "_free_port", first_one_taken)

    call_through_while_bound(tmp_path, taken)
    assert len(handed) == 2 and handed[0] != handed[1]


def test_sipp_started_again_when_its_media_port_is_taken_before_it_binds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race on sipp's media ports (-mp: audio RTP at the base, video at base + 2, both
    bound at start-up): "Unable to bind video RTP socket", then a fresh start on other ports."""
    write_rtp_pcap(tmp_path / "audio.pcap", 0)
    real_free_udp_ports = sipp_calls._free_udp_ports
    base = real_free_udp_ports(4)
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", base + 2))  # the video RTP port of the first base handed out
    handed: list[int] = []

    def first_one_half_taken(count: int, host: str = "127.0.0.1") -> int:
        if count == 1:
            return real_free_udp_ports(count, host)
        handed.append(base if not handed else real_free_udp_ports(count, host))
        return handed[-1]

    monkeypatch.setattr(sipp_calls, "_free_udp_ports", first_one_half_taken)

    call_through_while_bound(tmp_path, taken)
    assert len(handed) == 2 and handed[0] == base != handed[1]


def test_cancel_before_answer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Harness(tmp_path, answer_delay_ms=3000) as h:
            await h.sipp("uac_cancel.xml")
            await h.settle()
            assert h.server.active_calls == 0
            assert h.handler.legs == {}
            assert h.server.counters["responses.487"] == 1
            assert h.server.counters["calls.ended.cancel"] == 1

    asyncio.run(scenario())


def test_reinvite_hold_and_resume(tmp_path: Path) -> None:
    write_rtp_pcap(tmp_path / "audio.pcap", 0, seconds=0.6)
    write_rtp_pcap(tmp_path / "audio2.pcap", 0, seconds=0.6, first_seq=1000)

    async def scenario() -> None:
        async with Harness(tmp_path) as h:
            await h.sipp("uac_hold.xml", codec="0", codec_name="PCMU")
            await h.settle()
            assert list(h.handler.ended.values()) == ["bye"]
            (sink,) = h.handler.sinks.values()
            assert sink.samples >= 1.5 * 0.6 * 16000, sink.samples
            assert h.server.counters["responses.200"] >= 4

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["u1", "t1"])
def test_bye_from_us_after_rtp_timeout(tmp_path: Path, transport: str) -> None:
    async def scenario() -> None:
        async with Harness(tmp_path, rtp_inactivity_timeout_s=1.0) as h:
            transports: set[str] = set()
            feed = h.server.feed

            def recording_feed(data: bytes, source: Address) -> None:
                transports.add(source.transport)
                feed(data, source)

            h.server.feed = recording_feed  # type: ignore[method-assign]
            await h.sipp("uac_rtp_timeout.xml", transport, codec="8", codec_name="PCMA")
            await h.settle()
            assert transports == {"tcp" if transport == "t1" else "udp"}
            assert list(h.handler.ended.values()) == ["rtp-timeout"]
            assert h.server.counters["bye.sent"] == 1
            assert h.server.active_calls == 0

    asyncio.run(scenario())


def test_siprec_two_labelled_streams(tmp_path: Path) -> None:
    write_rtp_pcap(tmp_path / "audio.pcap", 0)
    profile = Profile(roles=RoleRuleModel(agent_aor=r"^sip:agent"))
    router = Router(RoutesFile(profiles={"default": profile}))

    async def scenario() -> None:
        async with Harness(tmp_path, router=router) as h:
            await h.sipp("uac_siprec.xml")
            await h.settle()
            assert list(h.handler.ended.values()) == ["bye"]
            legs = sorted(h.handler.legs.values(), key=lambda leg: leg.label or "")
            assert [(leg.label, leg.role, leg.codec) for leg in legs] == [
                ("1", "agent", "PCMU"),
                ("2", "caller", "PCMA"),
            ]
            assert legs[0].aor == "sip:agent1001@pbx.example"
            assert legs[1].aor == "sip:+8613800000000@carrier.example"
            (call,) = h.handler.calls.values()
            assert call.siprec
            assert h.handler.sinks[legs[0].leg_id].samples >= 0.8 * 16000

    asyncio.run(scenario())


def test_offer_without_g711_gets_488(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Harness(tmp_path) as h:
            await h.sipp("uac_no_g711.xml")
            assert h.server.counters["responses.488"] == 1
            assert h.handler.legs == {}

    asyncio.run(scenario())


@pytest.mark.parametrize(("capacity", "scenario_file"), [(10, "uac_options_200.xml"), (0, "uac_options_503.xml")])
def test_options(tmp_path: Path, capacity: int, scenario_file: str) -> None:
    async def scenario() -> None:
        async with Harness(tmp_path, capacity=capacity) as h:
            await h.sipp(scenario_file)

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["u1", "t1"])
def test_delayed_offer_with_answer_in_the_ack(tmp_path: Path, transport: str) -> None:
    write_rtp_pcap(tmp_path / "audio.pcap", 8)

    async def scenario() -> None:
        async with Harness(tmp_path) as h:
            await h.sipp("uac_delayed_offer.xml", transport, codec="8", codec_name="PCMA")
            await h.settle()
            assert list(h.handler.ended.values()) == ["bye"]
            (leg,) = h.handler.legs.values()
            assert leg.codec == "PCMA"
            assert h.handler.sinks[leg.leg_id].samples >= 0.8 * 16000

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["u1", "t1"])
def test_delayed_offer_without_answer_in_the_ack_gets_bye(tmp_path: Path, transport: str) -> None:
    async def scenario() -> None:
        async with Harness(tmp_path) as h:
            await h.sipp("uac_delayed_offer_no_answer.xml", transport)
            await h.settle()
            assert list(h.handler.ended.values()) == ["no-acceptable-answer"]
            assert h.server.counters["calls.answer_refused"] == 1
            assert h.server.active_calls == 0

    asyncio.run(scenario())


def test_update_with_sdp_holds_and_resumes(tmp_path: Path) -> None:
    write_rtp_pcap(tmp_path / "audio.pcap", 0, seconds=0.6)
    write_rtp_pcap(tmp_path / "audio2.pcap", 0, seconds=0.6, first_seq=1000)

    async def scenario() -> None:
        async with Harness(tmp_path) as h:
            await h.sipp("uac_update.xml", codec="0", codec_name="PCMU")
            await h.settle()
            assert list(h.handler.ended.values()) == ["bye"]
            (sink,) = h.handler.sinks.values()
            assert sink.samples >= 1.5 * 0.6 * 16000, sink.samples

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["u1", "t1"])
def test_srtp_only_offer_is_refused_with_a_warning(tmp_path: Path, transport: str) -> None:
    async def scenario() -> None:
        async with Harness(tmp_path) as h:
            await h.sipp("uac_savp_refused.xml", transport)
            assert h.server.counters["responses.488"] == 1
            assert h.handler.legs == {}

    asyncio.run(scenario())


def test_avp_and_savp_alternatives_take_avp_when_srtp_is_off(tmp_path: Path) -> None:
    write_rtp_pcap(tmp_path / "audio.pcap", 0)
    router = Router(RoutesFile(profiles={"default": Profile(srtp="off")}))

    async def scenario() -> None:
        async with Harness(tmp_path, router=router) as h:
            await h.sipp("uac_savp_alternatives.xml", codec="0", codec_name="PCMU")
            await h.settle()
            assert list(h.handler.ended.values()) == ["bye"]
            (leg,) = h.handler.legs.values()
            assert h.handler.sinks[leg.leg_id].samples >= 0.8 * 16000

    asyncio.run(scenario())


@pytest.mark.parametrize(("transport", "srtp"), [("u1", "optional"), ("t1", "required")])
def test_srtp_sdes_offer_is_answered_with_our_key_and_its_srtp_decoded(
    tmp_path: Path, transport: str, srtp: str
) -> None:
    """sipp offers RTP/SAVP (_32 and _80 lines); the answer takes _80 with our own key; SRTP
    protected with the offered key (libsrtp, as sipp cannot encrypt), with the offered 4-byte
    MKI before each 10-byte tag, reaches the sink."""
    key = bytes(range(30))
    sender = SrtpSender(SrtpKeys("AES_CM_128_HMAC_SHA1_80", key))
    protected = [sender.protect(p) for p in tone_packets("PCMU", seconds=1.0)]
    tone = [p[:-10] + b"\x00\x00\x00\x01" + p[-10:] for p in protected]
    legs: list[RtpLeg] = []

    def leg_factory(sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> RtpLeg:
        legs.append(RtpLeg(sink=sink, payload_types=payload_types, on_end=on_end))
        return legs[-1]

    async def stream_when_answered() -> None:
        while not legs or legs[0].local_port is None:
            await asyncio.sleep(0.01)
        port = legs[0].local_port
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for packet in tone:
                sock.sendto(packet, ("127.0.0.1", port))
                await asyncio.sleep(0.005)

    router = Router(RoutesFile(profiles={"default": Profile(srtp=srtp)}))

    async def scenario() -> None:
        async with Harness(tmp_path, router=router, leg_factory=leg_factory) as h:
            media = asyncio.create_task(stream_when_answered())
            await h.sipp("uac_srtp.xml", transport, key=base64.b64encode(key).decode())
            await media
            await h.settle()
            assert list(h.handler.ended.values()) == ["bye"]
            (leg,) = h.handler.legs.values()
            assert h.handler.sinks[leg.leg_id].samples >= 0.9 * 16000, legs[0].stats
            assert legs[0].stats.srtp_auth_failed == legs[0].stats.bad_packets == 0

    asyncio.run(scenario())


def test_calls_refused_by_a_full_node_are_counted_by_call_id(tmp_path: Path) -> None:
    """A node with no room answers each INVITE 503: ``place_calls`` names every refused call
    with its status (from sipp's error file), here with sipp pinned to one core (``taskset``)."""
    core = min(os.sched_getaffinity(0))

    async def scenario() -> sipp_calls.CallResult:
        async with Harness(tmp_path, capacity=0) as h:
            pcm = np.zeros(8000, dtype=np.float32)
            return await sipp_calls.place_calls(
                tmp_path / "load", h.server.port("udp"), pcm, 16000, 2, total=3, call_tag="full", cpus={core}
            )

    result = asyncio.run(scenario())
    assert result.returncode != 0
    assert sorted(result.rejected.values()) == [503, 503, 503], result.errors[-2000:]
    assert all(call_id.startswith("full-") for call_id in result.rejected)
