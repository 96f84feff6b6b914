"""Two nodes behind Kamailio's dispatcher on Redis Sentinel, all real and on loopback.

``LocalCluster`` runs ``deploy/cluster/kamailio-dispatcher.cfg`` itself (probe interval 1 s), two
``asr-gateway serve`` nodes on 127.0.0.2 and 127.0.0.3, and a Sentinel group (master, replica,
three sentinels). sipp plays the PBX from 127.0.0.100 and calls Kamailio; while calls are up,
node1 gets SIGTERM (drain) and the Redis master is killed (Sentinel fails over).

Asserted: every call is answered and completes (ACK and BYE follow Kamailio's Record-Route);
every final each node journaled is in Redis exactly once by event_id; Kamailio sends no new call
to the drained node later than one probe interval (plus the probe's timeout) after the SIGTERM,
and the node itself accepts none after it; the drained node finishes its calls and exits; the
nodes route the calls by the PBX's address that Kamailio states (X-Source-Addr), not Kamailio's.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from asr_core.audio_io import read_wav
from asr_gateway.dev.cluster import (
    DISPATCHER_CFG,
    ClusterOptions,
    LocalCluster,
    Proc,
    finals_report,
    firehose,
    journaled,
    missing_programs,
    selections,
)
from asr_gateway.dev.cluster import main as cluster_main
from asr_gateway.dev.sipp_calls import CallResult, place_call
from kb_hooks.events import EventType

REPO = Path(__file__).resolve().parents[1]
AUDIO = REPO / "tests" / "data" / "hotline_8k" / "hotline_1.wav"
PBX_HOST = "127.0.0.100"
PING_S = 1
FR_TIMER_MS = 2000  # shorter: a node stalled by a loaded CI machine looks dead
CALLS = 12
SPACING_S = 0.6
DRAIN_AT_S = 2.0
KILL_MASTER_AT_S = 3.0

MISSING = missing_programs() + ([] if shutil.which("sipp") else ["sip-tester"])
needs_peers = pytest.mark.skipif(bool(MISSING), reason=f"not installed (Debian packages): {', '.join(MISSING)}")


def test_status_and_down_without_a_recorded_cluster_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cluster_main(["status", "--state-dir", str(tmp_path)]) == 1
    assert cluster_main(["down", "--state-dir", str(tmp_path)]) == 1
    assert "no cluster recorded" in capsys.readouterr().err


def test_down_never_signals_a_recorded_id_that_now_runs_another_program(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        cluster = LocalCluster(tmp_path)
        cluster.procs = [Proc("node", "node1", stranger.pid, str(tmp_path / "serve.log"))]
        cluster.save()
        assert cluster_main(["status", "--state-dir", str(tmp_path)]) == 3  # recorded, not running
        assert cluster_main(["down", "--state-dir", str(tmp_path)]) == 0
        assert stranger.poll() is None, "down signalled a process the cluster did not start"
    finally:
        stranger.kill()
        stranger.wait()


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    options = ClusterOptions(
        nodes=2,
        ping_interval_s=PING_S,
        fr_timer_ms=FR_TIMER_MS,
        drain_wait_s=30.0,
        max_streams=16,  # one node takes every call after the drain
        pbx_cidrs=(f"{PBX_HOST}/32",),
    )
    cluster = LocalCluster(tmp_path / "cluster", options)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


@needs_peers
def test_drain_and_sentinel_failover_mid_call_lose_no_call_and_no_final(cluster: LocalCluster, tmp_path: Path) -> None:
    assert cluster.sentinel_group is not None, "Redis Sentinel expected (LocalSentinelGroup)"
    # Kamailio runs the box generator's file, which includes the deployed example itself, not a copy.
    (kamailio,) = [p for p in cluster.procs if p.kind == "kamailio"]
    assert DISPATCHER_CFG == REPO / "deploy" / "cluster" / "kamailio-dispatcher.cfg"
    generated = cluster.state_dir / "kamailio" / "kamailio.cfg"
    assert str(generated).encode() in Path(f"/proc/{kamailio.pid}/cmdline").read_bytes().split(b"\0")
    assert generated.read_text(encoding="utf-8").rstrip().endswith(f'include_file "{DISPATCHER_CFG}"')
    audio = read_wav(AUDIO)
    drained = "node1"
    marks: dict[str, float] = {}

    async def call(index: int) -> CallResult:
        await asyncio.sleep(index * SPACING_S)
        return await place_call(
            tmp_path / f"call{index}", cluster.proxy_port, audio.samples, audio.rate,
            host=PBX_HOST, target_host="127.0.0.1", via_proxy=True, call_tag=f"cl{index}", timeout_s=40,
        )  # fmt: skip

    async def drain() -> None:
        await asyncio.sleep(DRAIN_AT_S)
        marks["drain"] = time.time()
        cluster.drain_node(drained)

    async def fail_over_redis() -> None:
        await asyncio.sleep(KILL_MASTER_AT_S)
        marks["kill_master"] = time.time()
        await asyncio.to_thread(cluster.sentinel_group.kill_master)
        marks["new_master"] = time.time()

    async def scenario() -> list[CallResult]:
        results = await asyncio.gather(*(call(i) for i in range(CALLS)), drain(), fail_over_redis())
        return [r for r in results if isinstance(r, CallResult)]

    results = asyncio.run(scenario())
    failed = [(i, r.returncode, r.errors[-600:]) for i, r in enumerate(results) if r.returncode != 0]
    assert not failed, f"calls not answered or not completed: {failed}"

    # The drained node finishes its calls, publishes their finals and exits by itself.
    node = cluster.node(drained)
    deadline = time.monotonic() + 40
    while cluster.alive_proc(node) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not cluster.alive_proc(node), "the drained node did not exit after its calls ended"

    master_url = cluster.sentinel_group.master_url
    events = _wait_for_finals(cluster, master_url)
    report = finals_report(cluster, events)
    assert report["finals_expected"] >= CALLS, report  # at least one final per call
    assert report["finals_missing"] == [] and report["finals_duplicated"] == [], report

    # Every call is in Redis, started and ended, and routed by the PBX address Kamailio stated.
    started = {e["sip_call_id"]: e for e in events if e["event_type"] == "call.started"}
    ended = {e["sip_call_id"] for e in events if e["event_type"] == "call.ended"}
    assert len(started) == CALLS and set(started) == ended
    assert {e["route"] for e in started.values()} == {"pbx"}

    # Kamailio stops choosing the drained node within one probe interval (and its timeout).
    choices = selections(cluster)
    assert {c.sip_call_id.split("-")[0] for c in choices if not c.failover} == {f"cl{i}" for i in range(CALLS)}
    late = [c for c in choices if c.node == drained and c.time > marks["drain"] + PING_S + FR_TIMER_MS / 1000]
    assert not late, f"{drained} still chosen after its probe interval: {late}"
    # ... and the node took no call after the SIGTERM (a 503 sent any raced INVITE elsewhere).
    drained_calls = {call_id for _, call_id, kind in journaled(node) if kind == "call.started"}
    after = [
        e["sip_call_id"] for e in started.values() if e["call_id"] in drained_calls and _epoch(e["ts"]) > marks["drain"]
    ]
    assert not after, f"{drained} accepted calls after SIGTERM: {after}"
    survivor_calls = {call_id for _, call_id, kind in journaled(cluster.node("node2")) if kind == "call.started"}
    assert drained_calls and survivor_calls, "both nodes should have taken calls before the drain"
    # The drained node's calls ended by the caller's BYE, not by the node hanging up on them.
    reasons = {e["reason"] for e in events if e["event_type"] == "call.ended" and e["call_id"] in drained_calls}
    assert reasons == {"bye"}, reasons

    # `cluster down` from another invocation (only cluster.json to go by) ends every process.
    assert cluster_main(["down", "--state-dir", str(cluster.state_dir)]) == 0
    recorded = LocalCluster.load(cluster.state_dir)
    assert not [p.name for p in recorded.procs if recorded.alive_proc(p)]
    assert any(
        _epoch(e["ts"]) > marks["new_master"] for e in events if e["event_type"] == EventType.TRANSCRIPT_FINAL
    ), "no final was published after the failover: the failover was not mid-call"


def _wait_for_finals(cluster: LocalCluster, master_url: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The firehose once every call has ended there and every journaled final is there (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = firehose(master_url)
        ended = {e["sip_call_id"] for e in events if e["event_type"] == "call.ended"}
        if (
            len(ended) >= CALLS and not finals_report(cluster, events)["finals_missing"]
        ) or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
