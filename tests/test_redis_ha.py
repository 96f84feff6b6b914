"""Publishing to highly available Redis, with real processes on loopback.

* Redis Cluster (three masters, ``redis-cli --cluster create``): a whole call through the
  service (sipp in, events out) and a dozen calls through the publisher land in hash-tagged
  keys, one slot per call, the firehose sharded, every event schema-valid and read back by
  ``asr-gateway tail``.
* Redis Sentinel (master, replica, three sentinels): the master is killed, or failed over with
  ``SENTINEL FAILOVER``, in the middle of a call; afterwards every durable event of the call is
  on the new master exactly once by event_id, in the call stream and in the firehose.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster, key_slot

from asr_core.audio_io import read_wav
from asr_gateway.config import load_config
from asr_gateway.dev.local_redis import LocalRedisCluster, LocalSentinelGroup
from asr_gateway.dev.sipp_calls import place_call
from kb_hooks import events as ev
from kb_hooks import tail
from kb_hooks.config import RedisSettings
from kb_hooks.connection import parse_cluster_url
from kb_hooks.keys import SINGLE, KeyLayout
from kb_hooks.publisher import Publisher
from kb_hooks.types import CallContext
from tests.redis_server import redis_cluster, sentinel_group
from tests.service_calls import DATA, run_calls, write_config
from tests.test_publisher import CALLER, settings, transcript, wait_until

__all__ = ["redis_cluster", "sentinel_group"]

pytestmark = pytest.mark.timeout(120)


def cluster_client(cluster: LocalRedisCluster) -> RedisCluster:
    return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in cluster.addresses])


def entries(client: Any, key: str) -> list[dict[str, Any]]:
    return [json.loads(fields[b"event"]) for _, fields in client.xrange(key)]


def firehose_events(client: Any, layout: KeyLayout, prefix: str = "asr") -> list[dict[str, Any]]:
    return [event for key in layout.firehoses(prefix) for event in entries(client, key)]


def check_call(client: Any, layout: KeyLayout, call_id: str, prefix: str = "asr") -> list[dict[str, Any]]:
    """The call's stream: schema-valid, started..ended, seq ascending, ids set = stream ids."""
    stream = entries(client, layout.call_stream(prefix, call_id))
    for event in stream:
        jsonschema.validate(event, ev.schema())
    kinds = [e["event_type"] for e in stream]
    assert kinds[0] == "call.started" and kinds[-1] == "call.ended", kinds
    assert [e["seq"] for e in stream] == sorted(e["seq"] for e in stream)
    ids = {member.decode() for member in client.smembers(layout.event_ids(prefix, call_id))}
    assert ids == {e["event_id"] for e in stream}
    return stream


def test_url_forms_prefixes_and_key_layouts() -> None:
    target = parse_cluster_url("rediss+cluster://:pw@10.0.0.1:7000,10.0.0.2?ssl_cert_reqs=none")
    assert target.hosts == [("10.0.0.1", 7000), ("10.0.0.2", 6379)] and target.password == "pw" and target.tls
    assert target.options == {"ssl_cert_reqs": "none"}
    assert RedisSettings(url="redis+cluster://a:1,b:2").layout == KeyLayout(16)
    assert RedisSettings(url="redis+sentinel://a:1/m").wait_replicas == 1
    assert RedisSettings(url="redis://a:1/0").layout == SINGLE and RedisSettings(url="redis://a:1/0").wait_replicas == 0
    bad = {
        "redis+cluster://:secret@a:1/2": "only database 0",
        "redis+cluster://a:notaport": "bad cluster node address",
        "redis+cluster://a:1?db=2": "unknown option(s) db",
        "http://a:1": "the scheme must be one of",
        "redis+sentinel://a:1": "needs the master's service name",
    }
    for url, reason in bad.items():
        with pytest.raises(ValueError, match=r"(?s)" + reason.replace("(", r"\(").replace(")", r"\)")) as caught:
            RedisSettings(url=url)
        assert "secret" not in str(caught.value).split("[type=")[0]
    with pytest.raises(ValueError, match="replica_acks is not supported"):
        RedisSettings(url="redis+cluster://a:1", replica_acks=1)
    for prefix in ("asr", "{asr}", "tenant{7}:asr"):
        assert RedisSettings(key_prefix=prefix).key_prefix == prefix
    for prefix in ("{}", "a{b}{c}", "a b", "a{b"):
        with pytest.raises(ValueError):
            RedisSettings(key_prefix=prefix)
    # Single Redis: the historical names. Cluster: one slot per call, firehose shard included.
    assert SINGLE.call_stream("asr", "c1") == "asr:call:c1" and SINGLE.firehoses("asr") == ["asr:events"]
    layout = KeyLayout(16)
    for call_id in ("c1", "c2", "一二三"):
        keys = (
            layout.call_stream("asr", call_id),
            layout.event_ids("asr", call_id),
            layout.firehose_of("asr", call_id),
        )
        assert len({key_slot(k.encode()) for k in keys}) == 1
        assert layout.firehose_of("asr", call_id) in layout.firehoses("asr")
    assert len({key_slot(k.encode()) for k in layout.firehoses("asr")}) == 16
    assert len({key_slot(k.encode()) for k in layout.firehoses("{asr}")}) == 1  # the prefix's own tag wins


