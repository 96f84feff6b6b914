"""SRTP/SRTCP receive (rtp.srtp) and an SRTP leg on loopback: libsrtp protects on the sending
side (pylibsrtp), the leg unprotects; wrong keys and replays are counted and never decoded."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtp.leg import RtpLeg
from rtp.poller import FastReceiver
from rtp.sink import CountingSink
from rtp.srtp import AWAITING_KEYS, PROFILES, SrtpKeys, SrtpReceiver, SrtpSender
from tests.test_rtp_leg import HOST, PAYLOAD_TYPES, open_leg, tone_packets, wait_for

KEY = bytes(range(30))
OTHER_KEY = bytes(range(1, 31))


def rtcp_bye(ssrc: int) -> bytes:
    return struct.pack("!BBHI", 0x81, 203, 1, ssrc)


@pytest.mark.parametrize("suite", list(PROFILES))
def test_unprotect_gives_back_the_plain_packet(suite: str) -> None:
    packets = tone_packets("PCMU", seconds=0.2)
    sender, receiver = SrtpSender(SrtpKeys(suite, KEY)), SrtpReceiver(SrtpKeys(suite, KEY))
    protected = [sender.protect(p) for p in packets]
    assert all(p != q and len(q) == len(p) + PROFILES[suite][1] for p, q in zip(packets, protected, strict=True))
    assert [receiver.unprotect(p) for p in protected] == packets
    bye = rtcp_bye(0x5EED)
    assert receiver.unprotect_rtcp(sender.protect_rtcp(bye)) == bye
    stats = receiver.stats
    assert stats.srtp_auth_failed == stats.srtp_replayed == stats.srtp_bad == 0


def test_wrong_key_tampering_replay_and_garbage_are_counted_apart() -> None:
    packets = tone_packets("PCMU", seconds=0.1)
    suite = "AES_CM_128_HMAC_SHA1_80"
    sender = SrtpSender(SrtpKeys(suite, KEY))
    protected = [sender.protect(p) for p in packets]
    wrong = SrtpReceiver(SrtpKeys(suite, OTHER_KEY))
    assert [wrong.unprotect(p) for p in protected] == [None] * len(packets)
    assert wrong.stats.srtp_auth_failed == len(packets)
    receiver = SrtpReceiver(SrtpKeys(suite, KEY))
    tampered = bytearray(protected[0])
    tampered[20] ^= 1
    assert receiver.unprotect(bytes(tampered)) is None
    assert receiver.unprotect(protected[0]) == packets[0]
    assert receiver.unprotect(protected[0]) is None
    assert receiver.unprotect(b"\x80\x00") is None
    assert (receiver.stats.srtp_auth_failed, receiver.stats.srtp_replayed, receiver.stats.srtp_bad) == (1, 1, 1)


def test_an_mki_before_the_tag_is_stripped() -> None:
    """RFC 3711 3.1: the MKI sits between the encrypted payload and the tag, unauthenticated."""
    suite = "AES_CM_128_HMAC_SHA1_32"
    sender = SrtpSender(SrtpKeys(suite, KEY))
    receiver = SrtpReceiver(SrtpKeys(suite, KEY, mki_length=4))
    (packet,) = tone_packets("PCMA", seconds=0.02)
    protected = sender.protect(packet)
    with_mki = protected[:-4] + b"\x00\x00\x00\x01" + protected[-4:]
    assert receiver.unprotect(with_mki) == packet
    bye = rtcp_bye(0x5EED)
    protected_rtcp = sender.protect_rtcp(bye)
    assert receiver.unprotect_rtcp(protected_rtcp[:-10] + b"\x00\x00\x00\x01" + protected_rtcp[-10:]) == bye


def test_repr_never_shows_the_key() -> None:
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", KEY)
    for thing in (keys, SrtpReceiver(keys), SrtpSender(keys)):
        text = repr(thing)
        assert KEY.hex() not in text and repr(KEY) not in text and "key=" not in text, text


async def send(port: int, packets: list[bytes], sock: socket.socket | None = None) -> None:
    """Send ``packets`` to the leg on ``port`` from ``sock`` (default: a new socket)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as own:
        for data in packets:
            (sock or own).sendto(data, (HOST, port))
            await asyncio.sleep(0.001)


