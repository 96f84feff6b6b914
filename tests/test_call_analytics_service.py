"""call.analytics through the whole service: constructed SIPREC calls with known talk, silence and
overlap (the agent cutting in, the caller cutting in, turns with pauses and no overlap, several
turns each); sipp streams them, the bundled model decodes them, and each call's event in Redis has
each party's talk, the overlaps (count, total, who interrupted) and the non-talk time within
``TOLERANCE_MS`` of the recordings' own speech spans.

A clip's reference span is its first and last 20 ms frames above 5 % of its peak RMS
(``speech_span``); the service knows talk only from the finals' token times (CTC peaks, see
``kb_hooks.analytics``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asr_core.audio_io import read_wav
from asr_gateway.config import load_config
from asr_gateway.dev.sipp_calls import PCMU, place_call
from kb_hooks.analytics import Interval, merge, total
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import DATA, read_valid_events, run_calls, write_config
from tests.tool_marks import needs_redis_server, needs_sipp

__all__ = ["redis_server"]
pytestmark = [
    needs_sipp,
    needs_redis_server,
]

TOLERANCE_MS = 100
RATE = 16_000


@dataclass(frozen=True)
class Said:
    """One recording placed on a party's track, starting ``at_s`` seconds into the call."""

    role: str  # caller or agent
    clip: str  # a recording of tests/data/hotline_8k
    at_s: float


LAYOUTS: dict[str, tuple[Said, ...]] = {
    "agent_cuts_in": (Said("caller", "hotline_seed", 0.0), Said("agent", "hotline_2", 4.0)),
    "caller_cuts_in": (Said("agent", "hotline_1", 0.5), Said("caller", "hotline_3", 2.5)),
    "turns_with_pauses": (
        Said("agent", "hotline_3", 0.3),
        Said("caller", "hotline_1", 3.5),
        Said("agent", "hotline_2", 9.0),
    ),
    "several_turns_one_overlap": (
        Said("caller", "hotline_3", 0.0),
        Said("agent", "hotline_1", 3.0),
        Said("caller", "hotline_2", 6.5),
        Said("agent", "hotline_3", 11.5),
    ),
}


def speech_span(samples: np.ndarray) -> Interval:
    """[first, last) ms of the 20 ms frames whose RMS exceeds 5 % of the loudest frame's."""
    frame = RATE // 50
    frames = samples[: len(samples) // frame * frame].astype(np.float64).reshape(-1, frame)
    rms = np.sqrt((frames**2).mean(axis=1))
    loud = np.flatnonzero(rms > 0.05 * rms.max())
    return int(loud[0]) * 20, (int(loud[-1]) + 1) * 20


def build(layout: tuple[Said, ...]) -> tuple[dict[str, np.ndarray], dict[str, list[Interval]]]:
    """Each party's track (a second of silence after the last word) and its reference talk in ms."""
    clips = {s.clip: read_wav(DATA / f"{s.clip}.wav") for s in layout}
    assert all(c.sample_rate == RATE for c in clips.values())
    length = max(int(s.at_s * RATE) + len(clips[s.clip].samples) for s in layout) + RATE
    tracks = {role: np.zeros(length, dtype=np.float32) for role in ("caller", "agent")}
    talk: dict[str, list[Interval]] = {"caller": [], "agent": []}
    for said in layout:
        samples = clips[said.clip].samples
        start = int(said.at_s * RATE)
        tracks[said.role][start : start + len(samples)] += samples
        begin, end = speech_span(samples)
        talk[said.role].append((start * 1000 // RATE + begin, start * 1000 // RATE + end))
    return tracks, talk


def errors(analytics: dict[str, Any], talk: dict[str, list[Interval]], length_ms: int) -> dict[str, int]:
    """Each timing figure of ``analytics`` minus its reference, in ms (the overlaps' count and who
    interrupted whom must match exactly: the party whose clip started later cut in)."""
    caller, agent = merge(talk["caller"]), merge(talk["agent"])
    pairs = [(c, a) for c in caller for a in agent if max(c[0], a[0]) < min(c[1], a[1])]
    both = [(max(c[0], a[0]), min(c[1], a[1])) for c, a in pairs]
    interrupters = sorted("agent" if a[0] > c[0] else "caller" for c, a in pairs)
    assert analytics["overlap"]["count"] == len(pairs)
    assert sorted(i["by"] for i in analytics["overlap"]["interruptions"] for _ in range(i["count"])) == interrupters
    return {
        "talk_caller": analytics["talk_ms"]["caller"] - total(caller),
        "talk_agent": analytics["talk_ms"]["agent"] - total(agent),
        "overlap": analytics["overlap"]["total_ms"] - total(both),
        "non_talk": analytics["non_talk_ms"] - (length_ms - total(merge(caller + agent))),
        "duration": analytics["duration_ms"] - length_ms,
    }


def test_talk_overlap_and_silence_of_constructed_calls(tmp_path: Path, redis_server: RedisServer) -> None:
    built = {name: build(layout) for name, layout in LAYOUTS.items()}
    config = load_config(write_config(tmp_path, redis_server.url), {})

    tags = {name: f"an{i}" for i, name in enumerate(LAYOUTS)}  # each call's SIP Call-ID starts "anN-"

    run_calls(config, lambda port: [
        place_call(tmp_path / name, port, tracks["caller"], RATE, payload_type=PCMU, siprec=True,
                   second_pcm=tracks["agent"], call_tag=tags[name])
        for name, (tracks, _) in built.items()
    ])  # fmt: skip

    analytics = [e for e in read_valid_events(redis_server.url) if e["event_type"] == "call.analytics"]
    assert len(analytics) == len(LAYOUTS)
    for name, (tracks, talk) in built.items():
        (event,) = [e for e in analytics if e["sip_call_id"].startswith(f"{tags[name]}-")]
        found = errors(event, talk, len(tracks["caller"]) * 1000 // RATE)
        assert all(abs(ms) <= TOLERANCE_MS for ms in found.values()), (name, found, event, talk)
