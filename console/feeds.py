"""Everything the console knows about calls comes from Redis through this module.

One ``Hub`` per process reads, for each key prefix:

* the firehose ``{prefix}:events`` (``XREAD BLOCK``) into the ``CallIndex``: call summaries for
  the calls page (at start, the last ``bootstrap_events`` entries tell which calls are open);
  with a Redis Cluster URL, every firehose shard of ``kb_hooks.keys.KeyLayout``, each by its
  own reader (one ``XREAD`` may only name keys of one slot);
* the pub/sub channel ``{prefix}:live`` for partials (they are in no stream by default);
* for each call someone watches, the call's own stream (``KeyLayout.call_stream``) into a
  ``CallFeed``: its whole history, then each new entry, fanned out to every viewer of the
  call from memory, with the stream entry id as the SSE id. Redis sees one reader per watched
  call, however many viewers there are, and each event is serialized once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kb_hooks.events import EventType
from kb_hooks.keys import SINGLE, KeyLayout, live_channel

log = logging.getLogger(__name__)

RouteSizes = Callable[[str | None], int | None]  # a route's own chunk size (ms), None where unknown

BLOCK_MS = 1000
FEED_IDLE_S = 30.0
RETRY_S = 1.0


def no_route_sizes(route: str | None) -> int | None:
    """Where the console knows no routes file: every route's chunk size unknown."""
    return None


def stream_id_key(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode_entry(fields: dict[Any, Any]) -> dict[str, Any] | None:
    raw = fields.get(b"event", fields.get("event"))
    if raw is None:
        return None
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


@dataclass(frozen=True, slots=True)
class PartyPace:
    """How often one party's text updates: the engine's chunk size (ms) in force for its latest
    result (docs/events.md ``chunk_ms``: longer while the node is behind, surge), against the
    party's own size: its route's in the routes file where the console knows it, else the
    smallest the party reported (a stream starts at its own size and moves one size at a time)."""

    role: str | None
    label: str | None
    chunk_ms: int
    least_chunk_ms: int  # the smallest the party reported in this call
    route_chunk_ms: int | None  # its route's profile's, None where unknown
    seq: int  # of the result that told ``chunk_ms`` (0: none): a partial may come after later results

    @property
    def own_chunk_ms(self) -> int:
        return self.route_chunk_ms or self.least_chunk_ms

    @property
    def slowed(self) -> bool:
        return self.chunk_ms > self.own_chunk_ms

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "label": self.label, "chunk_ms": self.chunk_ms, "own_chunk_ms": self.own_chunk_ms}


@dataclass
class CallSummary:
    """One call as the calls page shows it."""

    call_id: str
    prefix: str
    started_at: str | None = None
    route: str | None = None
    participants: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    agent_id: str | None = None
    last_text: dict[str, Any] | None = None
    suggestions: list[str] = field(default_factory=list)
    ended_at: str | None = None
    end_reason: str | None = None
    analytics: dict[str, Any] | None = None  # call.analytics, as the supervisors' page sums it up
    # (participant role, label) -> how often its text updates, from the transcripts' chunk_ms
    pace: dict[tuple[str | None, str | None], PartyPace] = field(default_factory=dict)
    reduced_finals: int = 0  # finals searched the cheaper way while the node was behind (surge)
    updated: float = field(default_factory=time.time)

    @property
    def slowed(self) -> bool:
        """A party's text comes in longer chunks than its own: the node is saving capacity."""
        return any(p.slowed for p in self.pace.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "started_at": self.started_at,
            "route": self.route,
            "participants": self.participants,
            "metadata": self.metadata,
            "agent_id": self.agent_id,
            "last_text": self.last_text,
            "suggestions": self.suggestions,
            "ended_at": self.ended_at,
            "end_reason": self.end_reason,
            "analytics": self.analytics,
            "pace": [p.to_json() for p in self.pace.values()],
            "slowed": self.slowed,
            "reduced_finals": self.reduced_finals,
            "active": self.ended_at is None,
        }


