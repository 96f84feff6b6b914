"""pjsua2 (PJSIP's own stack, an independent UAC) calls the whole service in G.722 and in
PCMU with the bundled seed recording; redis-server receives the events.

pjsua2 offers only the codec asked for (tests/pjsua2_caller.py), with its conference bridge at
the codec's rate: 16 kHz for G.722, fed a 16 kHz copy of the recording, and 8 kHz for PCMU,
fed the 8 kHz original. The G.722 call's final text must read like the PCMU call's within the
demo CER bound (tests/demo_quality.py), and its leg must be G.722 end to end.
"""

from __future__ import annotations

import asyncio
import importlib.util
import wave
from pathlib import Path

import numpy as np
import pytest

from asr_common.audio import PcmSink
from asr_common.scoring import cer
from asr_core.audio_io import read_wav
from asr_gateway.config import load_config
from asr_gateway.service import Service
from calls.call import CallInfo, LegInfo
from tests.demo_quality import GOOD_ENOUGH_CER
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import DATA, read_valid_events, wait_drained, write_config
from tests.test_sip_pjsua2 import call_with_pjsua2
from tests.tool_marks import needs_redis_server

__all__ = ["redis_server"]  # the fixture, used by name

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("pjsua2") is None, reason="pjsua2 not installed (pjsua2-python)"),
    needs_redis_server,
    pytest.mark.timeout(120),
]


def write_wav_16k(path: Path, samples: np.ndarray) -> Path:
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes(np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes())
    return path


def test_pjsua2_g722_call_reads_like_its_pcmu_call(tmp_path: Path, redis_server: RedisServer) -> None:
    config = load_config(write_config(tmp_path, redis_server.url), {})
    seed_8k = DATA / "hotline_seed.wav"
    seed_16k = write_wav_16k(tmp_path / "seed_16k.wav", read_wav(seed_8k, 16000).samples)
    reports: dict[str, str] = {}
    codecs: dict[str, str] = {}  # SIP Call-ID -> the codec its leg was opened with

    async def scenario() -> None:
        service = Service(config)
        bridge = service.sip.handler
        open_leg = bridge.open_leg

        def noting_open_leg(call: CallInfo, leg: LegInfo) -> PcmSink:
            codecs[call.source_call_id] = leg.codec
            return open_leg(call, leg)

        bridge.open_leg = noting_open_leg  # type: ignore[method-assign]
        await service.start()
        try:
            for codec, wav in (("PCMU", seed_8k), ("G722", seed_16k)):
                report = await call_with_pjsua2(service.sip, codec, [wav], timeout_s=30.0)
                reports[codec] = report["calls"][0]["sip_call_id"]
            await wait_drained(service)
        finally:
            await service.stop(grace_s=5)

    asyncio.run(scenario())
    events = read_valid_events(redis_server.url)
    by_codec = {codec: [e for e in events if e["sip_call_id"] == call_id] for codec, call_id in reports.items()}
    finals = {
        codec: "".join(str(e["text"]) for e in evs if e["event_type"] == "transcript.final")
        for codec, evs in by_codec.items()
    }
    assert finals["PCMU"] and finals["G722"], finals
    print(f"pjsua2 G.722 vs PCMU: CER {cer(finals['G722'], finals['PCMU']):.3f}, finals {finals}")
    assert cer(finals["G722"], finals["PCMU"]) <= GOOD_ENOUGH_CER, finals
    assert {codecs[call_id]: codec for codec, call_id in reports.items()} == {"PCMU": "PCMU", "G722": "G722"}
