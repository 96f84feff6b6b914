"""A real redis-server for tests: ``asr_gateway.dev.local_redis.LocalRedis`` (the demo's), skipping
the test when redis-server is not installed.

Use the ``redis_server`` fixture (``from tests.redis_server import redis_server``) or
``RedisServer`` directly when a test needs to kill and restart it on the same port.
``sentinel_group`` (master, replica, three sentinels) and ``redis_cluster`` (three masters) are
the high-availability launchers from the same module, started and stopped around a test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from asr_gateway.dev.local_redis import LocalRedis, LocalRedisCluster, LocalSentinelGroup, RedisNotInstalled
from asr_gateway.dev.local_redis import free_tcp_port as free_port

__all__ = ["RedisServer", "free_port", "redis_cluster", "redis_server", "sentinel_group"]


class RedisServer(LocalRedis):
    """``LocalRedis`` whose ``start()`` skips the test when there is no redis-server."""

    def start(self, timeout_s: float = 10.0) -> None:
        try:
            super().start(timeout_s)
        except RedisNotInstalled as exc:
            pytest.skip(str(exc))


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


L = TypeVar("L", LocalSentinelGroup, LocalRedisCluster)


def _started(launcher: L) -> Iterator[L]:
    """Start ``launcher`` (skip the test without redis-server), yield it, stop it."""
    try:
        launcher.start()
    except RedisNotInstalled as exc:
        pytest.skip(str(exc))
    try:
        yield launcher
    finally:
        launcher.stop()


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[LocalSentinelGroup]:
    yield from _started(LocalSentinelGroup(tmp_path / "sentinel-group"))


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[LocalRedisCluster]:
    yield from _started(LocalRedisCluster(tmp_path / "redis-cluster"))
