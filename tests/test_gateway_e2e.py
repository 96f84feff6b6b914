"""The whole service on loopback: real sipp calls in, real redis-server out.

sipp (the PBX) streams bundled telephone-quality WAVs over RTP in PCMU and PCMA; a Redis
consumer reads the firehose and checks the events: call.started, partials, finals,
call.ended, SIPREC role labels, and the transcripts themselves: the bundled demo model reads
the bundled recordings, and a change that stops it from doing so must fail here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asr_common.scoring import cer
from asr_core.audio_io import read_wav
from asr_gateway.dev.sipp_calls import PCMA, PCMU, place_call
from tests.demo_quality import GOOD_ENOUGH_CER
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import DATA, REPO, read_events, read_valid_events, run_calls, service_config
from tests.tool_marks import needs_redis_server, needs_sipp

pytestmark = [
    needs_sipp,
    needs_redis_server,
]

__all__ = ["redis_server"]  # the fixture, used by name


def test_calls_through_the_whole_service(tmp_path: Path, redis_server: RedisServer) -> None:
    texts = dict(line.split(maxsplit=1) for line in (DATA / "text").read_text(encoding="utf-8").splitlines())
    seed = read_wav(DATA / "hotline_seed.wav")
    other = read_wav(DATA / "hotline_1.wav")
    config = service_config(tmp_path, redis_server.url)

    run_calls(
        config,
        lambda port: [
            place_call(tmp_path / "c1", port, seed.samples, 16000, payload_type=PCMU),
            place_call(tmp_path / "c2", port, other.samples, 16000, payload_type=PCMA),
            place_call(tmp_path / "c3", port, seed.samples, 16000, payload_type=PCMU, siprec=True),
        ],
    )
    events = read_events(redis_server.url)
    by_call: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_call.setdefault(event["call_id"], []).append(event)
    assert len(by_call) == 3
    for call_events in by_call.values():
        types = [e["event_type"] for e in call_events]
        assert types[0] == "call.started" and types[-1] == "call.ended", types
        assert call_events[0]["source"] == "sip"
        assert "transcript.final" in types
        seqs = [e["seq"] for e in call_events]
        assert seqs == sorted(seqs)
    siprec = [evs for evs in by_call.values() if len(evs[0].get("participants", [])) == 2]
    assert siprec, "the SIPREC call announces two participants"
    roles = {p["role"] for p in siprec[0][0]["participants"]}
    assert roles == {"caller", "agent"}
    seed_finals = ["".join(e["text"] for e in evs if e["event_type"] == "transcript.final")
                   for evs in by_call.values()]  # fmt: skip
    assert min(cer(text, texts["hotline_seed"]) for text in seed_finals) <= GOOD_ENOUGH_CER, seed_finals
    # The manhole-cover sentence: its KB entry and its tags, on a final.
    suggested = {e["entry_id"] for e in events if e["event_type"] == "kb.suggestion" and not e["is_partial"]}
    assert "kb-municipal-manhole" in suggested, suggested
    tag_events = [e for e in events if e["event_type"] == "tags" and not e["is_partial"]]
    assert any("井盖" in json.dumps(e["tags"], ensure_ascii=False) for e in tag_events), tag_events
    # The example route's analytics, right before call.ended, and its work-order draft.
    for call_events in by_call.values():
        analytics = call_events[-2]
        assert analytics["event_type"] == "call.analytics", [e["event_type"] for e in call_events]
        assert analytics["duration_ms"] >= 3_000 and sum(analytics["talk_ms"].values()) > 1_000, analytics
        assert analytics["non_talk_ms"] < analytics["duration_ms"], analytics
        assert [c["id"] for c in analytics["checks"]] == ["greeting", "address_read_back", "closing",
                                                          "no_forbidden_words"]  # fmt: skip
    drafts = [e for e in events if e["event_type"] == "workorder.updated"]
    assert any((d["fields"]["category"] or {}).get("value") == "市政设施/井盖" for d in drafts), drafts


def test_metadata_headers_reach_call_started(tmp_path: Path, redis_server: RedisServer) -> None:
    """The headers a route lists (X-Agent-Id, X-UCID) arrive in call.started.metadata in Redis,
    with From/To, the dialled number and the SIPREC session id; transcript events name the
    participant's aor and display name."""
    config = service_config(
        tmp_path,
        redis_server.url,
        "profiles:\n  default:\n    kb_set: hotline\n    metadata_headers: [X-Agent-Id, X-UCID, User-to-User]\n",
    )
    seed = read_wav(DATA / "hotline_seed.wav")
    headers = "X-Agent-Id: 1001\nx-ucid: 00001002121700000042"

    run_calls(
        config,
        lambda port: [
            place_call(tmp_path / "plain", port, seed.samples, 16000, call_tag="plain",
                       to_user="4008001234", extra_headers=headers),
            place_call(tmp_path / "rec", port, seed.samples, 16000, siprec=True, call_tag="rec",
                       extra_headers="X-Agent-Id: 2002"),
        ],
    )  # fmt: skip
    events = read_valid_events(redis_server.url)
    started = {e["sip_call_id"].split("-")[0]: e for e in events if e["event_type"] == "call.started"}
    plain = started["plain"]["metadata"]
    assert plain["X-Agent-Id"] == "1001" and plain["X-UCID"] == "00001002121700000042"
    assert "User-to-User" not in plain
    assert plain["dialled_number"] == "4008001234" and plain["from_name"] == "pbx"
    assert plain["from_uri"].startswith("sip:citizen@")
    recording = started["rec"]
    assert recording["metadata"]["X-Agent-Id"] == "2002"
    assert recording["metadata"]["siprec_session_id"] == "hotlinesess1"
    names = {p["role"]: (p["aor"], p["name"]) for p in recording["participants"]}
    assert names == {"caller": ("sip:citizen@citizen.example", "caller"), "agent": ("sip:1001@pbx.example", "agent")}
    transcripts = [e for e in events if e["event_type"].startswith("transcript.")]
    assert transcripts
    for event in transcripts:
        assert event["participant"]["aor"] and event["participant"]["name"], event["participant"]


