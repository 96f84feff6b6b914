"""The archiver: a consumer group on the firehose writing every call into the archive.

Each batch read with ``XREADGROUP`` is written in one database transaction and only then
acknowledged (``XACK``). A batch read and not acknowledged (the archiver was killed between the
read and the ack) stays in the group's pending list, and the next start reads that list first
(id ``0``) before new entries (``>``). So each entry reaches the database at least once, and the
store's ``event_id`` key makes a second delivery change nothing: exactly once in the database.
On a Redis Cluster the firehose is several shards (``kb_hooks.keys``); each is read in turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from archive.sql import SqlStore
from kb_hooks.keys import KeyLayout

log = logging.getLogger(__name__)
DEFAULT_GROUP = "archive"


@dataclass(frozen=True, slots=True)
class Retention:
    """Days a route's calls are kept after they end; ``default_days`` for routes not named
    (None: kept until deleted by hand)."""

    days_by_route: Mapping[str, int] = field(default_factory=dict)
    default_days: int | None = None

    def sweep(self, store: SqlStore, now: datetime) -> int:
        """Delete what is past its time; how many calls."""
        deleted = 0
        for route, days in self.days_by_route.items():
            deleted += store.delete_ended_before(_iso(now - timedelta(days=days)), routes=[route])
        if self.default_days is not None:
            cut = _iso(now - timedelta(days=self.default_days))
            deleted += store.delete_ended_before(cut, except_routes=list(self.days_by_route))
        return deleted


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class Archiver:
    """``run()`` until ``stop()``; ``archived`` counts events new to the database."""

    def __init__(
        self,
        client: aioredis.Redis,
        store: SqlStore,
        prefix: str = "asr",
        layout: KeyLayout | None = None,
        group: str = DEFAULT_GROUP,
        consumer: str = "archiver-1",
        batch: int = 500,
        block_ms: int = 500,
        retention: Retention | None = None,
        sweep_every_s: float = 3600.0,
    ) -> None:
        self.client = client
        self.store = store
        self.keys = (layout or KeyLayout()).firehoses(prefix)
        self.group = group
        self.consumer = consumer
        self.batch = batch
        self.block_ms = block_ms
        self.retention = retention or Retention()
        self.sweep_every_s = sweep_every_s
        self.archived = 0
        self.read = 0
        self._stop = asyncio.Event()
        self._next_sweep = 0.0

    def stop(self) -> None:
        self._stop.set()

    async def _ensure_groups(self) -> None:
        for key in self.keys:
            try:
                await self.client.xgroup_create(key, self.group, "0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def _read(self, key: str, from_id: str, block_ms: int | None) -> list[tuple[bytes, dict[bytes, bytes]]]:
        reply: Any = await self.client.xreadgroup(
            self.group, self.consumer, {key: from_id}, count=self.batch, block=block_ms
        )
        return [entry for _, entries in reply or [] for entry in entries if entry[1]]

    def _write(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        events = [json.loads(fields[b"event"]) for _, fields in entries if b"event" in fields]
        self.archived += self.store.apply(events)
        self.read += len(entries)

    async def _drain_pending(self, key: str) -> None:
        """What this consumer read and never acknowledged (a crash between write and ack)."""
        last = "0"
        while True:
            reply: Any = await self.client.xreadgroup(self.group, self.consumer, {key: last}, count=self.batch)
            entries = [e for _, es in reply or [] for e in es]
            if not entries:
                return
            await asyncio.to_thread(self._write, [e for e in entries if e[1]])  # a trimmed entry has no fields
            await self._ack(key, [e[0] for e in entries])
            last = entries[-1][0].decode()

    async def _ack(self, key: str, entry_ids: list[bytes]) -> None:
        """Only after the database committed them: an entry never acknowledged is read again."""
        await self.client.xack(key, self.group, *entry_ids)

    async def _sweep_if_due(self) -> None:
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.sweep_every_s
            deleted = await asyncio.to_thread(self.retention.sweep, self.store, datetime.now(UTC))
            if deleted:
                log.info("retention: deleted %d calls", deleted)

    async def run(self) -> None:
        await self._ensure_groups()
        for key in self.keys:
            await self._drain_pending(key)
        block = max(10, self.block_ms // len(self.keys))
        while not self._stop.is_set():
            await self._sweep_if_due()
            for key in self.keys:
                entries = await self._read(key, ">", block)
                if entries:
                    await asyncio.to_thread(self._write, entries)
                    await self._ack(key, [e[0] for e in entries])
