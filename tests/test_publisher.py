"""Publisher against a real redis-server: streams, pub/sub, ordering, consumer groups, TTL, AUTH."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis.asyncio as aioredis

from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.connection import parse_sentinel_url
from kb_hooks.keys import firehose_key, live_channel, stream_key
from kb_hooks.publisher import Publisher
from kb_hooks.types import CallContext, Participant
from tests.redis_server import RedisServer, redis_server  # noqa: F401

pytestmark = pytest.mark.timeout(120)

CALLER = Participant("caller", "sip:13800138000@pbx.local", "caller")


def transcript(ctx: CallContext, utterance_id: int, partial: bool, text: str) -> ev.Transcript:
    if partial:
        return ev.TranscriptPartial(call=ctx, participant=CALLER, utterance_id=utterance_id, text=text,
                                    begin_offset_ms=0, end_offset_ms=800, tokens=(), confidence=None,
                                    latency_ms=12.5)  # fmt: skip
    return ev.TranscriptFinal(call=ctx, participant=CALLER, utterance_id=utterance_id, text=text, begin_offset_ms=0,
                              end_offset_ms=800, tokens=(), confidence=None, latency_ms=12.5,
                              nbest=(ev.Alternative(text, -1.5),))  # fmt: skip


def settings(url: str, tmp_path: Path, **overrides: Any) -> RedisSettings:
    values: dict[str, Any] = {"url": url, "spool_dir": tmp_path / "spool", "connect_timeout_s": 0.5,
                              "op_timeout_s": 0.5, "retry_max_s": 0.2}  # fmt: skip
    values.update(overrides)
    return RedisSettings(**values)


async def wait_until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def stream_events(client: aioredis.Redis, key: str) -> list[dict[str, Any]]:
    entries: Any = await client.xrange(key)
    return [json.loads(fields[b"event"]) for _, fields in entries]


def test_call_lifecycle_streams_pubsub_groups_ttl(redis_server: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    async def scenario() -> None:
        cfg = settings(redis_server.url, tmp_path, firehose_groups=["dashboards"], call_ttl_s=120)
        client = aioredis.from_url(redis_server.url)
        pubsub = client.pubsub()
        await pubsub.subscribe(live_channel("asr"), live_channel("asr", "c1"))
        publisher = Publisher(cfg)
        await publisher.start()
        publisher.submit(transcript(CallContext("c0"), 0, True, "dropped: not connected yet"))
        await wait_until(lambda: publisher.connected)
        ctx = CallContext("c1", "abc@pbx", "hotline")
        publisher.call_started(ctx, [CALLER])
        publisher.submit(transcript(ctx, 0, True, "我今天"))
        publisher.submit(transcript(ctx, 0, False, "我今天发现井盖破损"))
        publisher.submit(transcript(ctx, 1, False, "谢谢"))
        publisher.call_ended(ctx, "bye", {"duration_ms": 1000})
        await wait_until(lambda: publisher.published == 5)

        in_call = await stream_events(client, stream_key("asr", "c1"))
        kinds = [e["event_type"] for e in in_call]
        assert kinds == ["call.started", "transcript.final", "transcript.final", "call.ended"]
        assert [e["seq"] for e in in_call] == sorted(e["seq"] for e in in_call)
        for event in in_call:
            jsonschema.validate(event, ev.schema())
        assert 0 < await client.ttl(stream_key("asr", "c1")) <= 120

        reply: Any = await client.xreadgroup("dashboards", "worker-1", {firehose_key("asr"): ">"}, count=100)
        fire = [json.loads(fields[b"event"]) for _, fields in reply[0][1]]
        assert [e["event_id"] for e in fire] == [e["event_id"] for e in in_call]
        assert await client.xack(firehose_key("asr"), "dashboards", *[i for i, _ in reply[0][1]]) == 4

        live: list[dict[str, Any]] = []
        for _ in range(100):
            if len(live) == 10:
                break
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is not None:
                live.append(json.loads(message["data"]))
        assert len(live) == 10
        assert sum(e["event_type"] == "transcript.partial" for e in live) == 2  # both channels
        await pubsub.aclose()
        await publisher.stop()
        await client.aclose()
        assert publisher.partials_dropped == 1 and publisher.spooled == 4  # every durable event is journaled

    asyncio.run(scenario())


def test_partials_to_stream_and_key_prefix_per_call(redis_server: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    async def scenario() -> None:
        publisher = Publisher(settings(redis_server.url, tmp_path, partials_to_stream=True))
        await publisher.start()
        publisher.submit(transcript(CallContext("c0"), 0, False, "connects"))
        await wait_until(lambda: publisher.published == 1)
        ctx = CallContext("c2", key_prefix="tenant7")
        publisher.call_started(ctx, [CALLER])
        publisher.submit(transcript(ctx, 0, True, "你好"))
        await wait_until(lambda: publisher.published == 3)
        client = aioredis.from_url(redis_server.url)
        kinds = [e["event_type"] for e in await stream_events(client, stream_key("tenant7", "c2"))]
        assert kinds == ["call.started", "transcript.partial"]
        assert await client.xlen(firehose_key("tenant7")) == 2
        await client.aclose()
        await publisher.stop()

    asyncio.run(scenario())


def test_auth_through_url(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", extra_args=["--requirepass", "s3cret"])
    server.start()
    try:

        async def scenario() -> None:
            wrong = Publisher(settings(f"redis://:nope@127.0.0.1:{server.port}/0", tmp_path / "a"))
            await wrong.start()
            wrong.call_started(CallContext("c3"), [CALLER])
            await wait_until(lambda: wrong.redis_errors > 0)
            assert wrong.published == 0
            await wrong.stop(flush_timeout_s=0.1)
            assert wrong.spool_pending_bytes() > 0  # kept, not lost

            right = Publisher(settings(f"redis://:s3cret@127.0.0.1:{server.port}/0", tmp_path / "b"))
            await right.start()
            right.call_started(CallContext("c3"), [CALLER])
            await wait_until(lambda: right.published == 1)
            await right.stop()

        asyncio.run(scenario())
    finally:
        server.stop()


def test_sentinel_url_parsing() -> None:
    target = parse_sentinel_url("redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26380/mymaster/2?sentinel_password=sp")
    assert target.hosts == [("10.0.0.1", 26379), ("10.0.0.2", 26380)]
    assert (target.service, target.db, target.password, target.sentinel_password, target.tls) == (
        "mymaster", 2, "pw", "sp", False)  # fmt: skip
    assert parse_sentinel_url("rediss+sentinel://h/m").tls
    with pytest.raises(ValueError, match="service name"):
        parse_sentinel_url("redis+sentinel://h:26379")
    with pytest.raises(ValueError, match="unknown option"):
        parse_sentinel_url("redis+sentinel://h:26379/m?colour=blue")


def test_sentinel_url_reaches_the_master(redis_server: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"sentinel monitor mymaster 127.0.0.1 {redis_server.port} 1\n")
    sentinel = RedisServer(tmp_path / "sentinel", extra_args=["--sentinel"], config_file=conf)
    sentinel.start()
    try:

        async def scenario() -> None:
            url = f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster/0"
            publisher = Publisher(settings(url, tmp_path))
            await publisher.start()
            publisher.call_started(CallContext("c4"), [CALLER])
            await wait_until(lambda: publisher.published == 1)
            await publisher.stop()
            client = aioredis.from_url(redis_server.url)
            assert await client.xlen(stream_key("asr", "c4")) == 1
            await client.aclose()

        asyncio.run(scenario())
    finally:
        sentinel.stop()