def test_cucm_built_in_bridge_two_invites_are_one_call(tmp_path: Path, redis_server: RedisServer) -> None:
    """CUCM built-in-bridge recording: one INVITE per direction, From URI ``;x-nearend`` (the
    agent's phone) or ``;x-farend`` (the caller), both with the same ``;x-refci``. They are one
    call in Redis, with an agent and a caller participant, on a route that sets no ``join_by``
    (the parameters are unmistakable; issue 40 item 7)."""
    config = service_config(
        tmp_path,
        redis_server.url,
        "profiles:\n  cucm:\n    join_timeout_s: 5\n"
        "default_profile: cucm\n"
        "routes:\n  - name: cucm-bib\n    match: {from_user: '^(1001|citizen)$'}\n    profile: cucm\n",
    )
    seed = read_wav(DATA / "hotline_seed.wav")
    other = read_wav(DATA / "hotline_1.wav")

    run_calls(
        config,
        lambda port: [
            place_call(tmp_path / "near", port, seed.samples, 16000, call_tag="near", to_user="rec",
                       from_user="1001", from_uri_params=";x-nearend;x-refci=25396399;x-nearenddevice=SEP001"),
            place_call(tmp_path / "far", port, other.samples, 16000, call_tag="far", to_user="rec",
                       from_user="citizen", from_uri_params=";x-farend;x-refci=25396399;x-farendaddr=citizen"),
        ],
    )  # fmt: skip
    events = read_valid_events(redis_server.url)
    started = [e for e in events if e["event_type"] == "call.started"]
    assert len(started) == 1, started
    call_id = started[0]["call_id"]
    assert sorted(p["role"] for p in started[0]["participants"]) == ["agent", "caller"]
    assert {e["call_id"] for e in events} == {call_id}
    assert [e["event_type"] for e in events].count("call.ended") == 1
    assert events[-1]["event_type"] == "call.ended"
    finals = [e for e in events if e["event_type"] == "transcript.final"]
    assert {e["participant"]["role"] for e in finals} == {"agent", "caller"}


NAMES_SET = REPO / "recipes" / "testsets" / "names.txt"
NAMES_LIST = REPO / "recipes" / "testsets" / "names_hotwords.txt"


def names_sentence(index: int) -> tuple[str, np.ndarray]:
    """Sentence ``index`` of the names test set, rendered as ``recipes.recipe --stage more``
    renders it (espeak-ng, its held-out voice, the telephone channel): (text, 8 kHz samples)."""
    from recipes import data
    from recipes.recipe import SENTENCE_FILE_SEED
    from recipes.textgen import Sentence

    lines = [line.strip() for line in NAMES_SET.read_text(encoding="utf-8").splitlines() if line.strip()]
    jobs = data.make_jobs([Sentence(line, "file.names") for line in lines], SENTENCE_FILE_SEED, "names_", True)
    pcm, _ = data.render(jobs[index])
    return lines[index], pcm


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (the Makefile installs it)")
def test_a_routes_hotwords_fix_a_street_name_in_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    """The same recording of a caller naming a street, once to a route without and once to a route
    with the names list: the bundled model mishears 金沙江路 as the more frequent 锦江路 without
    the list and gets it right with it; the final in Redis shows it."""
    text, pcm = names_sentence(1)
    name = "金沙江路"
    assert name in text
    config = service_config(
        tmp_path,
        redis_server.url,
        "profiles:\n  plain: {}\n"
        f"  streets: {{hotwords: {NAMES_LIST}}}\n"
        "routes:\n  - {name: streets, match: {to_user: '^4002$'}, profile: streets}\n"
        "default_profile: plain\n",
    )

    run_calls(
        config,
        lambda port: [
            place_call(tmp_path / "plain", port, pcm, 8000, call_tag="plain", to_user="4001"),
            place_call(tmp_path / "streets", port, pcm, 8000, call_tag="streets", to_user="4002"),
        ],
    )
    finals: dict[str, str] = {}
    for event in read_valid_events(redis_server.url):
        if event["event_type"] == "transcript.final":
            tag = event["sip_call_id"].split("-")[0]
            finals[tag] = finals.get(tag, "") + event["text"]
    assert name not in finals["plain"], finals
    assert name in finals["streets"], finals
