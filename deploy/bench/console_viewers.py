"""``asr-bench console-viewers``: many live SSE viewers on one console process while events flow.

Starts a throwaway redis-server and one console process (``python -m console``, as deployed),
signs in, opens ``--viewers`` concurrent ``/api/calls/{id}/events`` streams spread over
``--calls`` calls, then publishes events through the gateway's real Publisher at ``--rate``
events/s for ``--seconds`` (finals, KB suggestions and partials in turn). The send time of each
event is kept by its ``event_id``; every viewer records when it got it. Prints one JSON object:
delivery latency p50/p95/p99/max (publish call -> viewer parsed it), durable events missed
(should be 0), partials missed (best effort), and the console's CPU (% of one core) and RSS.

The viewers run in this process, on the same machine: their own CPU competes with the console's
(``viewers_cpu_percent``; one Python process parsing every delivery saturates first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from asr_common.proc_cpu import process_cpu_seconds
from asr_gateway.dev.local_redis import LocalRedis, free_tcp_port
from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.publish_stats import percentile
from kb_hooks.publisher import Publisher
from kb_hooks.types import CallContext, Participant

USER, PASSWORD = "bench", "bench-password"
TEXT = "我今天发现新华路十二号井盖发生了破损有安全隐患"
TITLE = "井盖破损应急处置流程"


def _cpu_s(pid: int) -> float:
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError(f"cannot read the CPU time of process {pid} (it is gone, or this is not Linux)")
    return seconds


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _write_configs(tmp: Path, redis_url: str, port: int) -> Path:
    hashed = subprocess.run([sys.executable, "-m", "console", "hash-password"], input=PASSWORD + "\n",
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (tmp / "gateway.yaml").write_text(f'redis: {{url: "{redis_url}", spool_dir: {tmp / "spool"}}}\n')
    (tmp / "users.yaml").write_text(f'users:\n  {USER}: {{role: supervisor, password_hash: "{hashed}"}}\n')
    console = tmp / "console.yaml"
    console.write_text(f"service_config: gateway.yaml\nusers_file: users.yaml\nstate_dir: state\n"
                       f"listen: 127.0.0.1:{port}\n")  # fmt: skip
    return console


class Viewer:
    def __init__(self, call_id: str, sent: dict[str, float]) -> None:
        self.call_id = call_id
        self.sent = sent  # event_id -> time.time() when it was submitted
        self.got: set[str] = set()
        self.latencies: list[float] = []
        self.ready = asyncio.Event()

    async def run(self, client: httpx.AsyncClient) -> None:
        async with client.stream("GET", f"/api/calls/{self.call_id}/events") as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                now = time.time()
                self.got.add(event["event_id"])
                if event["event_id"] in self.sent:
                    self.latencies.append(now - self.sent[event["event_id"]])
                self.ready.set()


def _events(contexts: list[CallContext], count: int) -> list[ev.Event]:
    caller = Participant("caller", "sip:citizen@pbx")
    out: list[ev.Event] = []
    for i in range(count):
        ctx = contexts[i % len(contexts)]
        utterance = i // len(contexts)
        if i % 3 == 0:
            out.append(ev.TranscriptPartial(call=ctx, participant=caller, utterance_id=utterance, text=TEXT,
                                            begin_offset_ms=0, end_offset_ms=3200, tokens=(), confidence=0.9,
                                            latency_ms=100.0))  # fmt: skip
        elif i % 3 == 1:
            out.append(ev.TranscriptFinal(call=ctx, participant=caller, utterance_id=utterance, text=TEXT,
                                          begin_offset_ms=0, end_offset_ms=3200, tokens=(), confidence=0.9,
                                          latency_ms=100.0, nbest=()))  # fmt: skip
        else:
            out.append(ev.KbSuggestion(call=ctx, participant=caller, utterance_id=utterance, is_partial=False,
                                       entry_id=f"kb-{utterance}", title=TITLE, summary="", url=None, priority=80,
                                       entry_tags=(), score=0.85, match_kind="all_of", homophone=False,
                                       matched_text="井盖发生了破损", span=ev.Span(11, 18),
                                       status="confirmed"))  # fmt: skip
    return out


async def _run(args: argparse.Namespace, redis_url: str, base: str, pid: int, spool: Path) -> dict[str, Any]:
    publisher = Publisher(RedisSettings(url=redis_url, spool_dir=spool, spool_fsync="never"))
    await publisher.start()
    contexts = [CallContext(f"bench-call-{i}", route="bench") for i in range(args.calls)]
    started = [publisher.call_started(ctx, [Participant("caller")], {}) for ctx in contexts]
    while publisher.published < len(started):
        await asyncio.sleep(0.01)
    limits = httpx.Limits(max_connections=args.viewers + 10, max_keepalive_connections=args.viewers + 10)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=httpx.Timeout(60)) as client:
        page = await client.get("/login")
        token = page.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        login = await client.post("/login", data={"username": USER, "password": PASSWORD, "csrf_token": token})
        if login.status_code != 303:
            raise RuntimeError(f"sign-in failed: {login.status_code}")
        sent: dict[str, float] = {}
        viewers = [Viewer(contexts[i % args.calls].call_id, sent) for i in range(args.viewers)]
        tasks = [asyncio.create_task(v.run(client)) for v in viewers]
        await asyncio.wait_for(asyncio.gather(*(v.ready.wait() for v in viewers)), 60)
        events = _events(contexts, int(args.rate * args.seconds))
        cpu0, own0, t0 = _cpu_s(pid), time.process_time(), time.monotonic()
        for i, event in enumerate(events):
            delay = t0 + i / args.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[event.event_id] = time.time()
            publisher.submit(event)
        await asyncio.sleep(args.drain_s)
        wall, cpu, own = time.monotonic() - t0, _cpu_s(pid) - cpu0, time.process_time() - own0
        rss = _rss_mb(pid)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await publisher.stop()
    by_call: dict[str, list[ev.Event]] = {}
    for event in events:
        by_call.setdefault(event.call_id, []).append(event)
    durable_missed = partial_missed = 0
    latencies: list[float] = []
    for viewer in viewers:
        for event in by_call.get(viewer.call_id, []):
            if event.event_id not in viewer.got:
                if isinstance(event, ev.TranscriptPartial):
                    partial_missed += 1
                else:
                    durable_missed += 1
        latencies.extend(viewer.latencies)

    def ms(q: float) -> float:
        return round((percentile(latencies, q) or 0.0) * 1000, 1)

    return {
        "viewers": args.viewers,
        "calls": args.calls,
        "events_published": len(events),
        "events_per_s": args.rate,
        "deliveries": len(latencies),
        "deliveries_per_s": round(len(latencies) / wall, 1),
        "latency_p50_ms": ms(0.5),
        "latency_p95_ms": ms(0.95),
        "latency_p99_ms": ms(0.99),
        "latency_max_ms": ms(1.0),
        "durable_missed": durable_missed,
        "partials_missed": partial_missed,
        "partials_dropped_by_publisher": publisher.partials_dropped,
        "console_cpu_percent": round(100 * cpu / wall, 1),
        "console_rss_mb": round(rss, 1),
        "viewers_cpu_percent": round(100 * own / wall, 1),
        "seconds": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asr-bench console-viewers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--calls", type=int, default=20, help="calls the viewers spread over")
    parser.add_argument("--rate", type=float, default=50.0, help="events/s published (all calls together)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--drain-s", type=float, default=2.0, help="wait after the last event")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp_name:
        tmp = Path(tmp_name)
        redis = LocalRedis(tmp / "redis")
        redis.start()
        port = free_tcp_port()
        console_yaml = _write_configs(tmp, redis.url, port)
        proc = subprocess.Popen([sys.executable, "-m", "console", "--config", str(console_yaml),
                                 "--log-level", "warning"])  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the console did not start")
                time.sleep(0.1)
            result = asyncio.run(_run(args, redis.url, base, proc.pid, tmp / "spool"))
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            redis.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