@pytest.mark.parametrize("fast_path", [True, False])
def test_srtp_leg_plays_what_a_plain_leg_plays(fast_path: bool) -> None:
    """The same tone, once plain and once as SRTP (with SRTCP BYE on the RTP port, RFC 5761):
    the sinks get the same PCM; with the C receive path built, it takes the SRTP leg's packets too."""
    packets = tone_packets("PCMU")
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", KEY)
    sender = SrtpSender(keys)

    async def scenario() -> None:
        plain, plain_sink, plain_port = await open_leg(fast_path=fast_path, resample_batch_ms=0)
        secure, secure_sink, secure_port = await open_leg(fast_path=fast_path, resample_batch_ms=0, srtp=keys)
        ended: list[str] = []
        secure._on_end = ended.append
        await send(plain_port, packets)
        await send(secure_port, [sender.protect(p) for p in packets])
        await wait_for(lambda: plain.stats.packets == len(packets) and secure.stats.packets == len(packets))
        # armed when the C receiver is built and can unprotect (a build without set_srtp cannot)
        assert secure._fast.armed == (fast_path and hasattr(FastReceiver, "set_srtp"))
        await send(secure_port, [sender.protect_rtcp(rtcp_bye(0x5EED))])
        await wait_for(lambda: ended == ["rtcp-bye"])
        plain_stats, secure_stats = await plain.close(), await secure.close()
        assert secure_stats.srtp_auth_failed == secure_stats.bad_packets == 0
        assert secure_stats.rtcp_packets == 1
        assert plain_stats.samples_out == secure_stats.samples_out == 16000
        assert np.array_equal(plain_sink.pcm, secure_sink.pcm)

    asyncio.run(scenario())


def test_srtp_leg_with_the_wrong_key_decodes_nothing() -> None:
    packets = tone_packets("PCMU", seconds=0.5)
    sender = SrtpSender(SrtpKeys("AES_CM_128_HMAC_SHA1_32", OTHER_KEY))

    async def scenario() -> None:
        leg, sink, port = await open_leg(srtp=SrtpKeys("AES_CM_128_HMAC_SHA1_32", KEY))
        await send(port, [sender.protect(p) for p in packets])
        await send(port, [os.urandom(60)])
        await wait_for(lambda: leg.stats.srtp_auth_failed + leg.stats.srtp_bad == len(packets) + 1)
        stats = await leg.close()
        assert stats.srtp_auth_failed >= len(packets)
        assert stats.packets == stats.samples_out == sink.samples == 0

    asyncio.run(scenario())


def test_keys_set_after_open_and_back_to_plain() -> None:
    """A re-INVITE turning SRTP on (and off again) changes how the open leg reads packets."""
    packets = tone_packets("PCMA", seconds=0.6)
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", KEY)
    sender = SrtpSender(keys)

    async def scenario() -> None:
        leg, _, port = await open_leg()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            await send(port, packets[:10], peer)
            await wait_for(lambda: leg.stats.packets == 10)
            leg.set_srtp(keys)
            await send(port, [sender.protect(p) for p in packets[10:20]], peer)
            await wait_for(lambda: leg.stats.packets == 20)
            leg.set_srtp(None)
            await send(port, packets[20:], peer)
            await wait_for(lambda: leg.stats.packets == len(packets))
        stats = await leg.close()
        assert stats.srtp_auth_failed == stats.lost == stats.bad_packets == 0

    asyncio.run(scenario())