def test_cluster_whole_call_through_the_service(redis_cluster: LocalRedisCluster, tmp_path: Path) -> None:
    if shutil.which("sipp") is None:
        pytest.skip("sipp not installed (Debian package sip-tester)")
    config = load_config(write_config(tmp_path, redis_cluster.url), {})
    layout = config.redis.layout
    assert layout.shards == 16
    seed = read_wav(DATA / "hotline_seed.wav")

    run_calls(config, lambda port: [place_call(tmp_path / "call", port, seed.samples, 16000, call_tag="cluster")])
    client = cluster_client(redis_cluster)
    try:
        fire = firehose_events(client, layout)
        call_ids = {e["call_id"] for e in fire}
        assert len(call_ids) == 1
        call_id = call_ids.pop()
        stream = check_call(client, layout, call_id)
        assert "transcript.final" in [e["event_type"] for e in stream]
        assert sorted(e["event_id"] for e in fire) == sorted(e["event_id"] for e in stream)
        slots = {key_slot(k.encode()) for k in (layout.call_stream("asr", call_id), layout.event_ids("asr", call_id),
                                                 layout.firehose_of("asr", call_id))}  # fmt: skip
        assert len(slots) == 1
    finally:
        client.close()


def test_cluster_many_calls_spread_over_masters_and_tail_reads_them(
    redis_cluster: LocalRedisCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = settings(redis_cluster.url, tmp_path, firehose_groups=["dashboards"])
    layout = cfg.layout
    calls = [CallContext(f"call-{n}", f"sip-{n}@pbx", "hotline") for n in range(12)]

    async def scenario() -> Publisher:
        publisher = Publisher(cfg)
        await publisher.start()
        await wait_until(lambda: publisher.connected)
        for ctx in calls:
            publisher.call_started(ctx, [CALLER])
        for utterance in range(3):
            for ctx in calls:
                publisher.submit(transcript(ctx, utterance, True, f"第{utterance}句"))
                publisher.submit(transcript(ctx, utterance, False, f"第{utterance}句话"))
        for ctx in calls:
            publisher.call_ended(ctx, "bye", {"duration_ms": 1000})
        await wait_until(lambda: publisher.published == publisher.submitted and publisher.spool_pending_bytes() == 0)
        await publisher.stop()
        return publisher

    publisher = asyncio.run(scenario())
    assert publisher.rejected == 0 and publisher.duplicates_suppressed == 0
    client = cluster_client(redis_cluster)
    try:
        masters = set()
        for ctx in calls:
            stream = check_call(client, layout, ctx.call_id)
            assert [e["event_type"] for e in stream].count("transcript.final") == 3
            masters.add(client.get_node_from_key(layout.call_stream("asr", ctx.call_id)).port)
        assert len(masters) > 1, "calls are spread over the masters"
        fire = firehose_events(client, layout)
        assert len(fire) == 12 * 5 and len({e["event_id"] for e in fire}) == len(fire)
        for key in layout.firehoses("asr"):  # the consumer group exists on every shard
            assert [g["name"] for g in client.xinfo_groups(key)] == [b"dashboards"]
    finally:
        client.close()
    code = tail.main(["--redis", redis_cluster.url, "--from-start", "--json", "--no-partials",
                      "--max-events", str(len(fire)), "--timeout", "20"])  # fmt: skip
    assert code == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(e["event_id"] for e in printed) == sorted(e["event_id"] for e in fire)


@pytest.mark.parametrize("how", ["kill", "failover"])
def test_sentinel_failover_mid_call_keeps_every_final_once(
    sentinel_group: LocalSentinelGroup, tmp_path: Path, how: str
) -> None:
    group = sentinel_group
    cfg = settings(group.url, tmp_path, replica_ack_grace_s=2.0)  # after a kill the new master stays alone
    assert cfg.wait_replicas == 1
    ctx = CallContext("call-ha", "ha@pbx", "hotline")
    finals: list[str] = []

    async def scenario() -> Publisher:
        publisher = Publisher(cfg)
        await publisher.start()
        await wait_until(lambda: publisher.connected)
        publisher.call_started(ctx, [CALLER])

        async def speak(count: int) -> None:
            for _ in range(count):
                publisher.submit(transcript(ctx, len(finals), True, "partial"))
                event = transcript(ctx, len(finals), False, f"final {len(finals)}")
                finals.append(event.event_id)
                publisher.submit(event)
                await asyncio.sleep(0.01)

        await speak(50)
        outage = asyncio.create_task(asyncio.to_thread(group.kill_master if how == "kill" else group.failover))
        while not outage.done():
            await speak(1)
        await outage
        await speak(50)
        publisher.call_ended(ctx, "bye", {"duration_ms": 5000})
        await wait_until(lambda: publisher.queued() == 0 and publisher.spool_pending_bytes() == 0, 30.0)
        await publisher.stop()
        return publisher

    publisher = asyncio.run(scenario())
    if how == "kill":
        assert publisher.redis_errors >= 1, "the dead master was noticed"
    assert publisher.rejected == 0 and publisher.spool_full_dropped == 0
    client = redis.Redis.from_url(group.master_url)
    try:
        layout = cfg.layout
        stream = check_call(client, layout, ctx.call_id)
        in_stream = Counter(e["event_id"] for e in stream if e["event_type"] == "transcript.final")
        in_firehose = Counter(e["event_id"] for e in firehose_events(client, layout)
                              if e["event_type"] == "transcript.final")  # fmt: skip
        assert sorted(in_stream) == sorted(finals) and set(in_stream.values()) == {1}
        assert sorted(in_firehose) == sorted(finals) and set(in_firehose.values()) == {1}
    finally:
        client.close()
