"""A real redis-server for tests: ``asr_gateway.local_redis.LocalRedis`` (the demo's), skipping
the test when redis-server is not installed.

Use the ``redis_server`` fixture (``from tests.redis_server import redis_server``) or
``RedisServer`` directly when a test needs to kill and restart it on the same port.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from asr_gateway.local_redis import LocalRedis, RedisNotInstalled
from asr_gateway.local_redis import free_tcp_port as free_port

__all__ = ["RedisServer", "free_port", "redis_server"]


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
