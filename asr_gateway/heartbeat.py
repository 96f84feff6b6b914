"""What this gateway runs, told to Redis every few seconds, and reload requests from the console.

Every ``interval_s`` the heartbeat writes one field of the hash ``{prefix}:nodes``: the node id
-> JSON ``{node, config_version, last_reload: {at, ok, errors}, active_calls, active_calls_by_source,
engine_streams, degraded_streams, ts}`` (``active_calls``: the calls of every front door;
``active_calls_by_source``: the same by door, ``{"sip": n, "audiosocket": n, "websocket": n,
"audio_fork": n}``; ``degraded_streams``: the engine's streams at longer chunks than their
route's because the node is behind, surge; the ``asr_engine_degraded_streams`` gauge). Redis 7.0
has no per-field expiry, so ``ts`` (unix seconds) tells readers how fresh a field is: the
console shows a node as gone after ``3 * interval_s`` and deletes fields older than a day.
The hash itself expires a minute after the last heartbeat of any node.

The gateway also subscribes to the channel ``{prefix}:control``: the message ``reload`` runs
the same reload as SIGHUP (the console's *apply* and *rollback* send it), and the next
heartbeat, written right after, reports the new version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from kb_hooks.connection import make_client

log = logging.getLogger(__name__)

RELOAD_MESSAGE = "reload"
HASH_TTL_S = 60
STOP_STEP_S = 3.0  # the most each step of stop() waits


def nodes_key(prefix: str) -> str:
    return f"{prefix}:nodes"


def control_channel(prefix: str) -> str:
    return f"{prefix}:control"


def default_node_id(sip_port: int | None) -> str:
    return f"{socket.gethostname()}:{sip_port}" if sip_port else socket.gethostname()


class Heartbeat:
    """``start()`` runs two tasks on the loop: the periodic report and the control subscription."""

    def __init__(
        self,
        url: str,
        prefix: str,
        node_id: str,
        report: Callable[[], dict[str, Any]],
        reload: Callable[[], object],
        interval_s: float = 2.0,
    ) -> None:
        self.prefix = prefix
        self.node_id = node_id
        self.interval_s = interval_s
        self._report = report
        self._reload = reload
        self._client = make_client(url, 2.0, 2.0)
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._stopping = False

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._beat(), name="heartbeat"),
            asyncio.create_task(self._listen(), name="control"),
        ]

    async def stop(self) -> None:
        """Cancel both tasks, take this node out of the hash, close the client. Bounded: a
        service's shutdown must not wait on Redis (a pub/sub teardown in redis-py can outlive a
        cancel), so every step gives up after ``STOP_STEP_S``."""
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_STEP_S)
            if pending:
                log.warning("heartbeat: %d task(s) still closing after %.0f s; not waiting", len(pending), STOP_STEP_S)
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await asyncio.wait_for(self._client.hdel(nodes_key(self.prefix), self.node_id), STOP_STEP_S)
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await asyncio.wait_for(self._client.aclose(), STOP_STEP_S)

    def payload(self) -> str:
        return json.dumps({"node": self.node_id, "ts": time.time(), **self._report()}, ensure_ascii=False)

    async def _beat(self) -> None:
        key = nodes_key(self.prefix)
        while not self._stopping:
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.hset(key, self.node_id, self.payload())
                    pipe.expire(key, HASH_TTL_S)
                    await pipe.execute()
            except (RedisError, OSError) as exc:  # Redis down: the publisher logs outages already
                log.debug("heartbeat not written: %s", exc)
            self._wake.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel that
            # arrives as the event is set (a reload right before stop), and this loop would
            # then run on; stop() also sets _stopping for the same reason.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()

    async def _listen(self) -> None:
        while not self._stopping:
            try:
                async with self._client.pubsub() as pubsub:
                    await pubsub.subscribe(control_channel(self.prefix))
                    while not self._stopping:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if message is not None and _text(message.get("data")) == RELOAD_MESSAGE:
                            log.info("reload requested on %s", control_channel(self.prefix))
                            self._reload()
                            self._wake.set()  # report the new version now
            except (RedisError, OSError) as exc:
                log.debug("control channel lost: %s; resubscribing", exc)
                await asyncio.sleep(self.interval_s)


def _text(data: object) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)
