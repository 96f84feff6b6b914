"""A box of two nodes on loopback, every part real: ``LocalCluster`` with the doors writes the
nodes' overlays, Kamailio's and HAProxy's files with the box's generator (``asr_gateway.box``)
and runs kamailio, haproxy, redis-server and two ``asr-gateway serve`` nodes, each
stopped by its process id at the end.

Asserted, in order on one cluster (tests that follow start from the state the previous left):
calls through each door (SIP by sipp through Kamailio, AudioSocket and WebSocket through
HAProxy) spread over both nodes; after a SIGKILL of node1 new calls of every door go to node2,
and when node1 starts again it publishes what it had journaled and ends its cut call
(``node_restart``); a rolling restart (SIGTERM drains node1, it starts again, then node2) loses
no call: every call placed, including those in progress on a draining node, has its
``call.started``, finals and ``call.ended`` in Redis.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asr_gateway.dev.cluster import (
    ClusterOptions,
    LocalCluster,
    balancer_states,
    firehose,
    journaled,
    missing_programs,
)
from asr_gateway.dev.sipp_calls import place_call
from tests.audio_clients import audiosocket_message, hotline_client, recording
from tests.waiting import wait_until

PBX_HOST = "127.0.0.100"
PING_S = 1
FR_TIMER_MS = 2000
DOORS = ("audiosocket", "websocket")


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    assert not missing_programs(doors=True), missing_programs(doors=True)
    options = ClusterOptions(
        nodes=2,
        ping_interval_s=PING_S,
        fr_timer_ms=FR_TIMER_MS,
        drain_wait_s=20.0,
        max_streams=16,  # one node takes every call while the other is down
        pbx_cidrs=("127.0.0.0/8",),  # behind HAProxy the doors see HAProxy's loopback address
        doors=True,
        sentinel=False,  # one redis-server: Sentinel's failover is tests/test_cluster_kamailio.py's
        traced=False,  # nodes start (and restart) in seconds
    )
    cluster = LocalCluster(tmp_path_factory.mktemp("box") / "cluster", options)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


@dataclass
class Calls:
    """The calls a test placed, by door, and how to find them in Redis."""

    sip_tags: list[str] = field(default_factory=list)
    audiosocket: list[str] = field(default_factory=list)  # the UUIDs: the calls' source_call_id
    websocket: list[str] = field(default_factory=list)  # call_id from the door's call.started reply


_tags = itertools.count()


async def sip_call(box: LocalCluster, calls: Calls, workdir: Path, pcm: np.ndarray) -> None:
    tag = f"bx{next(_tags)}"
    calls.sip_tags.append(tag)
    result = await place_call(
        workdir / tag, box.proxy_port, pcm, 8000, host=PBX_HOST, target_host="127.0.0.1",
        via_proxy=True, call_tag=tag, timeout_s=60,
    )  # fmt: skip
    assert result.returncode == 0, result.errors[-600:]


async def audiosocket_call(box: LocalCluster, calls: Calls, pcm: np.ndarray) -> None:
    """Asterisk's AudioSocket through HAProxy, 20 ms frames sent in real time (so the call is in
    progress for the recording's length), then the hangup."""
    stream = uuid.uuid4()
    calls.audiosocket.append(str(stream))
    reader, writer = await asyncio.open_connection("127.0.0.1", box.audiosocket_port)
    writer.write(audiosocket_message(0x01, stream.bytes))
    data = pcm.astype("<i2").tobytes()
    for i, start in enumerate(range(0, len(data), 320)):
        writer.write(audiosocket_message(0x10, data[start : start + 320]))
        if i % 10 == 9:
            await writer.drain()
            await asyncio.sleep(0.2)
    writer.write(audiosocket_message(0x00))
    await writer.drain()
    await reader.read()
    writer.close()


