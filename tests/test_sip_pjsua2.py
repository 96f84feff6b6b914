"""Interop with pjsua2 (PJSIP) as the caller: its WAV's samples must reach our sink intact.

tests/pjsua2_caller.py runs in a subprocess (pjsua2's Endpoint is process-wide and owns
threads) and places 1..4 calls to our SipServer, which runs in-process with real RtpLeg legs.
Each call plays a WAV generated here; the sink keeps every 16 kHz sample per leg. The expected
PCM is the WAV through our own chain (rtp.g711 encode/decode, then rtp.resample.Upsampler):
pjmedia sends the WAV's samples G.711-encoded unchanged (8 kHz bridge, no VAD/EC/resampling;
its A-law rounding is modelled, see PJMEDIA_NEGATIVE_BIAS), so after cross-correlation
alignment the two must agree up to the resampler's own rounding.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import sys
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calls.call import CallInfo, LegInfo
from calls.handler import CountingCallHandler
from calls.profile import Profile
from calls.routing import Router, RoutesFile
from rtp.g711 import decode, encode
from rtp.ports import PortAllocator
from rtp.resample import Upsampler
from rtp.sink import CountingSink
from sip.config import SipSettings
from sip.transport import SipServer
from tests.certs import self_signed_cert
from tests.test_sip_sipp import free_port

CALLER = Path(__file__).resolve().parent / "pjsua2_caller.py"
RATE_IN_HZ = 8000
RATE_OUT_HZ = 16000
PACKET_SAMPLES_OUT = 20 * RATE_OUT_HZ // 1000  # one 20 ms RTP packet at the sink's rate
# The expected signal passes the same G.711 tables and the same half-band filter as the
# received one, and that filter gives the same samples however its input is cut into pieces
# (the leg feeds 80 ms batches), so the match is exact (measured: PCMU identical, PCMA 107 dB,
# what remains being the filter's response to pjsua2's pre-roll silence, which A-law decodes
# to +-8). 90 dB allows 0.2 LSB rms against the -12 dBFS chirp (5790 LSB rms), while one lost
# 20 ms packet in the 2 s (silence: 20 dB, repeated: ~17 dB), a 0.1 dB level change (39 dB)
# or one G.711 code off on 1% of the samples (~47 dB; see pjmedia's A-law) fails.
MIN_SNR_DB = 90.0
# pjmedia's A-law table (PJMEDIA_HAS_ALAW_ULAW_TABLE) rounds negative samples differently from
# ITU G.711 / rtp.g711: it sends for x < 0 the code ITU gives x - 4, so samples within 4 LSB
# of a step boundary go one code further out (measured here: 44 dB unmodelled, 78 dB with
# the bias). Its mu-law agrees with ITU. A peer's encoder choice, not something we decode wrongly.
PJMEDIA_NEGATIVE_BIAS = {"PCMU": 0, "PCMA": -4}

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("pjsua2") is None,
        reason="pjsua2 not installed (pip install pjsua2-python, in the test extra)",
    ),
    pytest.mark.timeout(60),
]


class PcmKeepingHandler(CountingCallHandler):
    """CountingCallHandler whose sinks keep every sample, so tests can compare the PCM itself."""

    def open_leg(self, call: CallInfo, leg: LegInfo) -> CountingSink:
        super().open_leg(call, leg)
        sink = CountingSink(keep=True)
        self.sinks[leg.leg_id] = sink
        return sink


def chirp(seconds: float, low_hz: float, high_hz: float) -> np.ndarray:
    """A linear chirp at -12 dBFS with 10 ms fades, int16 shape (seconds * 8000,): its
    autocorrelation has one sharp peak, so cross-correlation finds the one right lag."""
    t = np.arange(int(seconds * RATE_IN_HZ)) / RATE_IN_HZ
    phase = 2 * np.pi * (low_hz * t + (high_hz - low_hz) * t**2 / (2 * seconds))
    fade = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.01)
    return (8192 * np.sin(phase) * fade).astype(np.int16)


def write_wav(path: Path, samples: np.ndarray) -> Path:
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(RATE_IN_HZ)
        writer.writeframes(samples.astype("<i2").tobytes())
    return path


def through_our_chain(codec: str, samples: np.ndarray) -> np.ndarray:
    """8 kHz int16 -> G.711 as pjmedia encodes it -> our decoder -> 16 kHz int16, as RtpLeg does it."""
    wide = samples.astype(np.int32)
    peer_rounded = np.where(wide < 0, np.maximum(wide + PJMEDIA_NEGATIVE_BIAS[codec], -32768), wide)
    upsampler = Upsampler()
    decoded = decode(codec, encode(codec, peer_rounded.astype(np.int16)))
    return np.concatenate([upsampler.process(decoded), upsampler.flush()])


def align(received: np.ndarray, expected: np.ndarray) -> int:
    """The offset in ``received`` (samples) where ``expected`` best fits, by FFT cross-correlation."""
    size = 1 << int(np.ceil(np.log2(len(received) + len(expected))))
    spectrum = np.fft.rfft(received.astype(np.float64), size) * np.conj(np.fft.rfft(expected.astype(np.float64), size))
    correlation = np.fft.irfft(spectrum, size)[: len(received) - len(expected) + 1]
    return int(np.argmax(correlation))


def snr_db(received: np.ndarray, expected: np.ndarray) -> float:
    error = received.astype(np.float64) - expected.astype(np.float64)
    noise = float(np.sum(error**2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(expected.astype(np.float64) ** 2)) / noise)


def active_span(pcm: np.ndarray, threshold: int = 256) -> int:
    """Samples from the first to the last one louder than ``threshold`` (G.711 silence is <= 8)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > threshold)
    return 0 if not len(loud) else int(loud[-1] - loud[0] + 1)


