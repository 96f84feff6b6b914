"""``asr-bench cluster``: real calls through Kamailio's dispatcher to N nodes on Redis Sentinel; one JSON.

``LocalCluster`` (``asr-gateway cluster``) brings up Kamailio running
``deploy/cluster/kamailio-dispatcher.cfg``, N ``asr-gateway serve`` nodes on 127.0.0.2... and a
Sentinel group; sipp plays a PBX on 127.0.0.100 and offers ``--calls`` calls at ``--rate`` per
second, each streaming the bundled hotline recording ``hotline_1`` (4 s) and hanging up. When
40 % of the calls have been offered, one event happens:

- ``--drain-node``: SIGTERM to node1 (it answers 503 and lets its calls end);
- ``--kill-node``: SIGKILL to node1 mid-call; after the run node1 is started again, so what its
  journal held is replayed, and the report says what came back;
- ``--kill-redis-master``: SIGKILL to the Redis master; Sentinel promotes the replica.

Reported: calls offered / answered / completed / failed, each node's share of the answered calls
(Kamailio's log), ``avoid_after_s`` (the event -> Kamailio's last choice of node1), finals
expected (what the nodes journaled) vs found in Redis (by event_id), duplicates; with
``--kill-node``, the killed node's calls: how many were cut, and their finals in Redis before and
after the restart against what a completed call of the same audio yields.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from asr_core.audio_io import read_wav
from asr_gateway.dev.cluster import (
    ClusterError,
    ClusterOptions,
    LocalCluster,
    finals_report,
    firehose,
    missing_programs,
    selections,
)
from asr_gateway.dev.demo import DATA_DIR
from asr_gateway.dev.sipp_calls import CallResult, place_call
from kb_hooks.events import EventType

PBX_HOST = "127.0.0.100"
VICTIM = "node1"
EVENT_AT = 0.4  # share of the calls offered before the event


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--rate", type=float, default=2.0, help="calls offered per second")
    parser.add_argument("--ping-interval", type=int, default=1, help="Kamailio's OPTIONS interval, s")
    parser.add_argument("--max-streams", type=int, default=16, help="engine slots per node")
    parser.add_argument(
        "--fr-timer-ms", type=int, default=2000, help="Kamailio's wait for any answer before failing over / node down"
    )
    event = parser.add_mutually_exclusive_group()
    event.add_argument("--drain-node", action="store_true", help="SIGTERM node1 at 40 %% of the calls")
    event.add_argument("--kill-node", action="store_true", help="SIGKILL node1 at 40 %% of the calls")
    event.add_argument("--kill-redis-master", action="store_true", help="SIGKILL the Redis master at 40 %%")
    parser.add_argument("--workdir", type=Path, help="keep the state dir and logs here (default: a temporary one)")


def run(args: argparse.Namespace) -> int:
    missing = missing_programs()
    if missing:
        print(json.dumps({"error": f"missing Debian packages: {', '.join(missing)}"}))
        return 2
    if args.workdir is not None:
        return _run_in(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="asr-bench-cluster-") as tmp:
        return _run_in(args, Path(tmp))


def _run_in(args: argparse.Namespace, workdir: Path) -> int:
    options = ClusterOptions(
        nodes=args.nodes,
        ping_interval_s=args.ping_interval,
        fr_timer_ms=args.fr_timer_ms,
        drain_wait_s=60.0,
        max_streams=args.max_streams,
        pbx_cidrs=(f"{PBX_HOST}/32",),
    )
    cluster = LocalCluster(workdir / "cluster", options)
    try:
        cluster.up()
    except ClusterError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    try:
        report = asyncio.run(_offer_calls(cluster, args, workdir / "calls"))
    finally:
        cluster.down()
    print(json.dumps(report, indent=2))
    return 0


async def _offer_calls(cluster: LocalCluster, args: argparse.Namespace, calls_dir: Path) -> dict[str, Any]:
    audio = read_wav(DATA_DIR / "hotline_1.wav")
    event = "drain-node" if args.drain_node else "kill-node" if args.kill_node else None
    event = "kill-redis-master" if args.kill_redis_master else event
    event_time: dict[str, float] = {}

    async def call(index: int) -> CallResult:
        await asyncio.sleep(index / args.rate)
        return await place_call(
            calls_dir / f"call{index}", cluster.proxy_port, audio.samples, audio.rate,
            host=PBX_HOST, target_host="127.0.0.1", via_proxy=True, call_tag=f"b{index}", timeout_s=60,
        )  # fmt: skip

    async def happen() -> None:
        if event is None:
            return
        await asyncio.sleep(args.calls * EVENT_AT / args.rate)
        event_time["at"] = time.time()
        if event == "drain-node":
            cluster.drain_node(VICTIM)
        elif event == "kill-node":
            cluster.kill_node(VICTIM)
        else:
            await asyncio.to_thread(cluster.sentinel_group.kill_master)
            event_time["new_master_after_s"] = time.time() - event_time["at"]

    started = time.monotonic()
    outcome = await asyncio.gather(*(call(i) for i in range(args.calls)), happen())
    results = [r for r in outcome if isinstance(r, CallResult)]
    offering_s = time.monotonic() - started
    master_url = _master_url(cluster)
    completed = sum(1 for r in results if r.returncode == 0)
    events = await asyncio.to_thread(_settle, cluster, master_url, completed, 60.0)
    report = _report(cluster, results, events, event, event_time)
    report["run_s"] = round(offering_s, 1)
    if event == "kill-node":
        report["killed_node"] = await asyncio.to_thread(_after_kill, cluster, events, master_url)
    report["finals"] = _finals(cluster, firehose(master_url))
    return report


def _master_url(cluster: LocalCluster) -> str:
    master = cluster.redis_master()
    if master is None:
        raise ClusterError("no Redis master answers")
    return f"redis://{master}/0"


def _settle(cluster: LocalCluster, master_url: str, calls: int, timeout_s: float) -> list[dict[str, Any]]:
    """The firehose once ``calls`` calls have ended there and every journaled final is there (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = firehose(master_url)
        ended = sum(1 for e in events if e["event_type"] == EventType.CALL_ENDED)
        if ended >= calls and not finals_report(cluster, events)["finals_missing"]:
            return events
        if time.monotonic() > deadline:
            return events
        time.sleep(1.0)


def _report(
    cluster: LocalCluster,
    results: list[CallResult],
    events: list[dict[str, Any]],
    event: str | None,
    event_time: dict[str, float],
) -> dict[str, Any]:
    answered = sum(1 for r in results if r.answered)
    completed = sum(1 for r in results if r.returncode == 0)
    chosen: dict[str, str] = {}
    failovers = 0
    for selection in selections(cluster):
        chosen[selection.sip_call_id] = selection.node  # the last choice is the node that answered
        failovers += selection.failover
    share = Counter(chosen.values())
    report: dict[str, Any] = {
        "nodes": len(cluster.nodes),
        "audio": "hotline_1.wav (4.0 s) per call, bundled demo model",
        "event": event,
        "calls_offered": len(results),
        "calls_answered": answered,
        "calls_completed": completed,
        "calls_failed": len(results) - answered,
        "answered_not_completed": answered - completed,
        "share_per_node": {p.name: round(share[p.name] / max(1, len(chosen)), 3) for p in cluster.nodes},
        "calls_per_node": {p.name: share[p.name] for p in cluster.nodes},
        "failovers": failovers,
        "ping_interval_s": cluster.options.ping_interval_s,
        "fr_timer_ms": cluster.options.fr_timer_ms,
    }
    if event in ("drain-node", "kill-node"):
        at = event_time["at"]
        later = [s.time for s in selections(cluster) if s.node == VICTIM and s.time >= at]
        report["avoid_after_s"] = round(max(later) - at, 2) if later else 0.0
        report["choices_of_victim_after_event"] = len(later)
    if "new_master_after_s" in event_time:
        report["redis_new_master_after_s"] = round(event_time["new_master_after_s"], 2)
    report["calls_in_redis"] = len({e["sip_call_id"] for e in events if e["event_type"] == EventType.CALL_STARTED})
    return report


def _finals(cluster: LocalCluster, events: list[dict[str, Any]]) -> dict[str, Any]:
    finals = finals_report(cluster, events)
    return {
        "expected": finals["finals_expected"],
        "found": finals["finals_found"],
        "missing": len(finals["finals_missing"]),
        "duplicates": len(finals["finals_duplicated"]),
    }


def _after_kill(cluster: LocalCluster, events: list[dict[str, Any]], master_url: str) -> dict[str, Any]:
    """The killed node's calls: cut ones, their finals before and after a restart replays its journal."""
    victim_calls = {s.sip_call_id for s in selections(cluster) if s.node == VICTIM}
    per_call = Counter(e["sip_call_id"] for e in events if e["event_type"] == EventType.TRANSCRIPT_FINAL)
    ended_by_bye = {
        e["sip_call_id"] for e in events if e["event_type"] == EventType.CALL_ENDED and e.get("reason") == "bye"
    }
    complete = [per_call[c] for c in ended_by_bye if c not in victim_calls]
    finals_per_call = statistics.median(complete) if complete else 0
    cut = sorted(c for c in victim_calls if c not in ended_by_bye)
    before = sum(per_call[c] for c in cut)
    cluster.restart_node(VICTIM)
    after_events = _settle(cluster, master_url, 0, 30.0)
    per_call_after = Counter(e["sip_call_id"] for e in after_events if e["event_type"] == EventType.TRANSCRIPT_FINAL)
    restart_ended = [
        e for e in after_events if e["event_type"] == EventType.CALL_ENDED and e.get("reason") == "node_restart"
    ]
    return {
        "calls_cut": len(cut),
        "finals_per_completed_call": finals_per_call,
        "finals_of_cut_calls_if_completed": finals_per_call * len(cut),
        "finals_of_cut_calls_in_redis_before_restart": before,
        "finals_of_cut_calls_in_redis_after_restart": sum(per_call_after[c] for c in cut),
        "calls_ended_node_restart_after_restart": len(restart_ended),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="asr-bench cluster", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
