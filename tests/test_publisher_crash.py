"""No durable event lost to a crash: a publisher process SIGKILLed with Redis up and down,
torn and corrupt journal records, replays de-duplicated by event_id, node_restart endings."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from kb_hooks.keys import event_ids_key, firehose_key, stream_key
from kb_hooks.ledger import NODE_RESTART
from kb_hooks.publisher import Publisher
from kb_hooks.spool import SPOOL_FILE, Spool, SpoolInUseError
from kb_hooks.types import CallContext
from tests.redis_server import RedisServer, free_port, redis_server  # noqa: F401
from tests.test_publisher import CALLER, settings, transcript, wait_until
from tests.tool_marks import needs_redis_server

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]

# A publisher process that plays the engine for ever: calls start, speak finals (and partials)
# and end; the parent kills it. Its audit file says which events were journaled.
_PRODUCER = """
import asyncio, sys, itertools
from pathlib import Path
from kb_hooks.publisher import Publisher
from kb_hooks.types import CallContext
from tests.test_publisher import CALLER, settings, transcript

async def main() -> None:
    tmp, url = Path(sys.argv[1]), sys.argv[2]
    publisher = Publisher(settings(url, tmp, journal_audit_file=tmp / "audit.txt", op_timeout_s=0.3))
    await publisher.start()
    for n in itertools.count():
        ctx = CallContext(f"{sys.argv[3]}-{n}", f"sip-{n}@pbx", "hotline")
        publisher.call_started(ctx, [CALLER])
        for i in range(6):
            publisher.submit(transcript(ctx, i, partial=i % 2 == 0, text=f"第{i}句"))
            await asyncio.sleep(0.002)
        if n % 3:
            publisher.call_ended(ctx, "bye")

