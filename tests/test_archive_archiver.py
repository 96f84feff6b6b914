"""The archiver (``python -m archive run``, its own process) on a real redis-server fed by the
gateway's Publisher, into SQLite and into a real PostgreSQL: SIGKILLed three times mid-stream
and started again, it ends with every durable event of every call exactly once (nothing lost,
nothing twice); the calls are found by a phrase of the caller's words, their tag and their
agent; the route redacts phone numbers, and the digits never reach the database (its rows, and
for SQLite its files on disk); SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from archive.sql import TABLES, SqlStore
from archive.store import CallQuery, open_store
from kb_hooks import events as ev
from tests.archive_db import postgres, store_url
from tests.console_helpers import LivePublisher, call_events, write_configs
from tests.redis_server import RedisServer, redis_server
from tests.waiting import wait_until

__all__ = ["postgres", "redis_server", "store_url"]
REPO = Path(__file__).resolve().parents[1]
PHONE = "13812345678"
CALLS = 40


def start_archiver(redis_url: str, db: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "archive", "run", "--redis", redis_url, "--db", db, "--batch", "4"]
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def test_killed_and_restarted_loses_and_duplicates_nothing(
    tmp_path: Path, redis_server: RedisServer, store_url: str
) -> None:
    conf = write_configs(tmp_path, redis_server.url).parent
    published: list[ev.Event] = []
    for n in range(CALLS):
        words = f"我的电话是{PHONE}新华路十二号井盖发生了破损" if n % 2 else "新华路十二号井盖发生了破损有安全隐患"
        published += call_events(f"call-{n:03d}", str(1001 + n % 3), conf, words)
    durable = [e for e in published if not isinstance(e, ev.TranscriptPartial)]
    with LivePublisher(redis_server.url, tmp_path / "pub") as publisher:
        for event in published:
            publisher.submit(event)
        publisher.wait_published(len(published))

    store = open_store(store_url)
    assert isinstance(store, SqlStore)
    log = tmp_path / "archiver.log"
    try:
        for at_least in (len(durable) // 5, len(durable) // 2, 3 * len(durable) // 4):
            archiver = start_archiver(redis_server.url, store_url, log)
            wait_until(partial(archived_at_least, store, at_least), 60, f"{at_least} events archived")
            archiver.send_signal(signal.SIGKILL)
            archiver.wait(10)
        assert store.count("events") < len(durable), "killed mid-stream, not after the end"
        archiver = start_archiver(redis_server.url, store_url, log)
        wait_until(lambda: store.count("events") >= len(durable), 60, "every event archived")
        archiver.send_signal(signal.SIGTERM)
        assert archiver.wait(20) == 0, log.read_text()

        ids = {row[0] for row in store.rows("events")}
        assert ids == {e.event_id for e in durable} and store.count("events") == len(durable)
        assert store.count("calls") == CALLS
        assert store.count("finals") == sum(isinstance(e, ev.TranscriptFinal) for e in durable)
        assert store.count("kb_cards") == sum(isinstance(e, ev.KbSuggestion) for e in durable)

        assert len(search_all(store, CallQuery(phrase="井盖发生了破损"))) == CALLS
        assert len(search_all(store, CallQuery(phrase="安全隐患"))) == CALLS // 2
        assert len(search_all(store, CallQuery(tag="市政设施/井盖", agent="1002"))) == len(range(1, CALLS, 3))
        record = store.call("call-001")
        assert record is not None and record.agent == "1002" and record.ended_at is not None
        assert "*" * len(PHONE) in record.finals[0]["text"]

        for table in TABLES:  # the route masked the number: the database never saw it
            for row in store.rows(table):
                assert PHONE not in repr(row), (table, row)
        said = [r["text"] for c in store.call_ids() for r in (store.call(c) or record).finals]
        assert said and not [text for text in said if re.search(r"\d{7}", text)]
        if store_url.startswith("sqlite://"):
            db = Path(store_url.removeprefix("sqlite://"))
            for path in (db, Path(f"{db}-wal")):
                assert not path.exists() or PHONE.encode() not in path.read_bytes()
    finally:
        store.close()
        if archiver.poll() is None:
            os.kill(archiver.pid, signal.SIGKILL)
            archiver.wait(10)


def archived_at_least(store: SqlStore, count: int) -> bool:
    return store.count("events") >= count


def search_all(store: SqlStore, query: CallQuery) -> list[str]:
    found, after = [], None
    while True:
        page = store.search(replace(query, after=after, limit=7))
        found += [h.call_id for h in page.hits]
        if page.next_after is None:
            return found
        after = page.next_after


def test_a_batch_written_and_never_acknowledged_is_read_again_and_changes_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The crash between the database commit and XACK, made certain: the first archiver's XACK
    fails; the next one (same consumer name) reads its pending entries first, finds every event
    already there, acknowledges them, and the group's pending list is empty."""
    import asyncio

    import redis.asyncio as aioredis

    from archive.archiver import Archiver

    conf = write_configs(tmp_path, redis_server.url).parent
    events = call_events("call-x", "1001", conf)
    durable = [e for e in events if not isinstance(e, ev.TranscriptPartial)]
    with LivePublisher(redis_server.url, tmp_path / "pub") as publisher:
        for event in events:
            publisher.submit(event)
        publisher.wait_published(len(events))
    store = open_store(f"sqlite://{tmp_path / 'archive.db'}")
    assert isinstance(store, SqlStore)

    class LostAck(ConnectionError):
        pass

    class KilledBeforeAck(Archiver):
        async def _ack(self, key: str, entry_ids: list[bytes]) -> None:
            raise LostAck

    async def scenario() -> int:
        client = aioredis.Redis.from_url(redis_server.url)
        first = KilledBeforeAck(client, store, batch=100, block_ms=50)
        try:
            await first.run()
        except LostAck:
            await client.aclose()
        assert store.count("events") == len(durable)
        client = aioredis.Redis.from_url(redis_server.url)
        second = Archiver(client, store, batch=100, block_ms=50)
        task = asyncio.create_task(second.run())

        async def drained() -> None:
            while (await client.xpending("asr:events", "archive"))["pending"]:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(drained(), 10)
        second.stop()
        await task
        await client.aclose()
        return second.archived

    try:
        assert asyncio.run(scenario()) == 0  # read again, nothing new
        assert store.count("events") == len(durable) and store.count("calls") == 1
    finally:
        store.close()
