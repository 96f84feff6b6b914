"""call.analytics through the whole service: a constructed SIPREC call whose agent starts talking
4 s in, while the caller is still speaking; sipp streams it, the bundled model decodes it, and the
event in Redis has each party's talk, the overlap (the agent interrupting) and the silence within
``TOLERANCE_MS`` of the recordings' own speech spans.

The reference spans are the recordings' first and last 20 ms frames above 5 % of their peak RMS
(``speech_span``); the service knows talk only from the finals' token times (CTC peaks, each
token at most ``kb_hooks.analytics.TOKEN_MS``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asr_core.audio_io import read_wav
from asr_gateway.config import load_config
from asr_gateway.dev.sipp_calls import PCMU, place_call
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import DATA, read_valid_events, run_calls, write_config
from tests.tool_marks import needs_redis_server, needs_sipp

__all__ = ["redis_server"]
pytestmark = [
    needs_sipp,
    needs_redis_server,
]

TOLERANCE_MS = 150
AGENT_DELAY_S = 4.0


def speech_span(samples: np.ndarray, rate: int) -> tuple[int, int]:
    """[first, last) ms of the 20 ms frames whose RMS exceeds 5 % of the loudest frame's."""
    frame = rate // 50
    frames = samples[: len(samples) // frame * frame].astype(np.float64).reshape(-1, frame)
    rms = np.sqrt((frames**2).mean(axis=1))
    loud = np.flatnonzero(rms > 0.05 * rms.max())
    return int(loud[0]) * 20, (int(loud[-1]) + 1) * 20


def test_talk_overlap_and_silence_of_a_constructed_call(tmp_path: Path, redis_server: RedisServer) -> None:
    caller, agent = read_wav(DATA / "hotline_seed.wav"), read_wav(DATA / "hotline_2.wav")
    rate = caller.sample_rate
    delay = np.zeros(int(AGENT_DELAY_S * rate), dtype=agent.samples.dtype)
    agent_pcm = np.concatenate([delay, agent.samples])
    length = max(len(agent_pcm), len(caller.samples)) + rate  # a second of silence after both
    caller_pcm = np.pad(caller.samples, (0, length - len(caller.samples)))
    agent_pcm = np.pad(agent_pcm, (0, length - len(agent_pcm)))
    caller_span, agent_span = speech_span(caller_pcm, rate), speech_span(agent_pcm, rate)
    config = load_config(write_config(tmp_path, redis_server.url), {})

    run_calls(config, lambda port: [place_call(tmp_path / "c", port, caller_pcm, rate, payload_type=PCMU,
                                               siprec=True, second_pcm=agent_pcm)])  # fmt: skip

    (analytics,) = [e for e in read_valid_events(redis_server.url) if e["event_type"] == "call.analytics"]
    expected_talk = {"caller": caller_span[1] - caller_span[0], "agent": agent_span[1] - agent_span[0]}
    overlap = min(caller_span[1], agent_span[1]) - max(caller_span[0], agent_span[0])
    heard = max(caller_span[1], agent_span[1]) - min(caller_span[0], agent_span[0])
    report = f"{analytics} vs talk {expected_talk}, overlap {overlap}, speech from first to last {heard}"
    for role, ms in expected_talk.items():
        assert abs(analytics["talk_ms"][role] - ms) <= TOLERANCE_MS, report
    assert analytics["overlap"]["count"] == 1, report
    assert abs(analytics["overlap"]["total_ms"] - overlap) <= TOLERANCE_MS, report
    assert analytics["overlap"]["interruptions"][0]["by"] == "agent", report
    assert abs(analytics["non_talk_ms"] - (analytics["duration_ms"] - heard)) <= TOLERANCE_MS, report
    assert abs(analytics["duration_ms"] - length * 1000 // rate) <= 200, report