class CallIndex:
    """Call summaries folded from events; ``changed`` is set (and replaced) on every update."""

    def __init__(self, agent_id_key: str, ended_keep_s: float, route_sizes: RouteSizes = no_route_sizes) -> None:
        self.agent_id_key = agent_id_key
        self.route_sizes = route_sizes
        self.ended_keep_s = ended_keep_s
        self.calls: dict[str, CallSummary] = {}
        self.version = 0
        self.changed = asyncio.Event()

    def _notify(self) -> None:
        self.version += 1
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def apply(self, prefix: str, event: dict[str, Any]) -> CallSummary | None:
        call_id = event.get("call_id")
        if not isinstance(call_id, str):
            return None
        call = self.calls.get(call_id)
        if call is None:
            call = self.calls[call_id] = CallSummary(call_id, prefix, route=event.get("route"))
        fold_event(call, event, self.agent_id_key, self.route_sizes)
        call.updated = time.time()
        self._notify()
        return call

    def prune(self) -> None:
        cutoff = time.time() - self.ended_keep_s
        gone = [cid for cid, c in self.calls.items() if c.ended_at is not None and c.updated < cutoff]
        for call_id in gone:
            del self.calls[call_id]
        if gone:
            self._notify()


def fold_event(
    call: CallSummary, event: dict[str, Any], agent_id_key: str, route_sizes: RouteSizes = no_route_sizes
) -> None:
    """Update ``call`` with what ``event`` says about it (``route_sizes``: each route's own chunk
    size in ms, console/route_sizes.py, or None where unknown)."""
    kind = event.get("event_type")
    if kind == EventType.CALL_STARTED:
        call.started_at = event.get("ts")
        call.route = event.get("route")
        call.participants = list(event.get("participants") or [])
        call.metadata = dict(event.get("metadata") or {})
        call.agent_id = call.metadata.get(agent_id_key)
    elif kind in (EventType.TRANSCRIPT_PARTIAL, EventType.TRANSCRIPT_FINAL):
        participant = event.get("participant") or {}
        role = participant.get("role")
        call.last_text = {
            "role": role,
            "text": event.get("text", ""),
            "is_partial": kind == EventType.TRANSCRIPT_PARTIAL,
        }
        chunk_ms = event.get("chunk_ms")
        if isinstance(chunk_ms, int) and chunk_ms > 0:
            party = (role, participant.get("label"))
            seq = event.get("seq")
            seq = seq if isinstance(seq, int) else 0
            before = call.pace.get(party)
            least = chunk_ms if before is None else min(before.least_chunk_ms, chunk_ms)
            if before is not None and seq < before.seq:  # a partial (pub/sub) after later results
                chunk_ms, seq = before.chunk_ms, before.seq
            call.pace[party] = PartyPace(role, party[1], chunk_ms, least, route_sizes(call.route), seq)
        if kind == EventType.TRANSCRIPT_FINAL and event.get("reduced_search") is True:
            call.reduced_finals += 1
    elif kind == EventType.KB_SUGGESTION and event.get("status") != "withdrawn":
        title = str(event.get("title", ""))
        if title not in call.suggestions:
            call.suggestions.append(title)
    elif kind == EventType.CALL_ENDED:
        call.ended_at = event.get("ts")
        call.end_reason = event.get("reason")
    elif kind == EventType.CALL_ANALYTICS:
        call.analytics = analytics_summary(event)


def analytics_summary(event: dict[str, Any]) -> dict[str, Any]:
    """What the supervisors' page shows of a ``call.analytics``: times in ms, checks by verdict."""
    checks = event.get("checks") or []
    overlap = event.get("overlap") or {}
    return {
        "duration_ms": event.get("duration_ms", 0),
        "talk_ms": dict(event.get("talk_ms") or {}),
        "non_talk_ms": event.get("non_talk_ms", 0),
        "overlaps": overlap.get("count", 0),
        "overlap_ms": overlap.get("total_ms", 0),
        "passed": [c.get("id") for c in checks if c.get("passed") is True],
        "failed": [c.get("id") for c in checks if c.get("passed") is False],
        "categories": [c.get("label") for c in event.get("categories") or []],
    }


