"""When a batch written to a Redis master counts as safe from a failover: the bookkeeping
behind the publisher's ``replica_acks`` (``kb_hooks.replication`` does the I/O).

A batch is *confirmed* when ``WAIT`` says ``required`` replicas have it, or later when the
master's ``INFO replication`` shows replicas whose acknowledged offset reached the master's
offset right after the batch. Until then its journal records stay in the spool, so that after
a failover they can be sent again to the new master (the event-id sets make what it already
has a no-op). The same ``INFO`` names the master's replication id: when it changes between two
batches the client has reconnected to another master on its own (redis-py does that after a
connection was cut), and the publisher must send again what was not confirmed: ``MasterChanged``.

A master that lists fewer replicas than ``required`` is what a replaced master looks like in
the seconds of a failover before the sentinels turn it into a replica (they wait a few seconds
before reconfiguring it); what it takes then must not be trusted. The publisher then asks the
sentinels who the master is, and sends again from the last confirmed batch on a change. One
still alone after ``grace_s`` that the sentinels keep naming is taken as the only master there
is (its replica died, or was promoted when the old master died): its batches count as
confirmed, and ``WAIT`` asks for no more replicas than it has, so batches do not stall on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger(__name__)


class MasterChanged(RedisConnectionError):
    """The batch reached a different master than the one before (its replication id changed)."""


class ReplicaConfirmations:
    def __init__(self, required: int, grace_s: float) -> None:
        self.required = required
        self.grace_s = grace_s
        self.replicas = required  # what the master's INFO last listed (assume enough until told)
        self.alone_since: float | None = None
        self.pending: tuple[int, tuple[int, int]] | None = None  # (master offset, journal ack) to confirm
        self.replid: str | None = None

    def reset(self) -> None:
        """A new connection, perhaps to a new master: offsets of the old one mean nothing there."""
        self.replicas, self.alone_since, self.pending, self.replid = self.required, None, None, None

    def wanted(self) -> int:
        """How many replicas the next ``WAIT`` asks for (0: no WAIT)."""
        return min(self.required, self.replicas)

    def _note(self, info: Mapping[str, Any]) -> tuple[int, list[int]]:
        """Master offset and online replicas' offsets from ``INFO replication``; follows the
        replica count; MasterChanged when the replication id is not the last one seen."""
        replid = str(info.get("master_replid", ""))
        if self.replid is not None and replid != self.replid:
            self.reset()
            raise MasterChanged("the Redis master changed (new replication id): sending unconfirmed events again")
        self.replid = replid
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, Mapping)]
        offsets = [int(r.get("offset", 0)) for r in replicas if r.get("state") == "online"]
        self.replicas = len(offsets)
        if self.replicas >= self.required:
            self.alone_since = None
        elif self.alone_since is None:
            self.alone_since = time.monotonic()
            log.warning("the Redis master lists %d replica(s), fewer than replica_acks=%d; events stay in the "
                        "journal for %.0f s in case it is a master being demoted", self.replicas, self.required,
                        self.grace_s)  # fmt: skip
        return int(info.get("master_repl_offset", 0)), offsets

    def _alone_long(self) -> bool:
        return self.alone_since is not None and time.monotonic() - self.alone_since >= self.grace_s

    def after_batch(self, wanted: int, acked: int, info: Mapping[str, Any], ack: tuple[int, int] | None) -> bool:
        """A batch went out with ``WAIT wanted`` answered by ``acked``, then ``INFO replication``:
        is it confirmed? If not, it is remembered for ``probe`` (a later confirmation covers it)."""
        offset, _ = self._note(info)
        if (wanted == self.required and acked >= wanted) or self._alone_long():
            self.pending = None
            return True
        if ack is not None:
            self.pending = (offset, ack)
        return False

    def probe(self, info: Mapping[str, Any]) -> tuple[int, int] | None:
        """While idle with an unconfirmed batch: the journal ack it reaches once ``INFO`` shows
        enough replicas past its offset (or the master has been alone long enough), else None."""
        if self.pending is None:
            return None
        _, offsets = self._note(info)
        offset, ack = self.pending
        if sum(o >= offset for o in offsets) >= self.required or self._alone_long():
            self.pending = None
            return ack
        return None