def test_leg_repr_and_stats_hold_no_key() -> None:
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", KEY)
    leg = RtpLeg(sink=CountingSink(), payload_types=PAYLOAD_TYPES, srtp=keys)
    assert KEY.hex() not in repr(vars(leg)) and repr(KEY) not in repr(vars(leg))
    assert KEY.hex() not in repr(leg.stats.as_dict())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(list(PROFILES)), st.integers(min_value=0, max_value=8))
def test_any_datagram_is_unprotected_or_counted(data: bytes, suite: str, mki_length: int) -> None:
    """Garbage into an SRTP leg's handlers: counted and dropped, never raised, never decoded."""
    sink = CountingSink()
    leg = RtpLeg(sink=sink, payload_types=PAYLOAD_TYPES, srtp=SrtpKeys(suite, KEY, mki_length))
    leg.handle_rtp(data, (HOST, 4000))
    leg.handle_rtcp(data, (HOST, 4001))
    stats = leg.stats
    assert stats.packets == sink.samples == 0
    assert stats.srtp_auth_failed + stats.srtp_bad + stats.srtp_replayed + stats.bad_packets >= 1


def test_c_and_python_paths_unprotect_alike_through_disruptions() -> None:
    """The same SRTP datagrams (in order, then a replay, a tampered packet, a reordered pair,
    a loss, an SRTCP report) into a C-path leg and a Python-path leg: same PCM, same counters."""
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_32", KEY)
    sender = SrtpSender(keys)
    protected = [sender.protect(p) for p in tone_packets("PCMA", seconds=1.0)]
    tampered = bytearray(protected[25])
    tampered[-1] ^= 0xFF
    script = protected[:20] + [protected[12]] + [bytes(tampered)] + protected[20:25]
    script += [protected[26], protected[25]] + protected[27:30] + protected[31:40]
    script += [sender.protect_rtcp(struct.pack("!BBHI", 0x80, 200, 6, 0x5EED) + bytes(20))] + protected[40:]

    async def scenario() -> dict[bool, tuple[np.ndarray, dict[str, int | float | None]]]:
        results = {}
        for fast in (True, False):
            leg, sink, port = await open_leg(fast_path=fast, srtp=keys)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
                await send(port, script, peer)
                await wait_for(lambda leg=leg: leg.stats.packets == len(protected) - 1)  # type: ignore[misc]
            stats = (await leg.close()).as_dict()
            results[fast] = (sink.pcm, {k: v for k, v in stats.items() if "time" not in k and k != "jitter_ms"})
        return results

    results = asyncio.run(scenario())
    (fast_pcm, fast_stats), (slow_pcm, slow_stats) = results[True], results[False]
    assert fast_stats == slow_stats
    assert (fast_stats["srtp_replayed"], fast_stats["srtp_auth_failed"], fast_stats["lost"]) == (1, 1, 1)
    assert fast_stats["rtcp_packets"] == 1 and fast_stats["reordered"] == 1
    assert np.array_equal(fast_pcm, slow_pcm)


def test_a_leg_awaiting_its_keys_drops_everything() -> None:
    """Our RTP/SAVP offer is out, the peer's key comes with the ACK: SRTP arriving before it
    is counted and dropped, never decoded as plain RTP; with the keys it plays."""
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", KEY)
    sender = SrtpSender(keys)
    protected = [sender.protect(p) for p in tone_packets("PCMU", seconds=0.4)]

    async def scenario() -> None:
        leg, sink, port = await open_leg(srtp=AWAITING_KEYS)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            await send(port, protected[:5], peer)
            await wait_for(lambda: leg.stats.srtp_bad == 5)
            assert leg.stats.packets == 0
            leg.set_srtp(keys)
            await send(port, protected[5:], peer)
            await wait_for(lambda: leg.stats.packets == len(protected) - 5)
        stats = await leg.close()
        assert stats.srtp_auth_failed == 0 and sink.samples == stats.samples_out > 0

    asyncio.run(scenario())