@dataclass(frozen=True)
class FeedItem:
    stream_id: str | None  # None for a partial (pub/sub only)
    data: str  # the event's JSON, serialized once for every viewer


class CallFeed:
    """One call's events: the stored history, then each new one, for any number of viewers."""

    def __init__(self, client: aioredis.Redis, prefix: str, call_id: str, layout: KeyLayout = SINGLE) -> None:
        self.client = client
        self.prefix = prefix
        self.call_id = call_id
        self.key = layout.call_stream(prefix, call_id)
        self.items: list[FeedItem] = []
        self.last_id = "0-0"
        self.ready = asyncio.Event()
        self.changed = asyncio.Event()
        self.viewers = 0
        self.idle_since = time.monotonic()
        self.delivered = 0
        self._task = asyncio.create_task(self._read(), name=f"feed-{call_id}")

    def _append(self, item: FeedItem) -> None:
        self.items.append(item)
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def add_partial(self, data: str) -> None:
        if self.ready.is_set():
            self._append(FeedItem(None, data))

    async def _read(self) -> None:
        key = self.key
        while True:
            try:
                if not self.ready.is_set():
                    stored: Any = await self.client.xrange(key, "-", "+")
                    for sid, fields in stored:
                        self._add_entry(_text(sid), fields)
                    self.ready.set()
                reply: Any = await self.client.xread({key: self.last_id}, count=500, block=BLOCK_MS)
                for _, entries in reply or []:
                    for sid, fields in entries:
                        self._add_entry(_text(sid), fields)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("call %s: reading its stream failed (%s); retrying", self.call_id, exc)
                await asyncio.sleep(RETRY_S)

    def _add_entry(self, sid: str, fields: dict[Any, Any]) -> None:
        self.last_id = sid
        event = decode_entry(fields)
        if event is not None:
            self._append(FeedItem(sid, json.dumps(event, ensure_ascii=False)))

    def start_index(self, last_event_id: str | None) -> int:
        """Where a viewer resuming after ``last_event_id`` starts (0: from the beginning)."""
        if not last_event_id:
            return 0
        try:
            after = stream_id_key(last_event_id)
        except ValueError:
            return 0
        for i, item in enumerate(self.items):
            if item.stream_id is not None and stream_id_key(item.stream_id) > after:
                return i
        return len(self.items)

    async def follow(self, last_event_id: str | None = None) -> AsyncIterator[FeedItem]:
        """The stored events after ``last_event_id`` (all when None), then live ones, forever."""
        self.viewers += 1
        try:
            await self.ready.wait()
            index = self.start_index(last_event_id)
            while True:
                changed = self.changed
                while index < len(self.items):
                    item = self.items[index]
                    index += 1
                    self.delivered += 1
                    yield item
                await changed.wait()
        finally:
            self.viewers -= 1
            self.idle_since = time.monotonic()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class Hub:
    """The process's Redis readers: the index of calls, the partials, and the watched calls' feeds."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefixes: list[str],
        index: CallIndex,
        bootstrap_events: int,
        layout: KeyLayout = SINGLE,
    ) -> None:
        self.client = client
        self.prefixes = prefixes
        self.index = index
        self.bootstrap_events = bootstrap_events
        self.layout = layout
        self.feeds: dict[str, CallFeed] = {}
        # every firehose stream (one per prefix, or each prefix's shards on a Cluster) -> its prefix
        self.firehoses = {key: p for p in prefixes for key in layout.firehoses(p)}
        self.firehose_ids = dict.fromkeys(self.firehoses, "0-0")
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = asyncio.Event()

    def start(self) -> None:
        # One XREAD names all firehoses on a single Redis; on a Cluster each shard (its own
        # slot) has its own reader.
        groups = [[key] for key in self.firehoses] if self.layout.shards else [list(self.firehoses)]
        self._tasks = [
            asyncio.create_task(self._bootstrap_then_ready(), name="bootstrap"),
            *(asyncio.create_task(self._firehose(keys), name=f"firehose-{keys[0]}") for keys in groups),
            asyncio.create_task(self._partials(), name="partials"),
            asyncio.create_task(self._reap(), name="reaper"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for feed in list(self.feeds.values()):
            await feed.close()
        self.feeds.clear()

    def feed(self, prefix: str, call_id: str) -> CallFeed:
        feed = self.feeds.get(call_id)
        if feed is None:
            feed = self.feeds[call_id] = CallFeed(self.client, prefix, call_id, self.layout)
        return feed

    async def _bootstrap(self) -> None:
        """The last ``bootstrap_events`` entries of each firehose (stream), oldest first per prefix."""
        for prefix in self.prefixes:
            recent: list[tuple[str, dict[Any, Any]]] = []
            for key in self.layout.firehoses(prefix):
                if self.bootstrap_events:
                    entries: Any = await self.client.xrevrange(key, "+", "-", count=self.bootstrap_events)
                else:
                    entries = await self.client.xrevrange(key, "+", "-", count=1)
                if entries:
                    self.firehose_ids[key] = _text(entries[0][0])
                if self.bootstrap_events:
                    recent.extend((_text(sid), fields) for sid, fields in entries)
            # shards interleave by time; stream ids are times
            recent.sort(key=lambda entry: stream_id_key(entry[0]))
            for _sid, fields in recent[-self.bootstrap_events :] if self.bootstrap_events else []:
                event = decode_entry(fields)
                if event is not None:
                    self.index.apply(prefix, event)

    async def _bootstrap_then_ready(self) -> None:
        while True:
            try:
                await self._bootstrap()
                self.ready.set()
                return
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("reading the firehose failed (%s); retrying", exc)
                await asyncio.sleep(RETRY_S)

    async def _firehose(self, keys: list[str]) -> None:
        await self.ready.wait()
        while True:
            try:
                streams = {key: self.firehose_ids[key] for key in keys}
                reply: Any = await self.client.xread(streams, count=500, block=BLOCK_MS)  # type: ignore[arg-type]
                for key, entries in reply or []:
                    name = _text(key)
                    for sid, fields in entries:
                        self.firehose_ids[name] = _text(sid)
                        event = decode_entry(fields)
                        if event is not None:
                            self.index.apply(self.firehoses[name], event)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("reading the firehose failed (%s); retrying", exc)
                await asyncio.sleep(RETRY_S)

    async def _partials(self) -> None:
        channels = {live_channel(p): p for p in self.prefixes}
        while True:
            try:
                async with self.client.pubsub() as pubsub:
                    await pubsub.subscribe(*channels)
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if message is not None:
                            self._partial(channels.get(_text(message["channel"]), self.prefixes[0]), message["data"])
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("live channel lost (%s); resubscribing", exc)
                await asyncio.sleep(RETRY_S)

    def _partial(self, prefix: str, data: Any) -> None:
        text = _text(data)
        try:
            event = json.loads(text)
        except ValueError:
            return
        if not isinstance(event, dict) or event.get("event_type") != EventType.TRANSCRIPT_PARTIAL:
            return  # durable events come from the streams, in order
        self.index.apply(prefix, event)
        feed = self.feeds.get(str(event.get("call_id")))
        if feed is not None:
            feed.add_partial(text)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            now = time.monotonic()
            for call_id, feed in list(self.feeds.items()):
                if feed.viewers == 0 and now - feed.idle_since > FEED_IDLE_S:
                    del self.feeds[call_id]
                    await feed.close()
            self.index.prune()


async def call_snapshot(
    client: aioredis.Redis, prefix: str, call_id: str, layout: KeyLayout = SINGLE
) -> list[tuple[str, dict[str, Any]]]:
    """The call's stored events with their stream ids (empty when Redis has no such call)."""
    out = []
    stored: Any = await client.xrange(layout.call_stream(prefix, call_id), "-", "+")
    for sid, fields in stored:
        event = decode_entry(fields)
        if event is not None:
            out.append((_text(sid), event))
    return out


@contextlib.asynccontextmanager
async def running_hub(hub: Hub) -> AsyncIterator[Hub]:
    hub.start()
    try:
        yield hub
    finally:
        await hub.stop()
