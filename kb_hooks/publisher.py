"""Publishes events to Redis without ever blocking the engine; nothing but partials is lost,
not even when the process is killed.

Path of an event: ``submit()`` (any thread; appends to a small locked inbox and wakes the
loop) -> ``_intake`` on the event loop -> the journal task, which appends every durable event
(all but pub/sub-only partials) to the spool's journal with one write and one fsync per batch
(group commit, in a worker thread) -> the memory mirror (bounded by ``queue_size``; beyond it
events are read back from the journal) -> the sender task, which sends one script call per
tick: first a batch that failed (retry), then journal records not in memory, then the mirror,
so per-call order holds. Acknowledged records are trimmed from the journal (``kb_hooks.spool``).

A batch goes out as one Redis script call per slot group (``kb_hooks.publish_script``: per
event a de-duplicating ``SADD``, ``XADD`` to the call stream and the firehose, ``PUBLISH``);
an event_id already published (a retry, or a replay after a crash) is a no-op, counted in
``duplicates_suppressed``. Partials go to pub/sub only (unless ``partials_to_stream``, which
journals them too) and are dropped, and counted, whenever Redis is down, journal records are
being replayed, or the memory queue is full. After a crash the next start replays the journal
and publishes ``call.ended`` (reason ``node_restart``) for every call it shows as still open.

Kept whole (about 640 lines) on purpose: the intake, journal and sender tasks share one
ordering state (the memory mirror, the journal read-back position, the batch in flight), and the
per-call order guarantee is easiest to check when that state lives in one class. What does not
touch that state lives apart: the script and its packing (``publish_script``), the
``WAIT``/sentinel I/O (``replication``), the counters (``publish_stats``) and the journal's line
format (``journal_records``).

High availability. Sentinel: the client asks the sentinels for the master on every new
connection; a dead master (connection error) or a demoted one (READONLY) fails the batch, which
is retried on the new master. With ``wait_replicas`` > 0 (default 1 with a Sentinel URL) a
batch leaves the journal only once ``WAIT`` says a replica has it; if the master dies before
that, the sender rewinds to the last confirmed journal offset and sends everything after it
again, and the event-id sets (replicated with the streams, in the same script) make what the
new master already has a no-op. Cluster: the keys carry hash tags (``kb_hooks.keys``) and a
batch becomes one script call per shard, each touching a single slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.connection import RETRYABLE, make_client, refused_without_replicas, shown
from kb_hooks.journal_records import EventRecord, event_line, event_payload, parse_line
from kb_hooks.ledger import NODE_RESTART, CallLedger
from kb_hooks.publish_script import ADDED, ALREADY_THERE, PUBLISH_LUA, ScriptCall, pack
from kb_hooks.publish_stats import PublisherStats
from kb_hooks.replication import ReplicationWatch, ScriptReply
from kb_hooks.spool import Spool
from kb_hooks.types import CallContext, Participant

log = logging.getLogger(__name__)

_ENDED_CALLS_REMEMBERED = 10_000
_PROBE_INTERVAL_S = 0.5  # idle with an unconfirmed batch: look at the replicas' offsets this often


@dataclass
class _Item:
    event: dict[str, Any]
    prefix: str
    stream_id: str
    submitted: float  # time.monotonic() at submit; for latency accounting
    audio_end: float | None = None
    best_effort: bool = False  # a partial that only goes to pub/sub: never journaled
    start: int = -1  # the journal record's byte range [start, end) and journal generation
    end: int = -1
    gen: int = -1

    @property
    def partial(self) -> bool:
        return ev.is_partial(self.event)

    @property
    def call_id(self) -> str:
        return str(self.event["call_id"])

    @property
    def event_type(self) -> str:
        return str(self.event["event_type"])

    @property
    def event_id(self) -> str:
        return str(self.event["event_id"])

    _payload: str | None = None

    def payload(self) -> str:
        """The event's JSON, serialized once for the journal and the Redis script both."""
        if self._payload is None:
            self._payload = event_payload(self.event)
        return self._payload

    def record(self) -> str:
        """The journal line (``kb_hooks.journal_records``)."""
        return event_line(self.stream_id, self.prefix, self.payload())


