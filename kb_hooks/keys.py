"""Redis key and channel names of the published events, for the publisher and for readers.

Two layouts. On a single Redis (plain URL or Sentinel) the names are the historical ones:
``{prefix}:call:{call_id}``, ``{prefix}:call:{call_id}:ids`` and one firehose
``{prefix}:events``. On Redis Cluster every key of a call must hash to one slot, together with
the firehose the same script appends to, so the keys gain a shard hash tag:
``{prefix}:{<n>}:call:{call_id}``, ``{prefix}:{<n>}:call:{call_id}:ids`` and the firehose is
``shards`` streams ``{prefix}:{<n>}:events``, n = CRC-32 of the UTF-8 call_id modulo ``shards``
(``zlib.crc32``). A prefix that carries its own hash tag (``{asr}``) puts everything in that
tag's slot instead (Redis uses the first ``{...}`` of a key). Pub/sub channels are the same in
both layouts.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


def live_channel(prefix: str, call_id: str | None = None) -> str:
    return f"{prefix}:live" if call_id is None else f"{prefix}:live:{call_id}"


@dataclass(frozen=True)
class KeyLayout:
    """``shards`` = 0: single-Redis names; > 0: Cluster names with that many firehose shards."""

    shards: int = 0

    def shard_of(self, call_id: str) -> int:
        return zlib.crc32(call_id.encode()) % self.shards if self.shards else 0

    def _head(self, prefix: str, call_id: str) -> str:
        return f"{prefix}:{{{self.shard_of(call_id)}}}" if self.shards else prefix

    def call_stream(self, prefix: str, call_id: str) -> str:
        return f"{self._head(prefix, call_id)}:call:{call_id}"

    def event_ids(self, prefix: str, call_id: str) -> str:
        """The set of event_ids a call's stream has received (for replay de-duplication)."""
        return f"{self._head(prefix, call_id)}:call:{call_id}:ids"

    def firehose_of(self, prefix: str, call_id: str) -> str:
        """The firehose (shard) that the events of ``call_id`` go to."""
        return f"{self._head(prefix, call_id)}:events"

    def firehoses(self, prefix: str) -> list[str]:
        """Every firehose stream a reader has to follow (one on a single Redis)."""
        if not self.shards:
            return [f"{prefix}:events"]
        return [f"{prefix}:{{{n}}}:events" for n in range(self.shards)]


SINGLE = KeyLayout()


def stream_key(prefix: str, call_id: str) -> str:
    """A call's stream on a single Redis."""
    return SINGLE.call_stream(prefix, call_id)


def event_ids_key(prefix: str, call_id: str) -> str:
    """A call's event-id set on a single Redis."""
    return SINGLE.event_ids(prefix, call_id)


def firehose_key(prefix: str) -> str:
    """The firehose on a single Redis."""
    return f"{prefix}:events"