def assert_delivered(codec: str, sink: CountingSink, sent: np.ndarray) -> None:
    """The leg's PCM holds ``sent`` after our chain, sample-aligned, at >= MIN_SNR_DB, and nothing else loud."""
    expected = through_our_chain(codec, sent)
    received = sink.pcm
    assert sink.finished == 1
    assert len(received) >= len(expected), (len(received), len(expected))
    offset = align(received, expected)
    assert offset % 2 == 0, f"odd lag {offset}: an 8 kHz sample stream upsampled 2x can only shift by even lags"
    snr = snr_db(received[offset : offset + len(expected)], expected)
    assert snr >= MIN_SNR_DB, f"{codec}: SNR {snr:.1f} dB at lag {offset} < {MIN_SNR_DB} dB"
    span, expected_span = active_span(received), active_span(expected)
    assert abs(span - expected_span) <= PACKET_SAMPLES_OUT, (span, expected_span)


@asynccontextmanager
async def sip_server(
    handler: CountingCallHandler, router: Router | None = None, settings: SipSettings | None = None
) -> AsyncIterator[SipServer]:
    """Our SipServer on a free loopback UDP port with real RtpLeg legs.

    The RTP range starts at a pair that is free now and is wide (the allocator skips pairs it
    cannot bind), because other programs on a test machine may hold whole blocks of ports.
    """
    base = min(free_port(pair=True), 65535 - 400)
    ports = PortAllocator("127.0.0.1", base, base + 400)
    settings = settings or SipSettings(host="127.0.0.1", port=0, transports=["udp"])
    server = SipServer(settings, handler, ports, router)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=2.0)


async def call_with_pjsua2(
    server: SipServer,
    codec: str,
    wavs: list[Path],
    timeout_s: float = 25.0,
    delayed_offer: bool = False,
    srtp: bool = False,
    tls: bool = False,
) -> dict[str, Any]:
    """Run the caller to completion; returns its JSON report (asserting it succeeded)."""
    target = (
        f"sip:asr@127.0.0.1:{server.port('tls')};transport=tls" if tls else f"sip:asr@127.0.0.1:{server.port('udp')}"
    )
    args = [sys.executable, str(CALLER), "--target", target]
    args += ["--tls"] if tls else []
    args += ["--delayed-offer"] if delayed_offer else []
    args += ["--srtp"] if srtp else []
    args += ["--codec", codec, "--calls", str(len(wavs)), "--sip-port", str(free_port())]
    args += ["--rtp-port", str(free_port(pair=True)), "--timeout-s", str(timeout_s), *map(str, wavs)]
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s + 15)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    lines = stdout.decode(errors="replace").strip().splitlines()
    detail = (
        f"rc {process.returncode}, server counters {dict(server.counters)}\n"
        f"stdout: {stdout[-3000:]!r}\nstderr: {stderr[-3000:]!r}"
    )
    assert lines, f"pjsua2_caller printed nothing; {detail}"
    report: dict[str, Any] = json.loads(lines[-1])
    assert process.returncode == 0 and report["ok"], f"pjsua2_caller failed: {report.get('error')}; {detail}"
    return report


async def settle(server: SipServer, handler: CountingCallHandler, calls: int) -> None:
    """Wait until ``calls`` calls have ended and every leg is closed (BYE handling is asynchronous)."""
    for _ in range(250):
        if len(handler.ended) >= calls and not server.active_calls and handler.open_legs == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"calls not settled: ended {handler.ended}, active {server.active_calls}")


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
def test_wav_reaches_sink_sample_accurate(tmp_path: Path, codec: str) -> None:
    sent = chirp(2.0, 200, 3400)
    wav = write_wav(tmp_path / "chirp.wav", sent)

    async def scenario() -> None:
        handler = PcmKeepingHandler()
        async with sip_server(handler) as server:
            report = await call_with_pjsua2(server, codec, [wav])
            await settle(server, handler, 1)
            (leg,) = handler.legs.values()
            assert leg.codec == codec
            assert_delivered(codec, handler.sinks[leg.leg_id], sent)
            (result,) = report["calls"]
            assert result["status_codes"][-1] == 200 and result["confirmed"]

    asyncio.run(scenario())


