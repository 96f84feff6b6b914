"""Publishes events to Redis without ever blocking the engine; nothing but partials is lost.

Path of an event: ``submit()`` (any thread; appends to a small locked inbox and wakes the
loop) -> ``_intake`` on the event loop (memory backlog, bounded by ``queue_size``; beyond it
the backlog spills to the spool file) -> the sender task, which sends one pipeline per tick:
first a batch that failed (retry), then the spool, then the backlog, so per-call order holds.

Per event one Lua call (atomic on the server) does ``XADD {prefix}:call:{call_id}`` with an
explicit ID ``<ms>-<seq>``, ``XADD {prefix}:events``, ``PUBLISH`` to ``{prefix}:live:{call_id}``
and ``{prefix}:live``, and the call stream's TTL. The explicit, increasing ID makes a retried
event that Redis already has a no-op (counted in ``duplicates_suppressed``): retries after
a lost reply add no duplicates as long as the call stream survives. Partials go to pub/sub
only (unless ``partials_to_stream``) and are dropped, and counted, whenever Redis is down,
a backlog or spool is being replayed, or the backlog is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asr_common.latency import MeasurementRing
from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.connection import make_client
from kb_hooks.spool import Spool
from kb_hooks.types import CallContext, Participant

log = logging.getLogger(__name__)

RETRYABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,  # a replica after a Sentinel failover: reconnect to the new master
    NoScriptError,  # Redis restarted between SCRIPT LOAD and EVALSHA
    OSError,
    asyncio.TimeoutError,
)
COUNTERS = (
    "connected",
    "submitted",
    "published",
    "partials_dropped",
    "duplicates_suppressed",
    "rejected",
    "spooled",
    "replayed",
    "spool_full_dropped",
    "inbox_full_dropped",
    "redis_errors",
    "reconnects",
)
_ENDED_CALLS_REMEMBERED = 10_000
_LATENCY_SAMPLES = 100_000

# One call publishes a whole batch. KEYS: the call streams and firehoses of the batch.
# ARGV: call maxlen, firehose maxlen, orphan ttl, then per event 10 fields: mode ('s' stream
# and pub/sub, 'n' stream only, 'p' pub/sub only), call key index, firehose key index, id, json,
# type, ttl when ended ('0' = none), call channel, all channel, call_id.
# Result per event: 1 added, 0 already there (a retry), or the error text.
_PUBLISH_LUA = """
local call_maxlen, fire_maxlen, orphan_ttl = ARGV[1], ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV, 10 do
  local mode, ck, fk = ARGV[i], KEYS[tonumber(ARGV[i + 1])], KEYS[tonumber(ARGV[i + 2])]
  local id, payload, kind, ttl = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local result = 1
  if mode ~= 'p' then
    local added = redis.pcall('XADD', ck, 'MAXLEN', '~', call_maxlen, id, 'type', kind, 'event', payload)
    if type(added) == 'table' and added.err then
      if string.find(added.err, 'equal or smaller', 1, true) then result = 0 else result = added.err end
    else
      local fire = redis.pcall('XADD', fk, 'MAXLEN', '~', fire_maxlen, '*', 'type', kind,
                               'call_id', ARGV[i + 9], 'event', payload)
      if type(fire) == 'table' and fire.err then result = fire.err end
      if ttl ~= '0' then
        redis.call('EXPIRE', ck, ttl)
      elseif redis.call('TTL', ck) == -1 then
        redis.call('EXPIRE', ck, orphan_ttl)
      end
    end
  end
  if result == 1 and mode ~= 'n' then
    redis.call('PUBLISH', ARGV[i + 7], payload)
    redis.call('PUBLISH', ARGV[i + 8], payload)
  end
  out[#out + 1] = result
end
return out
"""


@dataclass
class _Item:
    event: dict[str, Any]
    prefix: str
    stream_id: str
    submitted: float  # time.monotonic() at submit; for latency accounting
    audio_end: float | None = None

    @property
    def partial(self) -> bool:
        return ev.is_partial(self.event)

    def record(self) -> str:
        return json.dumps({"id": self.stream_id, "prefix": self.prefix, "event": self.event}, ensure_ascii=False)


def stream_key(prefix: str, call_id: str) -> str:
    return f"{prefix}:call:{call_id}"


def firehose_key(prefix: str) -> str:
    return f"{prefix}:events"


def live_channel(prefix: str, call_id: str | None = None) -> str:
    return f"{prefix}:live" if call_id is None else f"{prefix}:live:{call_id}"


def percentile(samples: Iterable[float], q: float) -> float | None:
    ordered = sorted(samples)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Publisher:
    """Feeds Redis from the engine. Counters are plain int attributes (read them for metrics)."""

    def __init__(self, settings: RedisSettings, client: aioredis.Redis | None = None) -> None:
        self.settings = settings
        self._client = client
        self._own_client = client is None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._lock = threading.Lock()
        self._inbox: deque[_Item] = deque()
        self._intake_scheduled = False
        self._calls: OrderedDict[str, tuple[int, int, str]] = OrderedDict()  # call_id -> (seq, last ms, prefix)
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._backlog: deque[_Item] = deque()
        self._retry: list[_Item] = []
        self._spool: Spool | None = None
        self._work = asyncio.Event()
        self._stopping = False
        self._sender: asyncio.Task[None] | None = None
        self.connected = False
        self.submitted = 0
        self.published = 0
        self._inbox_partials_dropped = 0  # counted by submitters, under the lock
        self._loop_partials_dropped = 0  # counted on the event loop
        self.duplicates_suppressed = 0
        self.rejected = 0
        self.spooled = 0
        self.replayed = 0
        self.spool_full_dropped = 0
        self.inbox_full_dropped = 0
        self.redis_errors = 0
        self.reconnects = 0
        self.ack_latency_s = MeasurementRing(_LATENCY_SAMPLES)
        self.audio_to_ack_s = MeasurementRing(_LATENCY_SAMPLES)

    @property
    def partials_dropped(self) -> int:
        return self._inbox_partials_dropped + self._loop_partials_dropped

    # ---- engine side (any thread) -------------------------------------------------------

    def submit(self, event: dict[str, Any], *, audio_end_monotonic: float | None = None) -> None:
        """Queue ``event`` for publishing; never blocks. Stamps ``seq`` (per call) into the dict."""
        now = time.monotonic()
        call_id = str(event["call_id"])
        with self._lock:
            if len(self._inbox) >= self.settings.queue_size * 4 or (
                ev.is_partial(event) and len(self._inbox) >= self.settings.queue_size
            ):
                self._count_inbox_drop(event)
                return
            seq, last_ms, prefix = self._calls.pop(call_id, (0, 0, self.settings.key_prefix))
            seq += 1
            ms = max(last_ms, time.time_ns() // 1_000_000)
            self._calls[call_id] = (seq, ms, prefix)
            event["seq"] = seq
            self._inbox.append(_Item(event, prefix, f"{ms}-{seq}", now, audio_end_monotonic))
            self.submitted += 1
            if event["event_type"] == "call.ended":
                self._ended[call_id] = None
                while len(self._ended) > _ENDED_CALLS_REMEMBERED:
                    self._calls.pop(self._ended.popitem(last=False)[0], None)
            wake = not self._intake_scheduled and self._loop is not None
            self._intake_scheduled = self._intake_scheduled or wake
        if wake:
            assert self._loop is not None
            if threading.get_ident() == self._loop_thread:
                self._intake()  # called from the loop itself: nothing to wake, and it may not yield soon
                return
            try:
                self._loop.call_soon_threadsafe(self._intake)
            except RuntimeError:  # loop closed: the items stay in the inbox for the next start()
                with self._lock:
                    self._intake_scheduled = False

    def _count_inbox_drop(self, event: dict[str, Any]) -> None:
        if ev.is_partial(event):
            self._inbox_partials_dropped += 1
        else:
            self.inbox_full_dropped += 1
            log.error("publisher inbox full (event loop stalled?): dropped %s of call %s",
                      event["event_type"], event["call_id"])  # fmt: skip

    def call_started(
        self, ctx: CallContext, participants: Iterable[Participant], metadata: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Build and submit ``call.started``; later events of the call use ``ctx.key_prefix`` if set."""
        with self._lock:
            seq, last_ms, _ = self._calls.pop(ctx.call_id, (0, 0, ""))
            self._calls[ctx.call_id] = (seq, last_ms, ctx.key_prefix or self.settings.key_prefix)
            self._ended.pop(ctx.call_id, None)
        event = ev.call_started(ctx, participants, metadata)
        self.submit(event)
        return event

    def call_ended(self, ctx: CallContext, reason: str, stats: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Build and submit ``call.ended``; the call stream then expires after ``call_ttl_s``."""
        event = ev.call_ended(ctx, reason, stats)
        self.submit(event)
        return event

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the spool (replaying what a previous run left) and start the sender task."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._work = asyncio.Event()
        self._stopping = False
        s = self.settings
        self._spool = Spool(s.spool_dir, s.spool_max_bytes, s.spool_fsync == "batch")
        if self._spool.has_pending():
            log.warning("spool holds %d bytes of events from a previous run; replaying", self._spool.pending_bytes)
        if self._client is None:
            self._client = make_client(s.url, s.connect_timeout_s, s.op_timeout_s)
        self._script = self._client.register_script(_PUBLISH_LUA)
        self._sender = asyncio.create_task(self._send_loop(), name="kb_hooks.publisher")
        with self._lock:
            self._intake_scheduled = True
        self._intake()

    async def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Send what is queued within ``flush_timeout_s``, spool the rest, close the connection."""
        self._stopping = True
        self._intake()
        self._work.set()
        if self._sender is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._sender), flush_timeout_s)
            except TimeoutError:
                self._sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sender
            self._sender = None
        self._intake()
        self._persist_unsent()
        self._loop = None
        if self._client is not None and self._own_client:
            await self._client.aclose()
            self._client = None
        self.connected = False

    def _persist_unsent(self) -> None:
        assert self._spool is not None
        retry = [i.record() for i in self._retry if not i.partial]
        rest = [i.record() for i in self._backlog if not i.partial]
        self._loop_partials_dropped += sum(i.partial for i in self._retry) + sum(i.partial for i in self._backlog)
        if retry:
            self.spool_full_dropped += self._spool.rewrite(retry, rest)
        elif rest:
            self.spool_full_dropped += len(rest) - self._spool.append(rest)
        self.spooled += len(retry) + len(rest)
        self._retry, self._backlog = [], deque()

    # ---- event loop side ----------------------------------------------------------------

    def _degraded(self) -> bool:
        return not self.connected or bool(self._retry) or (self._spool is not None and self._spool.has_pending())

    def _intake(self) -> None:
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._intake_scheduled = False
        if not items:
            return
        degraded = self._degraded()
        for item in items:
            if item.partial:
                if degraded or len(self._backlog) >= self.settings.queue_size:
                    self._loop_partials_dropped += 1
                    continue
            elif len(self._backlog) >= self.settings.queue_size:
                self._spill()
            self._backlog.append(item)
        self._work.set()

    def _spill(self) -> None:
        """Move the whole backlog to the spool (it is newer than anything already spooled)."""
        assert self._spool is not None
        records = [i.record() for i in self._backlog if not i.partial]
        self._loop_partials_dropped += sum(i.partial for i in self._backlog)
        self._backlog.clear()
        written = self._spool.append(records)
        self.spooled += written
        if written < len(records):
            self.spool_full_dropped += len(records) - written
            log.error("spool %s is full (%d bytes): dropped %d events", self._spool.path,
                      self.settings.spool_max_bytes, len(records) - written)  # fmt: skip

    def _has_work(self) -> bool:
        return bool(self._retry or self._backlog or (self._spool is not None and self._spool.has_pending()))

    async def _send_loop(self) -> None:
        backoff = self.settings.retry_initial_s
        while True:
            if self._stopping and not self._has_work():
                return
            if not self.connected:
                if await self._connect():
                    backoff = self.settings.retry_initial_s
                else:
                    if self._stopping:
                        return
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wait_stopping(), backoff)
                    backoff = min(backoff * 2, self.settings.retry_max_s)
                continue
            if not self._has_work():
                self._work.clear()
                await self._work.wait()
                continue
            batch, source, offset = self._next_batch()
            try:
                await self._send(batch)
            except RETRYABLE as exc:
                self._lost_connection(exc)
                if source != "spool":
                    self._retry = [i for i in batch if not i.partial]
                    self._loop_partials_dropped += sum(i.partial for i in batch)
                continue
            except Exception:  # a server-side script error or a bug: retrying would fail the same way
                self.rejected += len(batch)
                log.exception("redis rejected a batch of %d events; dropping it", len(batch))
            if source == "spool":
                assert self._spool is not None
                self._spool.commit(offset)
                self.replayed += len(batch)
            elif source == "retry":
                self._retry = []

    async def _wait_stopping(self) -> None:
        while not self._stopping:
            self._work.clear()
            await self._work.wait()

    async def _connect(self) -> bool:
        assert self._client is not None
        try:
            await asyncio.wait_for(self._client.ping(), self.settings.connect_timeout_s + self.settings.op_timeout_s)
            for group in self.settings.firehose_groups:
                with contextlib.suppress(ResponseError):  # BUSYGROUP: exists already
                    await self._client.xgroup_create(firehose_key(self.settings.key_prefix), group, "0", mkstream=True)
        except RETRYABLE as exc:
            self.redis_errors += 1
            log.warning("redis %s unreachable: %s", self.settings.url.split("@")[-1], exc)
            return False
        if self.reconnects or self._has_work():
            log.info("redis connection up")
        self.reconnects += 1
        self.connected = True
        return True

    def _lost_connection(self, exc: BaseException) -> None:
        self.redis_errors += 1
        self.connected = False
        log.warning("redis publish failed (%s: %s); queueing and retrying", type(exc).__name__, exc)
        kept = deque(i for i in self._backlog if not i.partial)
        self._loop_partials_dropped += len(self._backlog) - len(kept)
        self._backlog = kept

    def _next_batch(self) -> tuple[list[_Item], str, int]:
        limit = self.settings.max_batch
        if self._retry:
            return self._retry, "retry", 0
        if self._spool is not None and self._spool.has_pending():
            lines, offset = self._spool.read(limit)
            return [item for line in lines if (item := self._parse_record(line)) is not None], "spool", offset
        batch = [self._backlog.popleft() for _ in range(min(limit, len(self._backlog)))]
        return batch, "backlog", 0

    def _parse_record(self, line: str) -> _Item | None:
        try:
            record = json.loads(line)
            return _Item(record["event"], record["prefix"], record["id"], time.monotonic())
        except (ValueError, KeyError, TypeError):
            self.rejected += 1
            log.error("skipping a corrupt spool record: %.200s", line)
            return None

    async def _send(self, batch: list[_Item]) -> None:
        """One EVALSHA for the whole batch (the Script object reloads it after a Redis restart)."""
        assert self._client is not None
        s = self.settings
        keys: dict[str, int] = {}
        args: list[str | int] = [s.stream_maxlen, s.firehose_maxlen, s.orphan_ttl_s]
        for item in batch:
            call_id = str(item.event["call_id"])
            kind = str(item.event["event_type"])
            if item.partial and not s.partials_to_stream:
                mode = "p" if s.partials_to_pubsub else "-"
            else:
                mode = "s" if s.partials_to_pubsub or not item.partial else "n"
            if mode == "-":
                continue
            call_key = keys.setdefault(stream_key(item.prefix, call_id), len(keys) + 1)
            fire_key = keys.setdefault(firehose_key(item.prefix), len(keys) + 1)
            args += [mode, call_key, fire_key, item.stream_id, json.dumps(item.event, ensure_ascii=False), kind,
                     s.call_ttl_s if kind == "call.ended" else 0,
                     live_channel(item.prefix, call_id), live_channel(item.prefix), call_id]  # fmt: skip
        results: list[Any] = []
        if keys:
            results = await asyncio.wait_for(self._script(keys=list(keys), args=args), s.op_timeout_s * 2)
        self._account(batch, results)

    def _account(self, batch: list[_Item], results: list[Any]) -> None:
        now = time.monotonic()
        outcomes = iter(results)
        skipped = not self.settings.partials_to_stream and not self.settings.partials_to_pubsub
        for item in batch:
            outcome = 1 if item.partial and skipped else next(outcomes)
            if isinstance(outcome, bytes):
                self.rejected += 1
                log.error("redis rejected %s of call %s: %s", item.event["event_type"], item.event["call_id"],
                          outcome.decode(errors="replace"))  # fmt: skip
                continue
            if outcome == 0:
                self.duplicates_suppressed += 1
            self.published += 1
            self.ack_latency_s.append(now - item.submitted)
            if item.audio_end is not None:
                self.audio_to_ack_s.append(now - item.audio_end)

    # ---- observability ------------------------------------------------------------------

    def queued(self) -> int:
        """Events waiting in memory (inbox, backlog, retry)."""
        return len(self._inbox) + len(self._backlog) + len(self._retry)

    def spool_pending_bytes(self) -> int:
        return self._spool.pending_bytes if self._spool is not None else 0

    def metrics(self) -> dict[str, Any]:
        """Counters and latency percentiles (ms) for the service's /metrics and logs."""
        out: dict[str, Any] = {name: getattr(self, name) for name in COUNTERS}
        out["queued"] = self.queued()
        out["spool_pending_bytes"] = self.spool_pending_bytes()
        for name, samples in (("ack", self.ack_latency_s), ("audio_to_ack", self.audio_to_ack_s)):
            for q in (0.5, 0.95, 0.99):
                value = percentile(samples, q)
                out[f"{name}_p{round(q * 100)}_ms"] = None if value is None else round(value * 1000, 3)
        return out
