"""Crash loop: SIGKILL ``asr-gateway serve`` at random moments, restart it, lose no durable event.

``asr-bench crashloop --kills N`` starts a throwaway redis-server (append-only, fsync always,
so what Redis acknowledged survives) and the service as a subprocess, places calls with the
bundled recordings, and N times kills the service with SIGKILL at a random moment of its
calls, then starts it again. About half of the kills (``--redis-down-share``) happen during a
Redis outage: Redis is frozen (SIGSTOP: connections hang, as with a stuck or partitioned
server) a random moment before the kill and thawed only after the restarted service is up,
so the restart, its journal replay and its ``node_restart`` endings meet a dead Redis too.

What counts as *made*: the service's journal audit file (``redis.journal_audit_file``), one
line per durable event once it is in the spool journal (fsynced). At the end the service is
restarted once more, given time to drain, and stopped; every made event_id must then be in
the firehose ``{prefix}:events`` exactly once, every call stream in ``seq`` order, and every
started call ended. Prints one JSON object; exit code 1 if anything is missing or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import redis

from asr_gateway.dev.demo import DemoError, check_model_dir, default_model_dir
from asr_gateway.dev.local_redis import LocalRedis
from asr_gateway.dev.sipp_calls import place_call
from deploy.bench.e2e_bench import call_audio
from deploy.bench.soak import wait_healthy, write_config
from kb_hooks.events import EventType

SAMPLE_RATE = 16000
KEY_PREFIX = "asr"


@dataclass
class Loop:
    """One crash loop's moving parts and tallies."""

    workdir: Path
    config: Path
    sip_port: int
    metrics_port: int
    redis: LocalRedis
    rng: random.Random
    audio: np.ndarray
    server: subprocess.Popen[bytes] | None = None
    redis_frozen: bool = False
    kills: int = 0
    kills_redis_down: int = 0
    calls_placed: int = 0
    restart_s: list[float] = field(default_factory=list)

    def start_service(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASR_")}
        began = time.monotonic()
        with (self.workdir / "serve.log").open("ab") as log:
            self.server = subprocess.Popen(
                [sys.executable, "-m", "asr_gateway.cli", "serve", "--config", str(self.config)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        wait_healthy(self.metrics_port, self.server, timeout_s=180)
        self.restart_s.append(time.monotonic() - began)

    def kill_service(self) -> None:
        assert self.server is not None
        self.server.send_signal(signal.SIGKILL)
        self.server.wait()
        self.server = None
        self.kills += 1

    def freeze_redis(self, frozen: bool) -> None:
        assert self.redis.process is not None
        self.redis.process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)
        self.redis_frozen = frozen


async def one_cycle(loop: Loop, calls: int, min_s: float, max_s: float, redis_down: bool) -> None:
    """Calls of random length, a SIGKILL at a random moment of them (Redis frozen before it or not)."""
    tasks = []
    for n in range(calls):
        seconds = loop.rng.uniform(3.0, 12.0)
        start = loop.rng.randrange(0, loop.audio.shape[0] - int(seconds * SAMPLE_RATE))
        pcm = loop.audio[start : start + int(seconds * SAMPLE_RATE)]
        tag = f"k{loop.kills}c{n}"
        tasks.append(asyncio.create_task(place_call(loop.workdir / "calls" / tag, loop.sip_port, pcm, SAMPLE_RATE,
                                                    call_tag=tag)))  # fmt: skip
        loop.calls_placed += 1
        await asyncio.sleep(loop.rng.uniform(0.0, 1.0))
    kill_at = loop.rng.uniform(min_s, max_s)
    if redis_down:
        freeze_at = loop.rng.uniform(0.0, kill_at)
        await asyncio.sleep(freeze_at)
        loop.freeze_redis(True)
        await asyncio.sleep(kill_at - freeze_at)
        loop.kills_redis_down += 1
    else:
        await asyncio.sleep(kill_at)
    loop.kill_service()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def made_events(audit: Path) -> list[tuple[str, str, str]]:
    """(event_id, call_id, event_type) of every event the service journaled."""
    if not audit.exists():
        return []
    out = []
    for line in audit.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((parts[0], parts[1], parts[2]))
    return out


def redis_events(url: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    try:
        entries: Any = client.xrange(f"{KEY_PREFIX}:events")
        return [json.loads(fields[b"event"]) for _, fields in entries]
    finally:
        client.close()


def call_stream_order_violations(url: str, call_ids: set[str]) -> tuple[int, int]:
    """(calls whose stream is out of seq order, duplicate event_ids within call streams)."""
    client = redis.Redis.from_url(url)
    disorder = duplicates = 0
    try:
        for call_id in call_ids:
            entries: Any = client.xrange(f"{KEY_PREFIX}:call:{call_id}")
            events = [json.loads(fields[b"event"]) for _, fields in entries]
            seqs = [e["seq"] for e in events]
            disorder += seqs != sorted(seqs)
            duplicates += len(events) - len({e["event_id"] for e in events})
    finally:
        client.close()
    return disorder, duplicates


def compare(loop: Loop, drain_s: float) -> dict[str, Any]:
    """Wait until Redis holds every made event (or ``drain_s`` passes), then count."""
    audit = loop.workdir / "audit.txt"
    deadline = time.monotonic() + drain_s
    while True:
        made = made_events(audit)
        found = Counter(e["event_id"] for e in redis_events(loop.redis.url))
        missing = [m for m in made if m[0] not in found]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    events = redis_events(loop.redis.url)
    found = Counter(e["event_id"] for e in events)
    made_ids = {m[0] for m in made}
    started = {e["call_id"] for e in events if e["event_type"] == EventType.CALL_STARTED}
    ended = Counter(e.get("reason") for e in events if e["event_type"] == EventType.CALL_ENDED)
    ended_calls = {e["call_id"] for e in events if e["event_type"] == EventType.CALL_ENDED}
    disorder, stream_duplicates = call_stream_order_violations(loop.redis.url, started | ended_calls)
    return {
        "kills": loop.kills,
        "kills_with_redis_down": loop.kills_redis_down,
        "calls_placed": loop.calls_placed,
        "events_made": len(made),
        "events_made_by_type": dict(Counter(m[2] for m in made)),
        "found": len(made_ids & set(found)),
        "missing": len(made_ids - set(found)),
        "duplicates": sum(n - 1 for n in found.values() if n > 1),
        "call_stream_duplicates": stream_duplicates,
        "calls_out_of_seq_order": disorder,
        "calls_started": len(started),
        "calls_left_open": len(started - ended_calls),
        "calls_ended_by_reason": dict(ended),
        "restart_to_healthy_s_max": round(max(loop.restart_s), 1) if loop.restart_s else None,
    }


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    model_dir = args.model or default_model_dir()
    check_model_dir(model_dir)
    local = LocalRedis(workdir / "redis")
    local.start()
    # Persistence for the redis-server that LocalRedis starts: what it acknowledged must stay.
    local_client = redis.Redis.from_url(local.url)
    local_client.config_set("appendonly", "yes")
    local_client.config_set("appendfsync", "always")
    local_client.close()
    config = workdir / "serve.json"
    sip_port, metrics_port = write_config(config, local.url, model_dir, args.calls, args.threads)
    values = json.loads(config.read_text(encoding="utf-8"))
    values["redis"].update(journal_audit_file=str(workdir / "audit.txt"), op_timeout_s=1.0, connect_timeout_s=1.0,
                           call_ttl_s=86_400)  # fmt: skip
    config.write_text(json.dumps(values), encoding="utf-8")
    audio, _ = call_audio(40.0)
    loop = Loop(workdir, config, sip_port, metrics_port, local, random.Random(args.seed), audio)
    began = time.monotonic()
    try:
        for kill in range(args.kills):
            loop.start_service()
            if loop.redis_frozen:
                loop.freeze_redis(False)
            redis_down = int((kill + 1) * args.redis_down_share) > int(kill * args.redis_down_share)
            asyncio.run(one_cycle(loop, args.calls, args.min_kill_s, args.max_kill_s, redis_down))
        loop.start_service()
        if loop.redis_frozen:
            loop.freeze_redis(False)
        result = compare(loop, args.drain_s)
        assert loop.server is not None
        loop.server.send_signal(signal.SIGTERM)
        result["final_stop_exit_code"] = loop.server.wait(timeout=60)
        loop.server = None
        result["seconds"] = round(time.monotonic() - began, 1)
        return result
    finally:
        if loop.server is not None and loop.server.poll() is None:
            loop.server.kill()
            loop.server.wait()
        if loop.redis_frozen:
            with contextlib.suppress(ProcessLookupError):
                loop.freeze_redis(False)
        local.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-bench crashloop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs of the service (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=3, help="calls placed per cycle (default: %(default)s)")
    parser.add_argument("--min-kill-s", type=float, default=1.0, help="earliest kill after the calls start")
    parser.add_argument("--max-kill-s", type=float, default=8.0, help="latest kill after the calls start")
    parser.add_argument("--redis-down-share", type=float, default=0.5,
                        help="share of kills made during a Redis outage (default: every second one)")  # fmt: skip
    parser.add_argument("--drain-s", type=float, default=60.0, help="time the last start gets to deliver everything")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="engine torch threads (default: %(default)s)")
    parser.add_argument("--model", type=Path, help="WeNet model directory (default: the bundled demo model)")
    parser.add_argument("--workdir", type=Path, help="keep logs, spool and audit file here (default: a temp dir)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            result = run(args, args.workdir)
        else:
            with tempfile.TemporaryDirectory(prefix="asr-crashloop-") as tmp:
                result = run(args, Path(tmp))
    except DemoError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps(result, ensure_ascii=False))
    ok = result["missing"] == 0 and result["duplicates"] == 0 and result["call_stream_duplicates"] == 0
    return 0 if ok and result["calls_left_open"] == 0 and result["calls_out_of_seq_order"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