class Publisher(PublisherStats):
    """Feeds Redis from the engine. Counters are plain int attributes (``kb_hooks.publish_stats``)."""

    def __init__(self, settings: RedisSettings, client: aioredis.Redis | None = None) -> None:
        super().__init__()
        self.settings = settings
        self._layout = settings.layout
        self._client = client
        self._own_client = client is None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._lock = threading.Lock()
        self._inbox: deque[_Item] = deque()
        self._intake_scheduled = False
        self._calls: OrderedDict[str, tuple[int, int, str]] = OrderedDict()  # call_id -> (seq, last ms, prefix)
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._to_journal: list[_Item] = []  # taken in, not yet journaled (partials too, for order)
        self._mirror: deque[_Item] = deque()  # journaled (or best effort), not yet sent, in order
        self._retry: list[_Item] = []
        self._retry_ack: tuple[int, int] | None = None
        self._spool: Spool | None = None
        self._ledger = CallLedger()
        self._audit: TextIO | None = None
        # The journal as the event loop sees it: generation and size written, offsets sent and acknowledged.
        self._journal_gen = self._ack_gen = 0
        self._journal_size = self._ack_offset = self._send_offset = 0
        self._work = asyncio.Event()
        self._journal_wake = asyncio.Event()
        self._stopping = False
        self._sender: asyncio.Task[None] | None = None
        self._journal_task: asyncio.Task[None] | None = None
        self._replication = ReplicationWatch(settings)

    # ---- engine side (any thread) -------------------------------------------------------

    def submit(self, event: ev.Event, *, audio_end_monotonic: float | None = None) -> None:
        """Queue ``event`` for publishing; never blocks. Its JSON gets ``seq`` (per call)."""
        now = time.monotonic()
        call_id = event.call_id
        partial = isinstance(event, ev.TranscriptPartial)
        wire = event.to_json()
        with self._lock:
            if len(self._inbox) >= self.settings.queue_size * 4 or (
                partial and len(self._inbox) >= self.settings.queue_size
            ):
                self._count_inbox_drop(event)
                return
            seq, last_ms, prefix = self._calls.pop(call_id, (0, 0, self.settings.key_prefix))
            seq += 1
            ms = max(last_ms, time.time_ns() // 1_000_000)
            self._calls[call_id] = (seq, ms, prefix)
            wire["seq"] = seq
            best_effort = partial and not self.settings.partials_to_stream
            self._inbox.append(_Item(wire, prefix, f"{ms}-{seq}", now, audio_end_monotonic, best_effort))
            self.submitted += 1
            if isinstance(event, ev.CallEnded):
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

    def _count_inbox_drop(self, event: ev.Event) -> None:
        if isinstance(event, ev.TranscriptPartial):
            self._inbox_partials_dropped += 1
        else:
            self.inbox_full_dropped += 1
            log.error("publisher inbox full (event loop stalled?): dropped %s of call %s",
                      event.event_type, event.call_id)  # fmt: skip

    def call_started(
        self,
        ctx: CallContext,
        participants: Iterable[Participant],
        metadata: Mapping[str, str] | None = None,
        source: ev.CallSourceName = "sip",
    ) -> ev.CallStarted:
        """Make and submit ``call.started``; later events of the call use ``ctx.key_prefix`` if set."""
        with self._lock:
            seq, last_ms, _ = self._calls.pop(ctx.call_id, (0, 0, ""))
            self._calls[ctx.call_id] = (seq, last_ms, ctx.key_prefix or self.settings.key_prefix)
            self._ended.pop(ctx.call_id, None)
        event = ev.CallStarted(call=ctx, participants=tuple(participants), metadata=dict(metadata or {}), source=source)
        self.submit(event)
        return event

    def call_ended(self, ctx: CallContext, reason: str, stats: Mapping[str, Any] | None = None) -> ev.CallEnded:
        """Make and submit ``call.ended``; the call stream then expires after ``call_ttl_s``."""
        event = ev.CallEnded(call=ctx, reason=reason, stats=dict(stats or {}))
        self.submit(event)
        return event

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the spool, recover what a previous run left (replay, ``node_restart`` for its
        open calls) and start the journal and sender tasks."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._work = asyncio.Event()
        self._journal_wake = asyncio.Event()
        self._stopping = False
        s = self.settings
        if self._spool is not None:
            self._spool.close()
        self._spool = Spool(s.spool_dir, s.spool_max_bytes, s.spool_fsync == "batch")
        self.spool_torn_records += self._spool.torn_records
        if self._spool.torn_records:
            log.warning("spool %s ended in a torn record (a crash mid-write); cut it off", self._spool.path)
        self._recover()
        if s.journal_audit_file is not None:
            s.journal_audit_file.parent.mkdir(parents=True, exist_ok=True)
            self._audit = s.journal_audit_file.open("a", encoding="utf-8")
        if self._client is None:
            self._client = make_client(s.url, s.connect_timeout_s, s.op_timeout_s)
        self._script = self._client.register_script(PUBLISH_LUA)
        self._journal_task = asyncio.create_task(self._journal_loop(), name="kb_hooks.journal")
        self._sender = asyncio.create_task(self._send_loop(), name="kb_hooks.publisher")
        with self._lock:
            self._intake_scheduled = True
        self._intake()
        self._end_calls_of_previous_run()

    def _recover(self) -> None:
        """Rebuild the open-call ledger from the journal; position the sender at its offset."""
        assert self._spool is not None
        self._ledger = CallLedger()
        for line, _ in self._spool.scan():
            try:
                record = parse_line(line)
                if isinstance(record, EventRecord):
                    self._ledger.note(record.event, record.prefix, record.stream_id)
                else:
                    self._ledger.load_checkpoint(record)
            except (ValueError, KeyError, TypeError, AttributeError):
                self.spool_corrupt_skipped += 1
                log.error("skipping a corrupt spool record: %.200s", line)
        self._journal_gen = self._ack_gen = self._spool.generation
        self._journal_size = self._spool.size
        self._ack_offset = self._send_offset = self._spool.offset
        if self._spool.has_pending():
            log.warning("spool holds %d bytes of events from a previous run; replaying", self._spool.pending_bytes)

    def _end_calls_of_previous_run(self) -> None:
        """Calls open when the previous run died will get no more events: end them."""
        for call_id, entry in list(self._ledger.open.items()):
            with self._lock:
                if call_id in self._calls:
                    continue
                self._calls[call_id] = (entry.seq, entry.ms, entry.prefix)
            self.calls_ended_on_restart += 1
            self.call_ended(CallLedger.context(call_id, entry), NODE_RESTART, {})
        if self.calls_ended_on_restart:
            log.warning("%d calls were active when the previous run stopped: published call.ended %s",
                        self.calls_ended_on_restart, NODE_RESTART)  # fmt: skip

    async def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Journal what is queued, send what Redis takes within ``flush_timeout_s``, close."""
        self._stopping = True
        self._intake()
        self._journal_wake.set()
        if self._journal_task is not None:
            await self._journal_task  # short: appends what is queued, then returns
            self._journal_task = None
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
        await asyncio.to_thread(self._journal_write, self._take_journal_queue())
        self._journal_written()
        await asyncio.to_thread(self._close_journal)
        self._journal_written()
        dropped = sum(i.best_effort for i in self._retry) + sum(i.best_effort for i in self._mirror)
        self._loop_partials_dropped += dropped
        self._retry, self._mirror = [], deque()
        self._loop = None
        if self._client is not None and self._own_client:
            await self._client.aclose()
            self._client = None
        self.connected = False

    def _close_journal(self) -> None:
        """Save the acknowledged offset; drop the journal once everything in it is in Redis."""
        assert self._spool is not None
        self._spool.acknowledge(self._ack_gen, self._ack_offset)
        if not self._spool.has_pending():
            if self._ledger.open:
                self._spool.compact([self._ledger.checkpoint()])
            else:
                self._spool.clear()
        if self._audit is not None:
            self._audit.close()
            self._audit = None
        self._spool.close()

    # ---- event loop side ----------------------------------------------------------------

    def _replaying(self) -> bool:
        """Journal records that are not in memory wait to be read back and sent."""
        if self._ack_gen != self._journal_gen or self._send_offset >= self._journal_size:
            return False
        first = self._first_durable()
        return first is None or first.start != self._send_offset

    def _first_durable(self) -> _Item | None:
        return next((i for i in self._mirror if not i.best_effort), None)

    def _degraded(self) -> bool:
        return not self.connected or bool(self._retry) or self._replaying()

    def _intake(self) -> None:
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._intake_scheduled = False
        if not items:
            return
        degraded = self._degraded()
        for item in items:
            if item.best_effort and (degraded or len(self._mirror) + len(self._to_journal) >= self.settings.queue_size):
                self._loop_partials_dropped += 1
                continue
            self._to_journal.append(item)
        self._journal_wake.set()

    def _take_journal_queue(self) -> list[_Item]:
        items, self._to_journal = self._to_journal, []
        return items

    async def _journal_loop(self) -> None:
        """Group commit: everything queued since the last write goes into one append + fsync."""
        while True:
            if not self._to_journal:
                if self._stopping:
                    return
                self._journal_wake.clear()
                await self._journal_wake.wait()
                if not self._to_journal and self._ack_offset != self._spool_saved_offset():
                    await asyncio.to_thread(self._journal_write, [])
                continue
            items = self._take_journal_queue()
            await asyncio.to_thread(self._journal_write, items)
            self._journal_written()
            room = self.settings.queue_size - len(self._mirror)
            for item in items:
                if item.best_effort:
                    if room > 0:
                        self._mirror.append(item)
                        room -= 1
                    else:
                        self._loop_partials_dropped += 1
                elif item.end >= 0 and room > 0:
                    self._mirror.append(item)
                    room -= 1
            self._work.set()

    def _spool_saved_offset(self) -> int:
        return self._spool.offset if self._spool is not None else 0

    def _journal_written(self) -> None:
        """Event loop, after a journal write: take over the journal's size and generation."""
        assert self._spool is not None
        if self._spool.generation != self._journal_gen:  # compacted: offsets in memory are stale
            self._loop_partials_dropped += sum(i.best_effort for i in self._mirror)
            self._mirror.clear()
            self._ack_gen, self._ack_offset = self._spool.generation, self._spool.offset
            self._send_offset = self._ack_offset
        self._journal_gen, self._journal_size = self._spool.generation, self._spool.size

    def _journal_write(self, items: list[_Item]) -> None:
        """Worker thread: apply acknowledgements, compact if due, append ``items``' durable
        records with one fsync, and follow them in the ledger and the audit file."""
        spool = self._spool
        assert spool is not None
        spool.acknowledge(self._ack_gen, self._ack_offset)
        durable = [i for i in items if not i.best_effort]
        records = [i.record() for i in durable]
        incoming = sum(len(r.encode()) + 1 for r in records)
        if records and spool.should_compact(incoming):
            self.spool_full_dropped += spool.compact([self._ledger.checkpoint()])
        start = spool.size
        ends = spool.append(records) if records else []
        for item, end in zip(durable, ends, strict=False):
            item.start, item.end, item.gen = start, end, spool.generation
            start = end
            self._ledger.note(item.event, item.prefix, item.stream_id)
        self.spooled += len(ends)
        if len(ends) < len(durable):
            self.spool_full_dropped += len(durable) - len(ends)
            log.error("spool %s is full (%d bytes): dropped %d events", spool.path,
                      self.settings.spool_max_bytes, len(durable) - len(ends))  # fmt: skip
        if self._audit is not None and ends:
            self._audit.write("".join(f"{i.event['event_id']} {i.event['call_id']} {i.event['event_type']} "
                                      f"{i.event['seq']}\n" for i in durable[: len(ends)]))  # fmt: skip
            self._audit.flush()

    def _has_work(self) -> bool:
        unsent = self._ack_gen == self._journal_gen and self._send_offset < self._journal_size
        return bool(self._retry or self._mirror or unsent)

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
                if self._replication.confirmations.pending is None:
                    await self._work.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._work.wait(), _PROBE_INTERVAL_S)
                    if not self._work.is_set() and not self._stopping:
                        await self._probe_replicas()
                continue
            batch, source, ack = await self._next_batch()
            try:
                confirmed = await self._send(batch, ack)
            except Exception as exc:
                if not isinstance(exc, RETRYABLE) and not refused_without_replicas(exc):
                    # a server-side script error or a bug: retrying would fail the same way
                    self.rejected += len(batch)
                    log.exception("redis rejected a batch of %d events; dropping it", len(batch))
                    confirmed = True
                else:
                    self._lost_connection(exc)
                    self._loop_partials_dropped += sum(i.best_effort for i in batch) if source != "spool" else 0
                    durable = [i for i in batch if not i.best_effort]
                    if source == "spool" or self._unconfirmed_before(durable):
                        self._rewind(durable if source != "spool" else [])
                    else:
                        self._retry = durable
                        self._retry_ack = ack
                    continue
            if source == "spool":
                self.replayed += len(batch)
            elif source == "retry":
                self._retry = []
            if confirmed or self._must_trim_unconfirmed():
                self._acknowledge(ack)

    def _unconfirmed_before(self, durable: list[_Item]) -> bool:
        """Whether journal records before ``durable`` were sent but not confirmed by a replica."""
        if self._ack_gen != self._journal_gen:
            return False
        first = durable[0].start if durable and durable[0].gen == self._journal_gen else self._send_offset
        return self._ack_offset < first

    def _rewind(self, durable: list[_Item]) -> None:
        """After a lost connection: send again from the last confirmed journal offset (the old
        master may have died before a replica had those records); ``durable`` (the failed batch)
        goes back to the front of the memory mirror, and what lies before it is read back."""
        self._retry, self._retry_ack = [], None
        self._replication.confirmations.reset()
        self._mirror.extendleft(reversed([i for i in durable if i.gen == self._journal_gen]))
        self._send_offset = self._ack_offset

    def _must_trim_unconfirmed(self) -> bool:
        """No replica confirms (none connected, or lagging): trim the journal anyway once half
        of it is waiting, rather than fill it and refuse new events."""
        if self.spool_pending_bytes() < self.settings.spool_max_bytes // 2:
            return False
        log.warning("no replica confirmed the last %d journal bytes; trimming the journal without it",
                    self.spool_pending_bytes())  # fmt: skip
        return True

    def _acknowledge(self, ack: tuple[int, int] | None) -> None:
        """Redis has the journal records up to ``ack`` = (generation, offset)."""
        if ack is not None and ack[0] == self._ack_gen and ack[1] > self._ack_offset:
            self._ack_offset = ack[1]
            self._send_offset = max(self._send_offset, ack[1])
            self._journal_wake.set()  # the journal task saves the offset when it is idle

    async def _wait_stopping(self) -> None:
        while not self._stopping:
            self._work.clear()
            await self._work.wait()

    async def _connect(self) -> bool:
        assert self._client is not None
        try:
            await asyncio.wait_for(self._client.ping(), self.settings.connect_timeout_s + self.settings.op_timeout_s)
            for group in self.settings.firehose_groups:
                for key in self._layout.firehoses(self.settings.key_prefix):
                    with contextlib.suppress(ResponseError):  # BUSYGROUP: exists already
                        await self._client.xgroup_create(key, group, "0", mkstream=True)
        except RETRYABLE as exc:
            self.redis_errors += 1
            log.warning("redis %s unreachable: %s", shown(self.settings.url), exc)
            return False
        if self.reconnects or self._has_work():
            log.info("redis connection up")
        self.reconnects += 1
        self.connected = True
        self._replication.confirmations.reset()
        return True

    def _lost_connection(self, exc: BaseException) -> None:
        self.redis_errors += 1
        self.connected = False
        log.warning("redis publish failed (%s: %s); queueing and retrying", type(exc).__name__, exc)
        kept = deque(i for i in self._mirror if not i.best_effort)
        self._loop_partials_dropped += len(self._mirror) - len(kept)
        self._mirror = kept

    async def _next_batch(self) -> tuple[list[_Item], str, tuple[int, int] | None]:
        """The retry batch, else journal records that are not in memory, else the memory mirror;
        with the (generation, offset) that an acknowledgement of the batch reaches."""
        limit = self.settings.max_batch
        if self._retry:
            return self._retry, "retry", self._retry_ack
        if self._replaying():
            assert self._spool is not None
            first, generation = self._first_durable(), self._journal_gen
            stop = first.start if first is not None else self._journal_size
            lines, end = await asyncio.to_thread(self._spool.read, generation, self._send_offset, stop, limit)
            if generation != self._journal_gen or end <= self._send_offset:  # compacted meanwhile
                return [], "spool", None
            self._send_offset = end
            items = [item for line in lines if (item := self._parse_record(line)) is not None]
            return items, "spool", (generation, end)
        batch: list[_Item] = []
        expected, last = self._send_offset, None
        while self._mirror and len(batch) < limit:
            item = self._mirror[0]
            if not item.best_effort:
                if item.start != expected:  # a gap: records between are read from the journal
                    break
                expected, last = item.end, item
            batch.append(self._mirror.popleft())
        if last is None:
            return batch, "mirror", None
        self._send_offset = last.end
        return batch, "mirror", (last.gen, last.end)

    def _parse_record(self, line: str) -> _Item | None:
        try:
            record = parse_line(line)
            if not isinstance(record, EventRecord):
                return None
            return _Item(record.event, record.prefix, record.stream_id, time.monotonic(), best_effort=False)
        except ValueError:
            self.spool_corrupt_skipped += 1
            log.error("skipping a corrupt spool record: %.200s", line)
            return None

    async def _send(self, batch: list[_Item], ack: tuple[int, int] | None = None) -> bool:
        """One script call per slot group, with ``WAIT`` when replicas must confirm; whether they
        did (or none had to). The Script object reloads the script after a Redis restart."""
        assert self._client is not None
        replies: dict[int, Any] = {}
        confirmed = True
        for call in pack(batch, self.settings, self._layout):
            reply = await asyncio.wait_for(self._call_script(call, ack), self.settings.op_timeout_s * 2)
            confirmed = confirmed and reply.confirmed
            replies.update(zip(call.members, reply.results, strict=True))
        self._account(batch, replies)
        return confirmed

    async def _call_script(self, call: ScriptCall, ack: tuple[int, int] | None) -> ScriptReply:
        """The call, and the sentinels asked about the master when replicas did not confirm it."""
        assert self._client is not None
        reply = await self._replication.call(self._client, self._script, call.keys, call.args, ack)
        self.replica_ack_timeouts += reply.wait_timed_out
        if not reply.confirmed:
            await self._replication.check_sentinels(self._client)
        return reply

    async def _probe_replicas(self) -> None:
        """Idle with a batch no replica has confirmed yet: acknowledge the journal once it is."""
        assert self._client is not None
        try:
            self._acknowledge(await self._replication.probe(self._client))
        except RETRYABLE as exc:
            self._lost_connection(exc)
            self._rewind([])

    def _account(self, batch: list[_Item], replies: dict[int, Any]) -> None:
        """Count the script's reply for each event (by batch position; one sent nowhere counts as added)."""
        now = time.monotonic()
        for index, item in enumerate(batch):
            outcome = replies.get(index, ADDED)
            if isinstance(outcome, bytes):
                self.rejected += 1
                log.error("redis rejected %s of call %s: %s", item.event_type, item.call_id,
                          outcome.decode(errors="replace"))  # fmt: skip
                continue
            if outcome == ALREADY_THERE:
                self.duplicates_suppressed += 1
            self.published += 1
            self.record_ack(item.submitted, item.audio_end, now)

    # ---- observability ------------------------------------------------------------------

    def queued(self) -> int:
        """Events waiting in memory (inbox, backlog, retry)."""
        return len(self._inbox) + len(self._to_journal) + len(self._mirror) + len(self._retry)

    def spool_pending_bytes(self) -> int:
        """Journal bytes not yet acknowledged by Redis."""
        return self._journal_size - self._ack_offset if self._ack_gen == self._journal_gen else self._journal_size

    def metrics(self) -> dict[str, Any]:
        """Counters and latency percentiles (ms) for the service's /metrics and logs."""
        return {
            **self.counters(),
            "queued": self.queued(),
            "spool_pending_bytes": self.spool_pending_bytes(),
            **self.latency_percentiles_ms(),
        }
