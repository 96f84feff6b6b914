"""The publisher's I/O with a replicated Redis master: a script call followed by ``WAIT`` and
``INFO replication`` on the same connection, the sentinels asked whether the master changed,
and the replicas' offsets looked at again while the publisher is idle.

When a batch counts as confirmed is ``kb_hooks.replicas`` (no I/O); what is sent again after a
failover, and from where in the journal, is the publisher's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.commands.core import AsyncScript

from kb_hooks.config import RedisSettings
from kb_hooks.replicas import MasterChanged, ReplicaConfirmations


@dataclass(frozen=True)
class ScriptReply:
    """What one script call brought back."""

    results: list[Any]  # per event of the call (``kb_hooks.publish_script``: added, already there, or error text)
    confirmed: bool  # enough replicas have the batch, or none had to
    wait_timed_out: bool  # ``WAIT`` returned before the replicas it asked for had the batch


class ReplicationWatch:
    """Runs the publisher's script calls with the ``WAIT`` that ``redis.replica_acks`` asks for."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self.confirmations = ReplicaConfirmations(settings.wait_replicas, settings.replica_ack_grace_s)

    async def call(
        self,
        client: aioredis.Redis,
        script: AsyncScript,
        keys: list[str],
        args: list[str | int],
        ack: tuple[int, int] | None,
    ) -> ScriptReply:
        """The script, and with ``wait_replicas`` a ``WAIT`` and ``INFO replication`` in the same
        pipeline; ``ack`` (journal generation, offset) is what a later confirmation reaches."""
        if not self.settings.wait_replicas:
            return ScriptReply(await script(keys=keys, args=args), confirmed=True, wait_timed_out=False)
        wanted = self.confirmations.wanted()
        pipe = client.pipeline(transaction=False)
        await script(keys=keys, args=args, client=pipe)
        if wanted:
            pipe.wait(wanted, self.settings.replica_ack_timeout_ms)
        pipe.info("replication")
        replies = await pipe.execute()
        acked = int(replies[1]) if wanted else 0
        confirmed = self.confirmations.after_batch(wanted, acked, replies[-1], ack)
        return ScriptReply(replies[0], confirmed, wait_timed_out=bool(wanted) and acked < wanted)

    async def check_sentinels(self, client: aioredis.Redis) -> None:
        """A master without enough replicas may be one the sentinels have just replaced (they
        demote it only seconds later): ask them, and on a new master raise ``MasterChanged`` (the
        pool drops its idle connections, so the next ones go to the new master)."""
        pool = getattr(client, "connection_pool", None)
        if not isinstance(pool, SentinelConnectionPool) or pool.master_address is None:
            return
        before = pool.master_address
        if await pool.get_master_address() != before:
            self.confirmations.reset()
            raise MasterChanged(f"the sentinels name a new master instead of {before[0]}:{before[1]}")

    async def probe(self, client: aioredis.Redis) -> tuple[int, int] | None:
        """Idle with a batch no replica has confirmed yet: look at ``INFO`` again (replicas report
        their offset every second); the journal ack the confirmation reaches, else None."""
        timeout_s = self.settings.op_timeout_s * 2
        info = await asyncio.wait_for(client.info("replication"), timeout_s)
        confirmed = self.confirmations.probe(info)
        if confirmed is None:
            await asyncio.wait_for(self.check_sentinels(client), timeout_s)
        return confirmed
