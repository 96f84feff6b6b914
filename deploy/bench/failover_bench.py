"""The publisher through a Redis Sentinel failover; prints one JSON object.

    python -m deploy.bench.failover_bench [--calls 20] [--seconds 20] [--mode kill|failover]

Starts a Sentinel group on loopback (``asr_gateway.dev.local_redis.LocalSentinelGroup``: master,
replica, three sentinels, down-after 1 s), has ``--calls`` calls speak (a partial and a final
every ``--interval-ms`` each) through the real publisher for ``--seconds``, and halfway through
SIGKILLs the master (``kill``) or asks the sentinels for ``SENTINEL FAILOVER``. Then it ends the
calls, waits until the journal is empty and reads the new master back: every durable event
(``call.started``, finals, ``call.ended``) by event_id, in the call streams and the firehose.

Reported: events published (durable), found, missing and duplicated; ``failover_s`` (the
master's death or the FAILOVER request until all sentinels name the new master),
``outage_s`` (the same start until the publisher's first acknowledged batch on the new
master), the publisher's counters (spooled, replayed, redis errors, WAITs that timed out) and
its acknowledgement latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from asr_gateway.dev.local_redis import LocalRedisError, LocalSentinelGroup
from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.keys import SINGLE
from kb_hooks.publisher import Publisher
from kb_hooks.types import CallContext, Participant

CALLER = Participant("caller", "sip:caller@pbx.local", "caller")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-bench failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20, help="concurrent calls (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the calls speak (default %(default)s)")
    parser.add_argument("--interval-ms", type=int, default=250, help="a partial and a final per call this often")
    parser.add_argument("--mode", choices=("kill", "failover"), default="kill",
                        help="SIGKILL the master, or SENTINEL FAILOVER (default %(default)s)")  # fmt: skip
    parser.add_argument("--grace-s", type=float, default=RedisSettings.model_fields["replica_ack_grace_s"].default,
                        help="redis.replica_ack_grace_s (default %(default)s)")  # fmt: skip
    return parser


def _transcript(ctx: CallContext, utterance: int, partial: bool) -> ev.TranscriptPartial | ev.TranscriptFinal:
    text = f"第{utterance}句"
    if partial:
        return ev.TranscriptPartial(call=ctx, participant=CALLER, utterance_id=utterance, text=text, begin_offset_ms=0,
                                    end_offset_ms=800, tokens=(), confidence=None, latency_ms=10.0)  # fmt: skip
    return ev.TranscriptFinal(call=ctx, participant=CALLER, utterance_id=utterance, text=text, begin_offset_ms=0,
                              end_offset_ms=800, tokens=(), confidence=None, latency_ms=10.0,
                              nbest=(ev.Alternative(text, -1.0),))  # fmt: skip


def _timer(into: dict[str, float], name: str, start: float) -> Any:
    """A done-callback that records the seconds since ``start`` under ``name``."""
    return lambda _: into.setdefault(name, time.monotonic() - start)


async def _scenario(group: LocalSentinelGroup, args: argparse.Namespace, spool: Path) -> dict[str, Any]:
    cfg = RedisSettings(url=group.url, spool_dir=spool, connect_timeout_s=0.5, op_timeout_s=0.5, retry_max_s=0.2,
                        replica_ack_grace_s=args.grace_s)  # fmt: skip
    publisher = Publisher(cfg)
    await publisher.start()
    calls = [CallContext(f"failover-{n}", f"{n}@pbx", "bench") for n in range(args.calls)]
    durable: list[str] = []
    outage: dict[str, float] = {}

    def submit(event: ev.Event) -> None:
        if not isinstance(event, ev.TranscriptPartial):
            durable.append(event.event_id)
        publisher.submit(event)

    async def watch_resume(start: float, reconnects: int) -> None:
        published = None
        while True:
            if publisher.reconnects > reconnects and publisher.connected:
                published = publisher.published if published is None else published
                if publisher.published > published:
                    outage["outage_s"] = time.monotonic() - start
                    return
            await asyncio.sleep(0.005)

    for ctx in calls:
        durable.append(publisher.call_started(ctx, [CALLER]).event_id)
    begin, utterance, watcher = time.monotonic(), 0, None
    failover: asyncio.Task[None] | None = None
    while time.monotonic() - begin < args.seconds:
        for ctx in calls:
            submit(_transcript(ctx, utterance, True))
            submit(_transcript(ctx, utterance, False))
        utterance += 1
        if failover is None and time.monotonic() - begin >= args.seconds / 2:
            start = time.monotonic()
            watcher = asyncio.create_task(watch_resume(start, publisher.reconnects))
            failover = asyncio.create_task(
                asyncio.to_thread(group.kill_master if args.mode == "kill" else group.failover)
            )
            failover.add_done_callback(_timer(outage, "failover_s", start))
        await asyncio.sleep(args.interval_ms / 1000)
    assert failover is not None and watcher is not None
    await failover
    for ctx in calls:
        durable.append(publisher.call_ended(ctx, "bye", {}).event_id)
    deadline = time.monotonic() + args.grace_s + 30
    while (publisher.queued() or publisher.spool_pending_bytes()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.wait_for(watcher, 5)
    metrics = publisher.metrics()
    await publisher.stop()

    client = redis.Redis.from_url(group.master_url)

    def ids(key: str) -> list[str]:
        entries: Any = client.xrange(key)
        return [json.loads(fields[b"event"])["event_id"] for _, fields in entries]

    in_streams = Counter(i for ctx in calls for i in ids(SINGLE.call_stream(cfg.key_prefix, ctx.call_id)))
    in_firehose = Counter(ids(SINGLE.firehoses(cfg.key_prefix)[0]))
    client.close()
    wanted = set(durable)
    return {
        "mode": args.mode,
        "calls": args.calls,
        "seconds": args.seconds,
        "events_published": len(durable),
        "found": len(wanted & set(in_streams)),
        "missing": len(wanted - set(in_streams)),
        "duplicates": sum(n - 1 for n in in_streams.values()),
        "found_firehose": len(wanted & set(in_firehose)),
        "duplicates_firehose": sum(n - 1 for n in in_firehose.values()),
        "failover_s": round(outage["failover_s"], 3),
        "outage_s": round(outage["outage_s"], 3),
        "spooled": metrics["spooled"],
        "replayed": metrics["replayed"],
        "duplicates_suppressed": metrics["duplicates_suppressed"],
        "redis_errors": metrics["redis_errors"],
        "replica_ack_timeouts": metrics["replica_ack_timeouts"],
        "partials_dropped": metrics["partials_dropped"],
        "ack_p50_ms": metrics["ack_p50_ms"],
        "ack_p99_ms": metrics["ack_p99_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="asr-failover-") as tmp:
        group = LocalSentinelGroup(Path(tmp) / "redis")
        try:
            group.start()
        except LocalRedisError as exc:
            print(f"asr-bench failover: {exc}", file=sys.stderr)
            return 2
        try:
            result = asyncio.run(_scenario(group, args, Path(tmp) / "spool"))
        finally:
            group.stop()
    print(json.dumps(result))
    return 0 if result["missing"] == 0 and result["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