def test_four_concurrent_calls_each_get_their_own_audio(tmp_path: Path) -> None:
    # Different sweeps per call: a leg fed another call's audio (or a mix) would fail the SNR.
    signals = [chirp(2.0, low, high) for low, high in [(200, 3400), (3400, 200), (500, 1500), (1500, 3000)]]
    wavs = [write_wav(tmp_path / f"call{i}.wav", signal) for i, signal in enumerate(signals)]

    async def scenario() -> None:
        handler = PcmKeepingHandler()
        async with sip_server(handler) as server:
            report = await call_with_pjsua2(server, "PCMU", wavs)
            await settle(server, handler, 4)
            assert len(handler.legs) == 4
            # Our call records carry the SIP Call-ID; pjsua2 reports which WAV each Call-ID played.
            wav_of = {result["sip_call_id"]: Path(result["wav"]) for result in report["calls"]}
            assert sorted(wav_of) == sorted(call.source_call_id for call in handler.calls.values())
            for call in handler.calls.values():
                (leg,) = call.legs
                sent = signals[wavs.index(wav_of[call.source_call_id])]
                assert_delivered("PCMU", handler.sinks[leg.leg_id], sent)

    asyncio.run(scenario())


def test_bye_from_pjsua2_ends_call_and_leg(tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "short.wav", chirp(0.5, 300, 3000))

    async def scenario() -> None:
        handler = PcmKeepingHandler()
        async with sip_server(handler) as server:
            report = await call_with_pjsua2(server, "PCMA", [wav])
            await settle(server, handler, 1)
            (result,) = report["calls"]
            assert result["hung_up_by_us"] and result["disconnected"]
            assert list(handler.ended.values()) == ["bye"]
            (sink,) = handler.sinks.values()
            assert sink.finished == 1
            assert server.counters["bye.sent"] == 0
            assert server.counters["calls.ended.bye"] == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
def test_delayed_offer_from_pjsua2_reaches_sink_sample_accurate(tmp_path: Path, codec: str) -> None:
    """pjsua2 as a second, independent delayed-offer UAC: it answers our offer in the ACK."""
    sent = chirp(2.0, 200, 3400)
    wav = write_wav(tmp_path / "chirp.wav", sent)

    async def scenario() -> None:
        handler = PcmKeepingHandler()
        async with sip_server(handler) as server:
            await call_with_pjsua2(server, codec, [wav], delayed_offer=True)
            await settle(server, handler, 1)
            assert server.counters["invites.offerless"] == 1
            assert server.counters["calls.answer_refused"] == 0
            (leg,) = handler.legs.values()
            assert_delivered(codec, handler.sinks[leg.leg_id], sent)

    asyncio.run(scenario())


@pytest.mark.parametrize("delayed_offer", [False, True])
def test_srtp_from_pjsua2_reaches_sink_sample_accurate(tmp_path: Path, delayed_offer: bool) -> None:
    """pjsua2 with SRTP mandatory (SDES, its own libsrtp) as an independent SRTP UAC: it offers
    RTP/SAVP (or, offerless, answers our RTP/SAVP offer) and its SRTP decodes sample-exact."""
    sent = chirp(2.0, 200, 3400)
    wav = write_wav(tmp_path / "chirp.wav", sent)
    router = Router(RoutesFile(profiles={"default": Profile(srtp="required")}))

    async def scenario() -> None:
        handler = PcmKeepingHandler()
        async with sip_server(handler, router) as server:
            await call_with_pjsua2(server, "PCMU", [wav], delayed_offer=delayed_offer, srtp=True)
            await settle(server, handler, 1)
            assert server.counters["calls.answer_refused"] == 0
            (leg,) = handler.legs.values()
            assert_delivered("PCMU", handler.sinks[leg.leg_id], sent)

    asyncio.run(scenario())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_srtp_over_tls_from_pjsua2_reaches_sink_sample_accurate(tmp_path: Path) -> None:
    """The way SDES keys should travel: SIP over TLS (pjsua2's TLS transport, our TLS listener)
    with SRTP mandatory."""
    cert, key = self_signed_cert(tmp_path)
    settings = SipSettings(
        host="127.0.0.1", port=0, tls_port=0, transports=["udp", "tls"], tls_cert=str(cert), tls_key=str(key)
    )
    sent = chirp(2.0, 200, 3400)
    wav = write_wav(tmp_path / "chirp.wav", sent)
    router = Router(RoutesFile(profiles={"default": Profile(srtp="required")}))

    async def scenario() -> None:
        handler = PcmKeepingHandler()
        async with sip_server(handler, router, settings) as server:
            await call_with_pjsua2(server, "PCMA", [wav], srtp=True, tls=True)
            await settle(server, handler, 1)
            (call,) = handler.calls.values()
            assert call.peer[2] == "tls"
            (leg,) = handler.legs.values()
            assert_delivered("PCMA", handler.sinks[leg.leg_id], sent)

    asyncio.run(scenario())
