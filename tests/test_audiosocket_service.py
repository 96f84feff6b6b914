"""Asterisk AudioSocket through the whole service: a client written from the protocol's public
description streams the bundled recording at 8 and 16 kHz, keys in digits and hangs up; two
connections whose UUIDs share a prefix are one call with a caller and an agent. Each gives the
recording's exact text in Redis. Bad input against the door alone: tests/test_audiosocket_door.py.
"""

from __future__ import annotations

import asyncio
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from asr_gateway.service import Service
from tests.audio_clients import audiosocket_call, recording
from tests.demo_quality import SEED_TEXT
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import read_valid_events, service_config, wait_drained
from tests.tool_marks import needs_redis_server

__all__ = ["redis_server"]  # the fixture, used by name

pytestmark = needs_redis_server

ROUTES = """
profiles:
  default: {role: mixed, redaction: keep}
  joined-caller: {role: caller, join_by: "uuid-prefix:24", redaction: keep}
  joined-agent: {role: agent, join_by: "uuid-prefix:24", redaction: keep}
routes:
  - {name: caller, match: {headers: {uuid: '^a0a0a0a0-.*c1$'}}, profile: joined-caller}
  - {name: agent, match: {headers: {uuid: '^a0a0a0a0-.*a1$'}}, profile: joined-agent}
"""
NARROW = uuid.UUID("08080808-0000-4000-8000-000000000001")
WIDE = uuid.UUID("16161616-0000-4000-8000-000000000001")
CALLER = uuid.UUID("a0a0a0a0-0000-4000-8000-0000000000c1")
AGENT = uuid.UUID("a0a0a0a0-0000-4000-8000-0000000000a1")


def test_audiosocket_calls_at_8_and_16_khz_and_a_joined_call(tmp_path: Path, redis_server: RedisServer) -> None:
    config = service_config(
        tmp_path, redis_server.url, ROUTES, "audiosocket: {enabled: true, host: 127.0.0.1, port: 0}\n"
    )
    seed8k, seed16k, other8k = (
        recording("hotline_seed", 8000),
        recording("hotline_seed", 16000),
        recording("hotline_1", 8000),
    )

    async def scenario() -> list[bytes]:
        service = Service(config)
        ports = await service.start()
        assert service.doors.audiosocket is not None
        port = service.doors.audiosocket.port
        try:
            replies = await asyncio.gather(
                audiosocket_call(port, NARROW, seed8k, 8000, keys="12"),
                audiosocket_call(port, WIDE, seed16k, 16000, keys="#"),
                audiosocket_call(port, CALLER, seed8k, 8000),
                audiosocket_call(port, AGENT, other8k, 8000, hang_up=False),
            )
            await wait_drained(service)
            assert not service.doors.audiosocket.refusals
            url = f"http://127.0.0.1:{ports.metrics}/metrics"
            metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
            assert 'asr_door_legs_total{door="audiosocket"} 4.0' in metrics
        finally:
            await service.stop(grace_s=5)
        return list(replies)

    assert asyncio.run(scenario()) == [b""] * 4  # the reply direction stays silent
    by_call: dict[str, list[dict[str, Any]]] = {}
    for event in read_valid_events(redis_server.url):
        assert event["sip_call_id"] == event["source_call_id"]  # v1's first name, kept for older consumers
        by_call.setdefault(event["source_call_id"], []).append(event)
    assert set(by_call) == {str(NARROW), str(WIDE), str(CALLER)}  # the agent's stream joined the caller's call

    def finals(events: list[dict[str, Any]], role: str) -> str:
        return "".join(
            e["text"] for e in events if e["event_type"] == "transcript.final" and e["participant"]["role"] == role
        )

    def ended(events: list[dict[str, Any]]) -> dict[str, Any]:
        return next(e for e in events if e["event_type"] == "call.ended")

    for stream, keys in ((NARROW, 2), (WIDE, 1)):
        events = by_call[str(stream)]
        assert finals(events, "mixed") == SEED_TEXT, stream
        assert ended(events)["reason"] == "hangup"
        assert list(ended(events)["stats"]["dtmf_events"].values()) == [keys]
    joined = by_call[str(CALLER)]
    started = next(e for e in joined if e["event_type"] == "call.started")
    assert sorted(p["role"] for p in started["participants"]) == ["agent", "caller"]
    assert started["source"] == "audiosocket"
    assert finals(joined, "caller") == SEED_TEXT
    assert finals(joined, "agent") == "早上七点多北京路附近暖气不热"
