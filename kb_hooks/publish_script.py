"""The Redis script that publishes a batch of events, and how a batch is packed into its calls.

Per event the script (atomic on the server) does ``SADD {prefix}:call:{call_id}:ids
<event_id>``, ``XADD {prefix}:call:{call_id}`` with an explicit ID ``<ms>-<seq>``, ``XADD
{prefix}:events``, ``PUBLISH`` to ``{prefix}:live:{call_id}`` and ``{prefix}:live``, and the
TTLs. An event_id already in the set (a retry, or a replay after a crash) is a no-op: the set
(same lifetime as the call stream) makes a replay idempotent even when the stream entry was
trimmed, and the explicit stream id refuses what predates the set. Partials go to pub/sub only
unless ``partials_to_stream``.

A batch is one script call on a single Redis; on a Cluster one per firehose shard, so that each
call touches a single slot (``kb_hooks.keys``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kb_hooks.config import RedisSettings
from kb_hooks.events import EventType
from kb_hooks.keys import KeyLayout, live_channel

# KEYS: the call streams, firehoses and event-id sets of the batch. ARGV: call maxlen, firehose
# maxlen, orphan ttl, then per event 12 fields: mode ('s' stream and pub/sub, 'n' stream only,
# 'p' pub/sub only), call key index, firehose key index, event-id set key index ('0' = none:
# partials), event_id, stream id, json, type, ttl when ended ('0' = none), call channel, all
# channel, call_id. Result per event: ADDED, ALREADY_THERE (a retry or a replay), or the error text.
PUBLISH_LUA = """
local call_maxlen, fire_maxlen, orphan_ttl = ARGV[1], ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV, 12 do
  local mode, ck, fk = ARGV[i], KEYS[tonumber(ARGV[i + 1])], KEYS[tonumber(ARGV[i + 2])]
  local ik = ARGV[i + 3] ~= '0' and KEYS[tonumber(ARGV[i + 3])] or nil
  local id, payload, kind, ttl = ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8]
  local result = 1
  if mode ~= 'p' then
    if ik and redis.call('SADD', ik, ARGV[i + 4]) == 0 then
      result = 0
    else
      local added = redis.pcall('XADD', ck, 'MAXLEN', '~', call_maxlen, id, 'type', kind, 'event', payload)
      if type(added) == 'table' and added.err then
        if string.find(added.err, 'equal or smaller', 1, true) then
          result = 0
        else
          result = added.err
          if ik then redis.call('SREM', ik, ARGV[i + 4]) end
        end
      else
        local fire = redis.pcall('XADD', fk, 'MAXLEN', '~', fire_maxlen, '*', 'type', kind,
                                 'call_id', ARGV[i + 11], 'event', payload)
        if type(fire) == 'table' and fire.err then result = fire.err end
      end
    end
    if ttl ~= '0' then
      redis.call('EXPIRE', ck, ttl)
      if ik then redis.call('EXPIRE', ik, ttl) end
    else
      if redis.call('TTL', ck) == -1 then redis.call('EXPIRE', ck, orphan_ttl) end
      if ik and redis.call('TTL', ik) == -1 then redis.call('EXPIRE', ik, orphan_ttl) end
    end
  end
  if result == 1 and mode ~= 'n' then
    redis.call('PUBLISH', ARGV[i + 9], payload)
    redis.call('PUBLISH', ARGV[i + 10], payload)
  end
  out[#out + 1] = result
end
return out
"""
ADDED = 1
ALREADY_THERE = 0


class Outgoing(Protocol):
    """What packing reads of one queued event."""

    @property
    def call_id(self) -> str: ...

    @property
    def event_type(self) -> str: ...

    @property
    def event_id(self) -> str: ...

    @property
    def partial(self) -> bool: ...

    @property
    def prefix(self) -> str: ...

    @property
    def stream_id(self) -> str: ...

    def payload(self) -> str:
        """The event's JSON."""
        ...


@dataclass(frozen=True)
class ScriptCall:
    """One script call: its keys, its arguments, and the batch positions of its events in order
    (the script's results come back in that order)."""

    keys: list[str]
    args: list[str | int]
    members: list[int]


def _mode(partial: bool, settings: RedisSettings) -> Literal["s", "n", "p"] | None:
    """Where an event goes: stream and pub/sub, stream only, pub/sub only, or nowhere (None)."""
    if partial and not settings.partials_to_stream:
        return "p" if settings.partials_to_pubsub else None
    return "s" if settings.partials_to_pubsub or not partial else "n"


def pack(batch: Sequence[Outgoing], settings: RedisSettings, layout: KeyLayout) -> list[ScriptCall]:
    """The script calls that publish ``batch``; partials that go nowhere are in none of them."""
    s = settings
    groups: dict[str, tuple[dict[str, int], list[str | int], list[int]]] = {}  # keys -> KEYS index, argv, members
    for index, item in enumerate(batch):
        mode = _mode(item.partial, s)
        if mode is None:
            continue
        call_id, kind = item.call_id, item.event_type
        fire = layout.firehose_of(item.prefix, call_id)
        keys, args, members = groups.setdefault(
            fire if layout.shards else "", ({}, [s.stream_maxlen, s.firehose_maxlen, s.orphan_ttl_s], [])
        )
        call_key = keys.setdefault(layout.call_stream(item.prefix, call_id), len(keys) + 1)
        fire_key = keys.setdefault(fire, len(keys) + 1)
        ids_key = 0 if item.partial else keys.setdefault(layout.event_ids(item.prefix, call_id), len(keys) + 1)
        args += [mode, call_key, fire_key, ids_key, item.event_id, item.stream_id, item.payload(), kind,
                 s.call_ttl_s if kind == EventType.CALL_ENDED else 0,
                 live_channel(item.prefix, call_id), live_channel(item.prefix), call_id]  # fmt: skip
        members.append(index)
    return [ScriptCall(list(keys), args, members) for keys, args, members in groups.values()]
