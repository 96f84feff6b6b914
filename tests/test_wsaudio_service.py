"""The WebSocket door through the whole service, with clients written from each protocol's
public description on ``websocket-client`` (an independent RFC 6455 library, tests/audio_clients.py):
WeNet's runtime protocol at 16 kHz; our dialect at 8 kHz with its own chunk size; FreeSWITCH
``mod_audio_fork`` in mono (8 kHz), mixed (16 kHz) and stereo (8 and 16 kHz, caller and
agent of one call). Each gives the bundled recording's exact text in Redis (and, for WeNet and
ours, in the replies). Bad input against the door alone: tests/test_wsaudio_door.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from asr_gateway.service import Service
from tests.audio_clients import audio_fork_client, hotline_client, recording, wenet_client
from tests.demo_quality import SEED_TEXT
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import read_valid_events, service_config, wait_drained
from tests.tool_marks import needs_redis_server

__all__ = ["redis_server"]  # the fixture, used by name

pytestmark = needs_redis_server

OTHER_TEXT = "早上七点多北京路附近暖气不热"  # hotline_1, tests/data/hotline_8k/text
TOKEN = "s3cret-token-for-tests"
ROUTES = f"""
profiles:
  default: {{redaction: keep}}
  apps: {{redaction: keep, bearer_token: {TOKEN}, left_chunks: 8}}
  fork: {{redaction: keep, metadata_headers: [queue]}}
  fork-events: {{redaction: keep, send_events: true, roles: {{label_order: [agent, caller]}}}}
routes:
  - {{name: apps, match: {{headers: {{app: '^demo$'}}}}, profile: apps}}
  - {{name: fork-events, match: {{headers: {{queue: '^support$'}}}}, profile: fork-events}}
  - {{name: fork, match: {{headers: {{queue: .}}}}, profile: fork}}
"""


def test_wenet_ours_and_audio_fork_streams(tmp_path: Path, redis_server: RedisServer) -> None:
    config = service_config(
        tmp_path, redis_server.url, ROUTES, "websocket: {enabled: true, host: 127.0.0.1, port: 0}\n"
    )
    seed8k, seed16k = recording("hotline_seed", 8000), recording("hotline_seed", 16000)
    other8k, other16k = recording("hotline_1", 8000), recording("hotline_1", 16000)

    async def scenario() -> list[list[dict[str, Any]]]:
        service = Service(config)
        await service.start()
        assert service.doors.websocket is not None
        base = f"ws://127.0.0.1:{service.doors.websocket.port}"
        try:
            replies = await asyncio.gather(
                asyncio.to_thread(wenet_client, f"{base}/", seed16k),
                asyncio.to_thread(hotline_client, f"{base}/v1/stream?app=demo&token={TOKEN}", seed8k, 8000, 160, 6),
                asyncio.to_thread(audio_fork_client, f"{base}/?mix=mono&rate=8000&uuid=fork-mono",
                                  {"queue": "sales"}, [seed8k], 8000),
                asyncio.to_thread(audio_fork_client, f"{base}/?mix=mixed&rate=16k&uuid=fork-mixed",
                                  {"queue": "sales"}, [seed16k], 16000),
                asyncio.to_thread(audio_fork_client, f"{base}/?mix=stereo&rate=8k&uuid=fork-stereo8",
                                  {"queue": "sales"}, [seed8k, other8k], 8000),
                asyncio.to_thread(audio_fork_client, f"{base}/?mix=stereo&rate=16000&uuid=fork-stereo16",
                                  {"queue": "support"}, [other16k, seed16k], 16000, await_final=True),
            )  # fmt: skip
            await wait_drained(service)
            assert not service.doors.websocket.refusals
        finally:
            await service.stop(grace_s=5)
        return list(replies)

    wenet, ours, _, _, _, fork_events = asyncio.run(scenario())
    assert wenet[0] == {"status": "ok", "type": "server_ready"} and wenet[-1]["type"] == "speech_end"
    finals = [json.loads(str(r["nbest"]))[0]["sentence"] for r in wenet if r["type"] == "final_result"]
    assert "".join(finals) == SEED_TEXT
    assert {r["type"] for r in wenet[1:-1]} <= {"partial_result", "final_result"}
    assert ours[0]["chunk_ms"] == 160 and ours[0]["left_chunks"] == 6 and ours[0]["sample_rate"] == 8000
    assert "".join(str(e["text"]) for e in ours[1:] if e["event_type"] == "transcript.final") == SEED_TEXT
    assert any(e.get("event_type") == "transcript.final" for e in fork_events)  # the route asked for them

    by_call: dict[str, list[dict[str, Any]]] = {}
    for event in read_valid_events(redis_server.url):
        by_call.setdefault(event["call_id"], []).append(event)

    def text(events: list[dict[str, Any]], role: str) -> str:
        return "".join(
            e["text"] for e in events if e["event_type"] == "transcript.final" and e["participant"]["role"] == role
        )

    assert all(e["sip_call_id"] == e["source_call_id"] for evs in by_call.values() for e in evs)  # v1's first name
    calls = {str(evs[0]["source_call_id"]): evs for evs in by_call.values()}
    assert len(calls) == 6
    assert text(calls["fork-mono"], "caller") == SEED_TEXT
    assert text(calls["fork-mixed"], "mixed") == SEED_TEXT
    assert text(calls["fork-stereo8"], "caller") == SEED_TEXT and text(calls["fork-stereo8"], "agent") == OTHER_TEXT
    # this route names the channels agent, caller
    assert text(calls["fork-stereo16"], "agent") == OTHER_TEXT and text(calls["fork-stereo16"], "caller") == SEED_TEXT
    started = next(e for e in calls["fork-mono"] if e["event_type"] == "call.started")
    assert started["metadata"] == {"queue": "sales"} and started["source"] == "audio_fork"
    sources = sorted(evs[0]["source"] for evs in by_call.values())
    assert sources == ["audio_fork"] * 4 + ["websocket"] * 2  # WeNet's protocol and ours come in as websocket
