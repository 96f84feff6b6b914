"""The Sentinel group and Cluster launchers in asr_gateway.dev.local_redis start real processes that
behave as Redis says: the sentinels promote the replica when the master dies, the cluster spreads
slots over three masters and redirects keys to their slot's owner."""

from __future__ import annotations

import redis
from redis.cluster import ClusterNode, RedisCluster

from asr_gateway.dev.local_redis import LocalRedisCluster, LocalSentinelGroup
from tests.redis_server import redis_cluster, sentinel_group

__all__ = ["redis_cluster", "sentinel_group"]


def test_sentinel_group_fails_over_and_keeps_replicated_data(sentinel_group: LocalSentinelGroup) -> None:
    group = sentinel_group
    assert group.url.startswith("redis+sentinel://127.0.0.1:") and group.url.endswith("/mymaster/0")
    assert group.master_port_by_sentinels() == {group.master.port}
    first = redis.Redis.from_url(group.master_url)
    first.set("before", "kept")
    first.wait(1, 2000)  # the replica has it before the master dies
    old_port = group.master.port
    group.kill_master()
    assert group.master.port != old_port
    assert group.master_port_by_sentinels() == {group.master.port}
    promoted = redis.Redis.from_url(group.master_url)
    assert promoted.get("before") == b"kept"
    assert promoted.info("replication")["role"] == "master"
    group.restart_old_master()
    assert redis.Redis.from_url(group.replica.url).info("replication")["role"] == "slave"
    group.failover()  # SENTINEL FAILOVER: back to the first node without killing anything
    assert group.master.port == old_port


def test_redis_cluster_has_three_masters_covering_all_slots(redis_cluster: LocalRedisCluster) -> None:
    assert redis_cluster.url.startswith("redis+cluster://") and redis_cluster.url.count(",") == 2
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in redis_cluster.addresses])
    try:
        masters = {node.port for node in client.get_primaries()}
        assert masters == {port for _, port in redis_cluster.addresses}
        owners = set()
        for index in range(30):
            key = f"key-{index}"
            client.set(key, index)
            assert client.get(key) == str(index).encode()
            owners.add(client.get_node_from_key(key).port)
        assert len(owners) == 3  # keys really land on different masters
    finally:
        client.close()
