"""``asr-gateway tail``: print live events from Redis, readably.

Finals, KB suggestions, tags and call events come from the firehose (or one call's stream)
with ``XREAD BLOCK``, so a restarted tail can resume with ``--from-id``; partials come from
pub/sub. In a terminal a partial is rewritten in place (``\\r``) until its final replaces it.
With a ``redis+cluster://`` URL the firehose is ``--shards`` streams (``kb_hooks.keys``), each
read on its own; ``--from-id`` then applies to every shard (stream ids are times).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections import deque
from collections.abc import Mapping
from typing import Any, TextIO

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kb_hooks.config import RedisSettings
from kb_hooks.connection import make_client, shown, url_kind
from kb_hooks.events import EventType
from kb_hooks.keys import KeyLayout, live_channel

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_BLOCK_MS = 500
_SEEN_IDS = 10_000
_COLOURS = {"final": "\033[1m", "kb": "\033[32m", "withdrawn": "\033[33m", "tags": "\033[36m", "call": "\033[35m"}
_RESET = "\033[0m"
_CLEAR_LINE = "\r\033[K"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-gateway tail", description="Print live transcript events from Redis.")
    parser.add_argument("--redis", default=os.environ.get("ASR_REDIS_URL", DEFAULT_URL),
                        help="Redis URL (default: $ASR_REDIS_URL or %(default)s)")  # fmt: skip
    parser.add_argument("--prefix", default="asr", help="key prefix of the service (default: %(default)s)")
    parser.add_argument("--call", metavar="ID", help="only this call (reads its stream)")
    shards = RedisSettings.model_fields["firehose_shards"].default
    parser.add_argument("--shards", type=int, metavar="N", default=shards,
                        help="firehose shards with a redis+cluster:// URL (default %(default)s)")  # fmt: skip
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-start", action="store_true", help="print what the stream already holds first")
    start.add_argument("--from-id", metavar="STREAM_ID", help="resume after this stream entry id")
    parser.add_argument("--no-partials", action="store_true", help="do not subscribe to partials")
    parser.add_argument("--json", action="store_true", help="print each event as one JSON line")
    parser.add_argument("--max-events", type=int, metavar="N", help="exit after N events")
    parser.add_argument("--timeout", type=float, metavar="S", help="exit after S seconds")
    return parser


class Printer:
    """Formats events; keeps track of a partial shown in place on a terminal."""

    def __init__(self, out: TextIO, as_json: bool, tty: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.tty = tty
        self._partial_shown = False

    def _paint(self, kind: str, text: str) -> str:
        return f"{_COLOURS[kind]}{text}{_RESET}" if self.tty else text

    def show(self, event: dict[str, Any], stream_id: str | None = None) -> None:
        if self.as_json:
            self.out.write(json.dumps(event, ensure_ascii=False) + "\n")
            self.out.flush()
            return
        line = self.format(event)
        if event.get("event_type") == EventType.TRANSCRIPT_PARTIAL and self.tty:
            self.out.write(_CLEAR_LINE + line)
            self._partial_shown = True
        else:
            if self._partial_shown:
                self.out.write(_CLEAR_LINE)
                self._partial_shown = False
            self.out.write(line + (f"  [{stream_id}]" if stream_id and self.tty else "") + "\n")
        self.out.flush()

    def format(self, event: dict[str, Any]) -> str:
        kind = event.get("event_type", "?")
        ts = str(event.get("ts", ""))[11:23]
        who = (event.get("participant") or {}).get("role", "")
        head = f"{ts} {event.get('call_id', '?')} {who:<6}"
        if kind in (EventType.TRANSCRIPT_PARTIAL, EventType.TRANSCRIPT_FINAL):
            if kind == EventType.TRANSCRIPT_PARTIAL:
                return f"{head} … {event.get('text', '')}"
            conf = event.get("confidence")
            tail = f"  (conf {conf:.2f})" if isinstance(conf, (int, float)) else ""
            return f"{head} {self._paint('final', '▶ ' + str(event.get('text', '')))}{tail}"
        if kind == EventType.KB_SUGGESTION:
            status = event.get("status", "")
            mark = {"suggested": "?", "confirmed": "✓", "withdrawn": "✗"}.get(status, "")
            via = "homophone " if event.get("homophone") else ""
            body = (f"KB {mark} {status} {event.get('title')} [{event.get('entry_id')}] "
                    f"score {event.get('score')} {via}«{event.get('matched_text')}»")  # fmt: skip
            return f"{head} {self._paint('withdrawn' if status == 'withdrawn' else 'kb', body)}"
        if kind == EventType.TAGS:
            items = " · ".join(f"{t.get('kind')} {t.get('label')}={t.get('value')}" for t in event.get("tags", []))
            return f"{head} {self._paint('tags', 'TAGS ' + items)}"
        if kind == EventType.CALL_STARTED:
            roles = ",".join(p.get("role", "?") for p in event.get("participants", []))
            source_call_id = event.get("source_call_id", event.get("sip_call_id"))  # events written before it
            body = (f"CALL STARTED source={event.get('source', 'sip')} route={event.get('route')} "
                    f"source_call_id={source_call_id} participants={roles}")  # fmt: skip
            return f"{head} {self._paint('call', body)}"
        if kind == EventType.WORKORDER_UPDATED:
            body = f"WORK ORDER r{event.get('revision')} {workorder_line(event)}"
            return f"{head} {self._paint('tags', body)}"
        if kind == EventType.CALL_ANALYTICS:
            return f"{head} {self._paint('call', 'ANALYTICS ' + analytics_line(event))}"
        if kind == EventType.CALL_ENDED:
            body = f"CALL ENDED reason={event.get('reason')} {json.dumps(event.get('stats'), ensure_ascii=False)}"
            return f"{head} {self._paint('call', body)}"
        return f"{head} {kind} {json.dumps(event, ensure_ascii=False)}"


def workorder_line(event: Mapping[str, Any]) -> str:
    """The fields of a ``workorder.updated`` (or ``.confirmed``) event: ``name=value · ...``,
    the address and the time normalized (as the console's form shows them)."""
    drafted = (event.get("fields") or {}).items()
    shown = {
        name: (f.get("normalized") if name in ("address", "time") else None) or f.get("value")
        for name, f in drafted
        if f
    }
    return " · ".join(f"{name}={value}" for name, value in shown.items())


def analytics_line(event: Mapping[str, Any]) -> str:
    """A ``call.analytics`` event in one line: talk per role, silence, overlaps, checks, categories."""
    talk = " ".join(f"{role} {ms / 1000:.1f}s" for role, ms in (event.get("talk_ms") or {}).items())
    overlap = event.get("overlap") or {}
    verdicts = {True: "ok", False: "FAIL"}
    checks = " ".join(f"{c.get('id')}:{verdicts.get(c.get('passed'), 'n/a')}" for c in event.get("checks", []))
    categories = ",".join(str(c.get("label")) for c in event.get("categories", []))
    return (f"talk {talk or '-'}, silence {int(event.get('non_talk_ms', 0)) / 1000:.1f}s, "
            f"overlaps {overlap.get('count', 0)} ({int(overlap.get('total_ms', 0)) / 1000:.1f}s); "
            f"checks {checks or '-'}; categories {categories or '-'}")  # fmt: skip


async def _start_id(client: aioredis.Redis, key: str, args: argparse.Namespace) -> str:
    if args.from_start:
        return "0-0"
    if args.from_id:
        return str(args.from_id)
    newest: Any = await client.xrevrange(key, count=1)
    return newest[0][0].decode() if newest else "0-0"


async def _read_stream(
    client: aioredis.Redis, key: str, last_id: str, queue: asyncio.Queue[Any], stop: asyncio.Event
) -> None:
    # Stopped by ``stop`` between short blocks, not by cancellation: redis-py may sit on a
    # cancelled XREAD BLOCK for seconds.
    while not stop.is_set():
        reply: Any = await client.xread({key: last_id}, block=_BLOCK_MS, count=100)
        for _, entries in reply or []:
            for entry_id, fields in entries:
                last_id = entry_id.decode()
                await queue.put((json.loads(fields[b"event"]), last_id))


async def _read_partials(client: aioredis.Redis, channel: str, queue: asyncio.Queue[Any]) -> None:
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    try:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None:
                event = json.loads(message["data"])
                if event.get("event_type") == EventType.TRANSCRIPT_PARTIAL:
                    await queue.put((event, None))
    finally:
        await pubsub.aclose()


async def _tail(args: argparse.Namespace, out: TextIO) -> int:
    try:
        layout = KeyLayout(args.shards if url_kind(args.redis) == "cluster" else 0)
        client = make_client(args.redis, 2.0, _BLOCK_MS / 1000 + 5.0)
    except ValueError as exc:
        print(f"asr-gateway tail: {exc}", file=sys.stderr)
        return 2
    keys = [layout.call_stream(args.prefix, args.call)] if args.call else layout.firehoses(args.prefix)
    printer = Printer(out, args.json, out.isatty())
    queue: asyncio.Queue[tuple[dict[str, Any], str | None]] = asyncio.Queue(maxsize=1000)
    tasks: list[asyncio.Task[None]] = []
    readers = 0
    seen: deque[str] = deque(maxlen=_SEEN_IDS)
    stop = asyncio.Event()
    printed = 0
    try:
        for key in keys:
            start = await _start_id(client, key, args)
            tasks.append(asyncio.create_task(_read_stream(client, key, start, queue, stop)))
        readers = len(tasks)
        if not args.no_partials:
            tasks.append(asyncio.create_task(_read_partials(client, live_channel(args.prefix, args.call), queue)))
        deadline = None if args.timeout is None else asyncio.get_running_loop().time() + args.timeout
        while args.max_events is None or printed < args.max_events:
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                break
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait([getter, *tasks], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                for task in done:
                    task.result()  # a reader failed: raise its error
                continue
            event, stream_id = getter.result()
            if event.get("event_id") in seen:
                continue
            seen.append(str(event.get("event_id")))
            printer.show(event, stream_id)
            printed += 1
    except (RedisError, OSError) as exc:
        print(f"asr-gateway tail: cannot read from {shown(args.redis)}: {exc}", file=sys.stderr)
        return 2
    finally:
        stop.set()
        for task in tasks[readers:]:
            task.cancel()
        if tasks[:readers]:
            await asyncio.wait(tasks[:readers], timeout=_BLOCK_MS / 1000 + 1.0)
            for task in tasks[:readers]:
                task.cancel()  # still waiting on a full queue
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                await task
        await client.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_tail(args, sys.stdout))
    except KeyboardInterrupt:
        return 130
