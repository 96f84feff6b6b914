"""The gateway heartbeat against a real redis-server: it reports, takes reload requests, and
always stops, however a reload and the stop interleave."""

from __future__ import annotations

import asyncio
import json
import time

import redis

from asr_gateway.heartbeat import Heartbeat, control_channel, nodes_key
from tests.redis_server import RedisServer, redis_server
from tests.waiting import wait_until_async

__all__ = ["redis_server"]


def test_a_reload_right_before_stop_never_keeps_it_running(redis_server: RedisServer) -> None:
    """A reload wakes the report loop; a stop that lands in the same loop turn used to be
    swallowed by ``asyncio.wait_for`` on Python 3.11, and the heartbeat ran on forever."""
    reloads: list[float] = []

    async def scenario() -> None:
        for _ in range(30):
            beat = Heartbeat(redis_server.url, "asr", "gw-1", lambda: {"config_version": "v"},
                             lambda: reloads.append(time.time()), interval_s=0.05)  # fmt: skip
            beat.start()
            await asyncio.sleep(0.06)  # about one beat: over 30 rounds the stop lands at different points of it
            beat._wake.set()  # what a reload does, right before the stop
            await asyncio.wait_for(beat.stop(), 8.0)
            assert all(task.done() for task in beat._tasks)

    asyncio.run(scenario())
    with redis.Redis.from_url(redis_server.url) as client:
        assert client.hget(nodes_key("asr"), "gw-1") is None, "a stopped node takes itself out"


def test_reports_and_takes_a_reload_request(redis_server: RedisServer) -> None:
    reloads: list[float] = []

    async def scenario() -> None:
        beat = Heartbeat(redis_server.url, "asr", "gw-2", lambda: {"config_version": "abc", "active_calls": 3},
                         lambda: reloads.append(time.time()), interval_s=0.1)  # fmt: skip
        beat.start()
        try:
            with redis.Redis.from_url(redis_server.url) as client:
                await wait_until_async(lambda: client.hexists(nodes_key("asr"), "gw-2"), 10.0, "gw-2's first report")
                report = json.loads(client.hget(nodes_key("asr"), "gw-2") or b"{}")
                assert report["config_version"] == "abc" and report["active_calls"] == 3
                assert time.time() - report["ts"] < 5
                for _ in range(40):
                    client.publish(control_channel("asr"), "reload")
                    if reloads:
                        break
                    await asyncio.sleep(0.1)
            assert reloads, "the reload request reached the gateway"
        finally:
            await asyncio.wait_for(beat.stop(), 8.0)

    asyncio.run(scenario())
