"""Nothing but partials is lost: Redis killed mid-stream, a publisher restarted with a full spool."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from kb_hooks import events as ev
from kb_hooks.keys import firehose_key, stream_key
from kb_hooks.publisher import Publisher
from kb_hooks.spool import SPOOL_FILE
from kb_hooks.types import CallContext
from tests.redis_server import RedisServer, free_port
from tests.test_publisher import settings, transcript, wait_until

pytestmark = pytest.mark.timeout(180)

CALLS = [CallContext(f"call-{n}", f"sip-{n}@pbx", "hotline") for n in range(5)]


async def ids_in(client: aioredis.Redis, key: str) -> list[dict[str, Any]]:
    entries: Any = await client.xrange(key)
    return [json.loads(fields[b"event"]) for _, fields in entries]


def test_redis_killed_mid_stream_loses_no_final(tmp_path: Path) -> None:
    # appendfsync always: what Redis acknowledged survives the SIGKILL, so any gap would be ours.
    server = RedisServer(tmp_path / "redis", extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    sent: list[ev.Transcript] = []

    def engine(publisher: Publisher) -> None:
        for i in range(1000):
            ctx = CALLS[i % len(CALLS)]
            event = transcript(ctx, i, partial=i % 3 == 0, text=f"第{i}句")
            sent.append(event)
            publisher.submit(event)
            if i == 300:
                server.stop(kill=True)
            if i == 700:
                server.start()
            time.sleep(0.001)

    async def scenario() -> None:
        publisher = Publisher(settings(server.url, tmp_path, queue_size=50, max_batch=20, op_timeout_s=0.3))
        await publisher.start()
        await wait_until(lambda: publisher.connected)
        thread = threading.Thread(target=engine, args=(publisher,))
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.05)
        finals = [e for e in sent if not isinstance(e, ev.TranscriptPartial)]
        await wait_until(lambda: publisher.queued() == 0 and publisher.spool_pending_bytes() == 0, timeout_s=30)
        assert publisher.spooled > 0, "the outage should have spilled to the spool"
        assert publisher.replayed > 0
        assert publisher.partials_dropped > 0
        assert publisher.inbox_full_dropped == publisher.spool_full_dropped == publisher.rejected == 0

        client = aioredis.from_url(server.url)
        expected = Counter(e.event_id for e in finals)
        arrived: Counter[str] = Counter()
        for ctx in CALLS:
            events = await ids_in(client, stream_key("asr", ctx.call_id))
            seqs = [e["seq"] for e in events]
            assert seqs == sorted(seqs), f"{ctx.call_id} out of order"
            arrived.update(e["event_id"] for e in events if e["event_type"] != "transcript.partial")
        assert arrived == expected  # every final exactly once per call stream
        firehose = Counter(e["event_id"] for e in await ids_in(client, firehose_key("asr")))
        assert set(firehose) == set(expected)
        await client.aclose()
        await publisher.stop()
        assert not (tmp_path / "spool" / SPOOL_FILE).exists()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


def test_restarted_publisher_replays_its_spool(tmp_path: Path) -> None:
    finals = [transcript(CALLS[i % 2], i, partial=False, text=f"第{i}句") for i in range(200)]

    async def while_down() -> Publisher:
        down = Publisher(settings(f"redis://127.0.0.1:{free_port()}/0", tmp_path, queue_size=20))
        await down.start()
        for event in finals:
            down.submit(event)
        await down.stop(flush_timeout_s=0.2)
        return down

    down = asyncio.run(while_down())
    assert down.published == 0 and down.spooled == 200
    assert (tmp_path / "spool" / SPOOL_FILE).exists()

    server = RedisServer(tmp_path / "redis")
    server.start()
    try:

        async def after_restart() -> None:
            publisher = Publisher(settings(server.url, tmp_path))
            await publisher.start()
            await wait_until(lambda: publisher.replayed == 200)
            client = aioredis.from_url(server.url)
            for ctx in CALLS[:2]:
                events = await ids_in(client, stream_key("asr", ctx.call_id))
                assert [e["event_id"] for e in events] == [e.event_id for e in finals if e.call_id == ctx.call_id]
            await client.aclose()
            await publisher.stop()
            assert not (tmp_path / "spool" / SPOOL_FILE).exists()

        asyncio.run(after_restart())
    finally:
        server.stop()
