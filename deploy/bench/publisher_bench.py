"""Publisher throughput and latency against a local Redis; prints one JSON object.

    python -m deploy.bench.publisher_bench --events 50000 [--redis URL] [--rate 5000]

Without ``--redis`` a throwaway redis-server (no persistence) is started on a free loopback
port. A producer thread plays the engine: it submits prebuilt events (a mix of partials and
finals over ``--calls`` calls), as fast as it can or at ``--rate`` events/s. Reported:
sustained events/s (first submit to last acknowledgement) and the submit -> Redis
acknowledgement latency percentiles in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.publish_stats import percentile
from kb_hooks.publisher import Publisher
from kb_hooks.types import CallContext, Participant


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server not found: install it or pass --redis URL")
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL)  # fmt: skip
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.01)
    proc.kill()
    sys.exit("redis-server did not start")


def _events(n: int, calls: int, partial_ratio: float) -> list[ev.Event]:
    participant = Participant("caller", "sip:caller@pbx.local", None)
    contexts = [CallContext(f"bench-{c}", f"{c}@pbx", "bench") for c in range(calls)]
    text = "我今天发现新华路十二号井盖发生了破损，有安全隐患"
    tokens = tuple(ev.Token(ch, 40 * k, 40 * k + 40) for k, ch in enumerate(text))
    out: list[ev.Event] = []
    for i in range(n):
        partial = (i * 7919 % 1000) < partial_ratio * 1000
        ctx, utterance = contexts[i % calls], i // calls
        if partial:
            out.append(ev.TranscriptPartial(call=ctx, participant=participant, utterance_id=utterance, text=text,
                                            begin_offset_ms=0, end_offset_ms=3200, tokens=tokens, confidence=0.9,
                                            latency_ms=120.0))  # fmt: skip
        else:
            out.append(ev.TranscriptFinal(call=ctx, participant=participant, utterance_id=utterance, text=text,
                                          begin_offset_ms=0, end_offset_ms=3200, tokens=tokens, confidence=0.9,
                                          latency_ms=120.0, nbest=(ev.Alternative(text, -1.0),)))  # fmt: skip
    return out


async def _run(args: argparse.Namespace, url: str, spool: Path) -> dict[str, Any]:
    settings = RedisSettings(url=url, spool_dir=spool, max_batch=args.batch, queue_size=max(10_000, args.events),
                             spool_fsync=args.spool_fsync)  # fmt: skip
    publisher = Publisher(settings)
    await publisher.start()
    while not publisher.connected:
        await asyncio.sleep(0.01)
    events = _events(args.events, args.calls, args.partial_ratio)
    started = time.monotonic()

    def produce() -> None:
        for i, event in enumerate(events):
            if args.rate:
                delay = started + i / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            publisher.submit(event)

    producer = threading.Thread(target=produce)
    producer.start()
    while publisher.published + publisher.partials_dropped + publisher.rejected < args.events:
        await asyncio.sleep(0.001)
    elapsed = time.monotonic() - started
    producer.join()
    await publisher.stop()
    latencies = list(publisher.ack_latency_s)
    return {
        "events": args.events,
        "calls": args.calls,
        "partial_ratio": args.partial_ratio,
        "rate_target": args.rate or None,
        "max_batch": args.batch,
        "seconds": round(elapsed, 3),
        "events_per_s": round(args.events / elapsed, 1),
        "ack_p50_ms": round((percentile(latencies, 0.5) or 0) * 1000, 3),
        "ack_p95_ms": round((percentile(latencies, 0.95) or 0) * 1000, 3),
        "ack_p99_ms": round((percentile(latencies, 0.99) or 0) * 1000, 3),
        "published": publisher.published,
        "partials_dropped": publisher.partials_dropped,
        "spooled": publisher.spooled,
        "spool_fsync": args.spool_fsync,
        "duplicates_suppressed": publisher.duplicates_suppressed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--partial-ratio", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=0.0, help="events/s to submit (0: as fast as possible)")
    parser.add_argument("--batch", type=int, default=500, help="RedisSettings.max_batch")
    parser.add_argument("--redis", help="Redis URL (default: start a throwaway redis-server)")
    parser.add_argument("--spool-fsync", choices=("batch", "never"), default="batch", help="RedisSettings.spool_fsync")
    parser.add_argument("--spool-dir", type=Path, help="journal directory (default: in a temp dir; its disk decides "
                        "the fsync cost)")  # fmt: skip
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="publisher-bench-") as tmp:
        proc = None
        url = args.redis
        if url is None:
            proc, url = _start_redis(Path(tmp))
        try:
            result = asyncio.run(_run(args, url, args.spool_dir or Path(tmp) / "spool"))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
