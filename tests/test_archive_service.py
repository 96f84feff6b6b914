"""A call through the whole service into each archive store.

A real sipp call (the bundled recording, PCMU over RTP, ``X-Agent-Id`` in its INVITE) goes through
the running service (routing, the bundled model, KB, tags, the Publisher, a local Redis); the
archiver (``python -m archive run``, its own process) consumes the firehose into SQLite and into a
real PostgreSQL. Each store then finds the call by a phrase of the caller's words, by its demand
tag and by its agent, and an archived call reads back as the service published it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

from archive.store import CallQuery, open_store
from asr_common.scoring import cer
from asr_gateway.dev.demo import DATA_DIR, DEMO_CALLS, demo_config, place_demo_call
from asr_gateway.service import DEMO_MODEL_DIR, Service
from tests.archive_db import postgres, store_url
from tests.demo_quality import GOOD_ENOUGH_CER
from tests.redis_server import RedisServer, redis_server
from tests.test_archive_archiver import start_archiver
from tests.tool_marks import needs_redis_server, needs_sipp
from tests.waiting import wait_until

__all__ = ["postgres", "redis_server", "store_url"]  # fixtures, used by name
pytestmark = [needs_sipp, needs_redis_server]

AGENT = "1007"
SEED = DEMO_CALLS[0]  # the seed sentence, PCMU


def reference_text() -> str:
    for line in (DATA_DIR / "text").read_text(encoding="utf-8").splitlines():
        key, _, text = line.partition(" ")
        if key == SEED.wav:
            return text
    raise AssertionError(f"{SEED.wav} has no line in {DATA_DIR / 'text'}")


def test_a_call_through_the_service_is_found_in_the_archive(
    tmp_path: Path, redis_server: RedisServer, store_url: str
) -> None:
    async def one_call() -> None:
        service = Service(demo_config(redis_server.url, DEMO_MODEL_DIR, tmp_path / "service"))
        ports = await service.start()
        assert ports.sip_udp is not None
        try:
            agent_header = f"X-Agent-Id: {AGENT}"
            await place_demo_call(SEED, "archived", tmp_path / "calls", ports.sip_udp, extra_headers=agent_header)
        finally:
            await service.stop(grace_s=5)  # every final and call.ended published before it returns

    asyncio.run(one_call())
    store = open_store(store_url)
    archiver = start_archiver(redis_server.url, store_url, tmp_path / "archiver.log")
    try:

        def archived_and_ended() -> bool:
            hits = store.search(CallQuery(agent=AGENT)).hits
            return len(hits) == 1 and hits[0].ended_at is not None

        wait_until(archived_and_ended, 60, "the call archived through its call.ended")
    finally:
        archiver.send_signal(signal.SIGTERM)
        try:
            archiver.wait(10)
        except subprocess.TimeoutExpired:
            archiver.kill()
            archiver.wait()
    (hit,) = store.search(CallQuery(agent=AGENT)).hits
    record = store.call(hit.call_id)
    assert record is not None and record.agent == AGENT and record.source == "sip"
    said = "".join(final["text"] for final in record.finals)  # a plain call's one leg: role "mixed"
    assert cer(said, reference_text()) <= GOOD_ENOUGH_CER, record.finals
    assert [h.call_id for h in store.search(CallQuery(phrase="井盖发生了破损")).hits] == [hit.call_id]
    labels = {tag["label"] for tag in record.tags if tag.get("label")}
    assert labels, record.tags
    for label in labels:
        assert hit.call_id in [h.call_id for h in store.search(CallQuery(tag=label)).hits], label
    assert store.search(CallQuery(agent="someone-else")).hits == []
    store.close()
