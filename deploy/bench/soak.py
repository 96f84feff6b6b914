"""Soak: keep N calls going through ``asr-gateway serve`` and watch its memory, FDs and threads.

``python -m deploy.bench.soak --calls N --minutes M`` starts a throwaway redis-server (unless
``--redis``) and the service as a subprocess, then keeps N sipp callers busy: each places
calls of random length (a random window of the bundled recordings) back to back, so calls
start and end all the time. Every ``--report-s`` (default 60 s) it prints one JSON line with
the service's RSS (and its children's: the engine's finals process), open file descriptors and
threads (from /proc) and the call counts; at the end one JSON summary with the growth after
warm-up (the first report). A call the service
refuses with 503 (no free engine slot: a slot is freed when the previous call's final is
flushed, which trails its BYE when the engine is behind) is counted in ``calls_refused_503``
and the caller tries again a second later, as a PBX would; any other failure fails the soak.
Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asr_common.audio import SAMPLE_RATE
from asr_core import memtrim
from asr_gateway.dev.demo import DATA_DIR, DemoError, check_model_dir, default_model_dir
from asr_gateway.dev.local_redis import LocalRedis, LocalRedisError, free_tcp_port, redis_reachable
from asr_gateway.dev.sipp_calls import PCMA, PCMU, place_call
from deploy.bench.e2e_bench import call_audio


@dataclass
class Counts:
    completed: int = 0
    failed: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (e.g. the engine's finals process), from /proc."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                children += [int(c) for c in f.read().split()]
    return children


def process_sample(pid: int) -> dict[str, float]:
    """RSS (MB), open FDs and threads of ``pid``, and the RSS of its children, from /proc."""
    return {
        "rss_mb": memtrim.rss_mb(pid) or 0.0,
        "children_rss_mb": round(sum(memtrim.rss_mb(child) or 0.0 for child in child_pids(pid)), 1),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": len(os.listdir(f"/proc/{pid}/task")),
    }


def active_calls(metrics_port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("asr_active_calls "):
                    return int(float(line.split()[1]))
    except OSError:
        return None
    return None


def write_config(path: Path, redis_url: str, model_dir: Path, calls: int, threads: int) -> tuple[int, int]:
    """A loopback service config on free ports; returns (sip port, metrics port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        sip_port = int(probe.getsockname()[1])
    metrics_port = free_tcp_port()
    rtp_base = random.randrange(42_000, 60_000, 1_000)
    config = {
        "sip": {"host": "127.0.0.1", "port": sip_port, "transports": ["udp"], "rtp_inactivity_timeout_s": 10,
                "invite_rate_per_s": 1000, "invite_burst": 1000, "trusted_cidrs": ["127.0.0.0/8"]},
        "rtp": {"host": "127.0.0.1", "port_min": rtp_base, "port_max": rtp_base + 999},
        "engine": {"model_dir": str(model_dir.resolve()), "max_streams": calls + 2, "max_batch": calls + 2,
                   "threads": threads},
        "redis": {"url": redis_url, "spool_dir": str(path.parent / "spool"), "firehose_maxlen": 100_000,
                  "call_ttl_s": 60},
        "metrics": {"host": "127.0.0.1", "port": metrics_port},
        "routes": str(DATA_DIR / "routes.yaml"),
        "kb_hooks": {"kb_sets": {"hotline": str(DATA_DIR / "kb.yaml")},
                     "tag_rule_sets": {"hotline": str(DATA_DIR / "tags.yaml")},
                     "analytics_rule_sets": {"hotline": str(DATA_DIR / "analytics.yaml")},
                     "street_lists": {"hotline": str(DATA_DIR / "streets.txt")}},
        "logging": {"level": "warning", "format": "json"},
    }  # fmt: skip
    path.write_text(json.dumps(config), encoding="utf-8")
    return sip_port, metrics_port


def wait_healthy(metrics_port: int, server: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise DemoError(f"asr-gateway serve exited with {server.returncode}; see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/health", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise DemoError(f"asr-gateway serve not healthy within {timeout_s:.0f} s")


async def caller(
    index: int, workdir: Path, sip_port: int, audio: np.ndarray, lengths_s: tuple[float, float], deadline: float,
    counts: Counts,
) -> None:  # fmt: skip
    """Back-to-back calls of random length until ``deadline``."""
    rng = random.Random(index)
    number = 0
    while time.monotonic() < deadline:
        seconds = rng.uniform(*lengths_s)
        length = int(seconds * SAMPLE_RATE)
        start = rng.randrange(0, audio.shape[0] - length)
        number += 1
        result = await place_call(
            workdir / f"caller{index}", sip_port, audio[start : start + length], SAMPLE_RATE,
            payload_type=PCMU if number % 2 else PCMA, call_tag=f"soak{index}x{number}",
        )  # fmt: skip
        if result.returncode == 0:
            counts.completed += 1
        elif "SIP/2.0 503" in result.errors:
            # Full node: the engine frees a call's slot only after its final is flushed, which
            # can trail the BYE; a PBX would try again later (Retry-After) or elsewhere.
            counts.refused += 1
            await asyncio.sleep(1.0)
        else:
            counts.failed += 1
            counts.errors = [*counts.errors[-4:], result.errors[-300:]]
            await asyncio.sleep(1.0)


async def soak(args: argparse.Namespace, sip_port: int, metrics_port: int, pid: int, workdir: Path) -> dict[str, Any]:
    audio, _ = call_audio(max(60.0, args.max_call_s * 2))
    counts = Counts()
    began = time.monotonic()
    deadline = began + args.minutes * 60
    tasks = [
        asyncio.create_task(caller(i, workdir, sip_port, audio, (args.min_call_s, args.max_call_s), deadline, counts))
        for i in range(args.calls)
    ]
    reports: list[dict[str, Any]] = []
    next_report = began + args.report_s
    while not all(task.done() for task in tasks):
        await asyncio.sleep(min(1.0, max(0.0, next_report - time.monotonic())))
        if time.monotonic() >= next_report:
            next_report += args.report_s
            if args.tracemalloc:
                os.kill(pid, signal.SIGUSR2)  # the service logs a memory report (see --log)
            sample = await asyncio.to_thread(process_sample, pid)
            active = await asyncio.to_thread(active_calls, metrics_port)
            report = {"elapsed_s": round(time.monotonic() - began), **sample, "active_calls": active,
                      "calls_completed": counts.completed, "calls_failed": counts.failed,
                      "calls_refused_503": counts.refused}  # fmt: skip
            reports.append(report)
            print(json.dumps(report), flush=True)
    for task in tasks:
        task.result()
    final = await asyncio.to_thread(process_sample, pid)
    warm = reports[0] if reports else final
    keys = ("rss_mb", "children_rss_mb", "fds", "threads")
    return {
        "calls": args.calls,
        "minutes": args.minutes,
        "calls_completed": counts.completed,
        "calls_failed": counts.failed,
        "calls_refused_503": counts.refused,
        "errors": counts.errors,
        "warm_up": warm,
        "end": final,
        "growth_after_warm_up": {key: round(final[key] - warm[key], 1) for key in keys},
        "max_after_warm_up": {key: max([r[key] for r in reports[1:]] + [final[key]]) for key in keys},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8, help="concurrent calls (default: %(default)s)")
    parser.add_argument("--minutes", type=float, default=60.0, help="duration (default: %(default)s)")
    parser.add_argument("--report-s", type=float, default=60.0, help="seconds between reports (default: %(default)s)")
    parser.add_argument("--min-call-s", type=float, default=3.0)
    parser.add_argument("--max-call-s", type=float, default=20.0)
    parser.add_argument("--model", type=Path, help="WeNet model directory (default: the bundled demo model)")
    parser.add_argument("--redis", default=os.environ.get("ASR_REDIS_URL"), help="Redis URL (default: a local one)")
    parser.add_argument("--threads", type=int, default=1, help="engine torch threads (default: %(default)s)")
    parser.add_argument("--log", type=Path, help="keep the service's log in this file (default: discarded)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="trace Python allocations in the service; each report adds its top sites")  # fmt: skip
    args = parser.parse_args(argv)
    local: LocalRedis | None = None
    server: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="asr-soak-") as tmp:
        workdir = Path(tmp)
        try:
            model_dir = args.model or default_model_dir()
            check_model_dir(model_dir)
            redis_url = args.redis
            if not redis_url or not redis_reachable(redis_url):
                local = LocalRedis(workdir / "redis")
                local.start()
                redis_url = local.url
            sip_port, metrics_port = write_config(workdir / "soak.yaml", redis_url, model_dir, args.calls, args.threads)
            env = {k: v for k, v in os.environ.items() if not k.startswith("ASR_")}
            env.setdefault("MALLOC_ARENA_MAX", "2")  # as deploy/systemd/hotline-asr.service runs it
            with (args.log or workdir / "serve.log").open("wb") as log:
                server = subprocess.Popen(
                    [sys.executable, *(["-X", "tracemalloc=1"] if args.tracemalloc else []),
                     "-m", "asr_gateway.cli", "serve", "--config", str(workdir / "soak.yaml")],
                    stdout=log, stderr=subprocess.STDOUT, env=env,
                )  # fmt: skip
            wait_healthy(metrics_port, server)
            summary = asyncio.run(soak(args, sip_port, metrics_port, server.pid, workdir))
            server.send_signal(signal.SIGTERM)
            summary["serve_exit_code"] = server.wait(timeout=60)
        except (DemoError, LocalRedisError) as exc:
            print(json.dumps({"error": str(exc)}))
            return 2
        finally:
            if server is not None and server.poll() is None:
                server.kill()
                server.wait()
            if local is not None:
                local.stop()
    print(json.dumps(summary, ensure_ascii=False))
    return 0 if summary["calls_failed"] == 0 and summary["serve_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