async def websocket_call(box: LocalCluster, calls: Calls, pcm: np.ndarray) -> None:
    url = f"ws://127.0.0.1:{box.websocket_port}/v1/stream"
    replies = await asyncio.to_thread(hotline_client, url, pcm, 8000, 320, 4)
    started = next(r for r in replies if r.get("event_type") == "call.started")
    calls.websocket.append(str(started["call_id"]))
    assert replies[-1]["event_type"] == "call.ended"


def events(box: LocalCluster) -> list[dict[str, Any]]:
    master = box.redis_master()
    assert master is not None
    return firehose(f"redis://{master}/0")


def call_ids(calls: Calls, found: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Each door's placed calls as the nodes' call_ids (from their call.started events)."""
    started = [e for e in found if e["event_type"] == "call.started"]
    sip = {e["call_id"] for e in started for tag in calls.sip_tags if (e["sip_call_id"] or "").startswith(f"{tag}-")}
    audiosocket = {e["call_id"] for e in started if e["source_call_id"] in calls.audiosocket}
    return {"sip": sip, "audiosocket": audiosocket, "websocket": set(calls.websocket)}


def wait_complete(box: LocalCluster, calls: Calls, timeout_s: float = 40.0) -> dict[str, set[str]]:
    """Until every placed call is in Redis with its call.started, a final and call.ended; the call_ids."""
    placed = len(calls.sip_tags) + len(calls.audiosocket) + len(calls.websocket)
    state: dict[str, Any] = {}

    def complete() -> bool:
        found = events(box)
        ids = call_ids(calls, found)
        ended = {e["call_id"] for e in found if e["event_type"] == "call.ended"}
        finals = {e["call_id"] for e in found if e["event_type"] == "transcript.final"}
        every = set().union(*ids.values())
        state.update(ids=ids, missing=sorted(every - (ended & finals)), found=len(every))
        return len(every) == placed and every <= ended & finals

    wait_until(complete, timeout_s, what=f"{placed} calls complete in Redis: {state}")
    return state["ids"]


def taken_by(box: LocalCluster, name: str) -> set[str]:
    return {call_id for _, call_id, kind in journaled(box.node(name)) if kind == "call.started"}


def test_calls_through_each_door_spread_over_both_nodes(box: LocalCluster, tmp_path: Path) -> None:
    pcm = recording("hotline_3", 8000)  # 2.2 s
    calls = Calls()

    async def scenario() -> None:
        await asyncio.gather(
            *(sip_call(box, calls, tmp_path, pcm) for _ in range(4)),
            *(audiosocket_call(box, calls, pcm) for _ in range(4)),
            *(websocket_call(box, calls, pcm) for _ in range(4)),
        )

    asyncio.run(scenario())
    ids = wait_complete(box, calls)
    for door, placed in ids.items():
        on = {name: placed & taken_by(box, name) for name in ("node1", "node2")}
        assert on["node1"] and on["node2"], f"{door}: calls not spread over both nodes: {on}"
        assert on["node1"] | on["node2"] == placed


def test_a_killed_nodes_new_calls_go_to_its_sibling_and_its_journal_is_replayed(
    box: LocalCluster, tmp_path: Path
) -> None:
    pcm = recording("hotline_3", 8000)
    long_pcm = np.concatenate([recording("hotline_1", 8000)] * 2)  # 8 s: in progress at the kill
    seen = taken_by(box, "node1")
    before, after = Calls(), Calls()

    async def scenario() -> None:
        # Two at once: HAProxy's leastconn gives each node one.
        long_calls = [asyncio.create_task(audiosocket_call(box, before, long_pcm)) for _ in range(2)]
        await asyncio.to_thread(
            wait_until, lambda: taken_by(box, "node1") - seen, 20.0, "node1 took one of the long calls"
        )
        box.kill_node("node1")
        await asyncio.to_thread(
            wait_until, lambda: not box.alive_proc(box.node("node1")), 10.0, "node1 gone after SIGKILL"
        )
        await asyncio.gather(
            *(sip_call(box, after, tmp_path, pcm) for _ in range(2)),
            *(audiosocket_call(box, after, pcm) for _ in range(2)),
            *(websocket_call(box, after, pcm) for _ in range(2)),
        )
        results = await asyncio.gather(*long_calls, return_exceptions=True)
        assert any(r is None for r in results), results  # node2's long call went on to its end

    asyncio.run(scenario())
    cut = taken_by(box, "node1") - seen
    assert len(cut) == 1, cut
    ids = wait_complete(box, after)
    survivor = taken_by(box, "node2")
    for door, placed in ids.items():
        assert len(placed) == 2 and placed <= survivor, f"{door}: new calls not all on node2"

    # Started again, node1 publishes what it journaled and ends the call the kill cut.
    box.restart_node("node1")
    journal = {event_id for event_id, _, _ in journaled(box.node("node1"))}

    def replayed() -> bool:
        found = events(box)
        published = {e["event_id"] for e in found}
        restarts = {e["call_id"] for e in found if e["event_type"] == "call.ended" and e["reason"] == "node_restart"}
        return journal <= published and cut <= restarts

    wait_until(replayed, 30.0, "node1's journal replayed and its cut call ended with node_restart")
    wait_until(lambda: balancer_states(box).get(("audiosocket", "node1")) == "UP", 20.0, "node1 back in HAProxy")


def test_a_rolling_restart_loses_no_call(box: LocalCluster, tmp_path: Path) -> None:
    """Each node in turn: calls in progress on both, SIGTERM (drain) one; once HAProxy has it out,
    new calls of every door go to the other; the drained node ends its calls and exits; it starts
    again and returns to both balancers; then the next node."""
    calls = Calls()
    for name, other in (("node1", "node2"), ("node2", "node1")):
        asyncio.run(_drain_with_calls(box, calls, tmp_path, name))
        node = box.node(name)
        wait_until(lambda n=node: not box.alive_proc(n), 40.0, f"{name} drained and exited")
        box.restart_node(name)
        for door in DOORS:
            wait_until(lambda d=door, n=name: balancer_states(box).get((d, n)) == "UP", 20.0, f"{name} back in HAProxy")
        assert box.alive_proc(box.node(other))
    ids = wait_complete(box, calls)
    assert len(ids["audiosocket"]) == 6 and len(ids["sip"]) == 8 and len(ids["websocket"]) == 6


async def _drain_with_calls(box: LocalCluster, calls: Calls, workdir: Path, name: str) -> None:
    """Calls in progress on both nodes, then ``name`` drained: new calls of every door while it
    drains go to the other node, and the calls it holds go on to their end."""
    pcm = recording("hotline_3", 8000)
    long_pcm = recording("hotline_seed", 8000)  # 5.4 s
    seen = taken_by(box, name)
    in_progress = [asyncio.create_task(audiosocket_call(box, calls, long_pcm)) for _ in range(2)]
    in_progress.append(asyncio.create_task(sip_call(box, calls, workdir, long_pcm)))
    await asyncio.to_thread(wait_until, lambda: taken_by(box, name) - seen, 20.0, f"{name} took a call")
    box.drain_node(name)
    # INVITEs and WebSocket handshakes at once, before Kamailio's next probe and HAProxy's next
    # check: one sent to the draining node gets 503 and is sent to the other node (Kamailio's
    # failure_route, HAProxy's retry-on 503), so none is refused.
    raced = [asyncio.create_task(sip_call(box, calls, workdir, pcm)) for _ in range(2)]
    raced += [asyncio.create_task(websocket_call(box, calls, pcm)) for _ in range(2)]
    for door in DOORS:
        await asyncio.to_thread(
            wait_until, lambda d=door: balancer_states(box).get((d, name)) == "DOWN", 10.0, f"{name} out of {door}"
        )
    placed = taken_by(box, name)
    await asyncio.gather(
        sip_call(box, calls, workdir, pcm), audiosocket_call(box, calls, pcm), websocket_call(box, calls, pcm)
    )
    await asyncio.gather(*raced)
    assert taken_by(box, name) == placed, f"{name} took a call while draining"
    await asyncio.gather(*in_progress)