asyncio.run(main())
"""


def audited(tmp_path: Path) -> list[str]:
    path = tmp_path / "audit.txt"
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


async def firehose(url: str) -> list[dict[str, Any]]:
    client = aioredis.from_url(url)
    entries: Any = await client.xrange(firehose_key("asr"))
    await client.aclose()
    return [json.loads(fields[b"event"]) for _, fields in entries]


def run_and_kill(tmp_path: Path, url: str, tag: str, seconds: float) -> None:
    script = tmp_path / "producer.py"
    script.write_text(_PRODUCER, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), url, tag], env=env, cwd=REPO)
    try:
        time.sleep(seconds)
        assert proc.poll() is None, "the producer died on its own"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@needs_redis_server
def test_sigkill_with_redis_up_and_down_loses_no_journaled_event(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    try:
        run_and_kill(tmp_path, server.url, "up", 3.0)  # Redis up: killed mid-flight
        server.stop(kill=True)
        run_and_kill(tmp_path, server.url, "down", 2.0)  # Redis down: everything waits in the journal
        server.start()

        async def restart() -> Publisher:
            publisher = Publisher(settings(server.url, tmp_path, journal_audit_file=tmp_path / "audit.txt"))
            await publisher.start()
            await wait_until(lambda: publisher.connected and publisher.spool_pending_bytes() == 0, timeout_s=60)
            await publisher.stop()
            return publisher

        publisher = asyncio.run(restart())
        made = audited(tmp_path)
        events = asyncio.run(firehose(server.url))
        found = Counter(e["event_id"] for e in events)
        assert len(made) > 100
        assert set(made) <= set(found), f"{len(set(made) - set(found))} journaled events are missing"
        assert max(found.values()) == 1, "an event reached Redis twice"
        ended = {e["call_id"] for e in events if e["event_type"] == "call.ended"}
        started = {e["call_id"] for e in events if e["event_type"] == "call.started"}
        assert started <= ended, "a call open at a crash was never ended"
        restart_ends = [e for e in events if e.get("reason") == NODE_RESTART]
        assert publisher.calls_ended_on_restart >= 1 and restart_ends
        for call_id in {e["call_id"] for e in restart_ends}:
            seqs = [e["seq"] for e in events if e["call_id"] == call_id]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"{call_id}: seq out of order {seqs}"
        assert not (tmp_path / "spool" / SPOOL_FILE).exists()
    finally:
        server.stop()


def test_torn_and_corrupt_records_are_skipped_and_counted(tmp_path: Path) -> None:
    ctx = CallContext("torn-1", "t@pbx", "hotline")
    finals = [transcript(ctx, i, partial=False, text=f"第{i}句") for i in range(5)]

    async def while_down() -> None:
        down = Publisher(settings(f"redis://127.0.0.1:{free_port()}/0", tmp_path))
        await down.start()
        down.call_started(ctx, [CALLER])
        for event in finals:
            down.submit(event)
        await wait_until(lambda: down.spooled == 6)
        await down.stop(flush_timeout_s=0.1)

    asyncio.run(while_down())
    journal = tmp_path / "spool" / SPOOL_FILE
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"id": "1-3", "prefix": "asr", "ev\n'  # a corrupt record in the middle
    journal.write_bytes(b"".join(lines) + b'{"id": "9-9", "prefix"')  # and a torn last one

    server = RedisServer(tmp_path / "redis")
    server.start()
    try:

        async def after_crash() -> None:
            publisher = Publisher(settings(server.url, tmp_path))
            await publisher.start()
            assert publisher.spool_torn_records == 1
            await wait_until(lambda: publisher.connected and publisher.spool_pending_bytes() == 0)
            assert publisher.spool_corrupt_skipped >= 1
            client = aioredis.from_url(server.url)
            entries: Any = await client.xrange(stream_key("asr", "torn-1"))
            kinds = [json.loads(fields[b"event"])["event_type"] for _, fields in entries]
            assert kinds == ["call.started", "transcript.final", "transcript.final", "transcript.final",
                             "transcript.final", "call.ended"]  # fmt: skip
            ended = json.loads(entries[-1][1][b"event"])
            assert ended["reason"] == NODE_RESTART and ended["seq"] == 7
            await client.aclose()
            await publisher.stop()

        asyncio.run(after_crash())
    finally:
        server.stop()


def test_replaying_a_journal_twice_adds_nothing(redis_server: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    ctx = CallContext("again-1")
    finals = [transcript(ctx, i, partial=False, text=f"第{i}句") for i in range(20)]

    async def journal_while_down() -> None:
        down = Publisher(settings(f"redis://127.0.0.1:{free_port()}/0", tmp_path))
        await down.start()
        for event in finals:
            down.submit(event)
        await wait_until(lambda: down.spooled == 20)
        await down.stop(flush_timeout_s=0.1)

    asyncio.run(journal_while_down())
    spool = tmp_path / "spool"
    copy = tmp_path / "copy"
    shutil.copytree(spool, copy)

    async def replay() -> int:
        publisher = Publisher(settings(redis_server.url, tmp_path))
        await publisher.start()
        await wait_until(lambda: publisher.replayed == 20)
        await publisher.stop()
        return publisher.duplicates_suppressed

    assert asyncio.run(replay()) == 0
    shutil.rmtree(spool)
    shutil.copytree(copy, spool)  # as if the offset was never saved
    assert asyncio.run(replay()) == 20

    async def check() -> None:
        client = aioredis.from_url(redis_server.url)
        assert await client.xlen(stream_key("asr", "again-1")) == 20
        assert await client.xlen(firehose_key("asr")) == 20
        assert await client.scard(event_ids_key("asr", "again-1")) == 20
        assert await client.ttl(event_ids_key("asr", "again-1")) > 0
        await client.aclose()

    asyncio.run(check())


def test_one_process_per_spool_directory(tmp_path: Path) -> None:
    first = Spool(tmp_path, 1 << 20)
    with pytest.raises(SpoolInUseError, match="in use by another running process"):
        Spool(tmp_path, 1 << 20)
    first.close()
    Spool(tmp_path, 1 << 20).close()


def test_compaction_keeps_pending_records_and_refuses_stale_offsets(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 1 << 16, compact_bytes=100)
    ends = spool.append([json.dumps({"n": n}) for n in range(20)])
    assert spool.read(0, 0, ends[-1], 5) == ([json.dumps({"n": n}) for n in range(5)], ends[4])
    spool.acknowledge(0, ends[14])
    assert spool.should_compact(0)  # acknowledged prefix >= 100 bytes and larger than the rest
    assert spool.compact(['{"checkpoint": {"open_calls": {}}}']) == 0
    assert spool.generation == 1 and spool.offset == 0
    spool.acknowledge(0, 5)  # an offset of the old file: ignored
    assert spool.offset == 0
    lines, _ = spool.read(1, 0, spool.size, 100)
    assert lines == ['{"checkpoint": {"open_calls": {}}}'] + [json.dumps({"n": n}) for n in range(15, 20)]
    assert spool.read(0, 0, spool.size, 100) == ([], 0)  # a reader of the old generation gets nothing
    spool.close()
    reopened = Spool(tmp_path, 1 << 16)
    assert reopened.offset == 0 and reopened.size == spool.size and reopened.torn_records == 0
    reopened.close()
