"""The lines of the publisher's journal, which ``kb_hooks.spool`` stores.

An event record is ``{"id": <stream id>, "prefix": <key prefix>, "event": {...}}``, the event's
JSON spliced in as it was serialized once for the Redis script too. A checkpoint record is
``{"checkpoint": {...}}``: the calls still open in the part a compaction dropped
(``kb_hooks.ledger``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kb_hooks.ledger import CHECKPOINT_KEY


@dataclass(frozen=True)
class EventRecord:
    stream_id: str
    prefix: str
    event: dict[str, Any]


# One encoder for every event: ``json.dumps`` with options builds a new one per call, and events
# are trees made by ``to_json`` (no cycles to look for). The text is ``json.dumps(event,
# ensure_ascii=False)``'s.
_EVENT_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False)


def event_payload(event: Mapping[str, Any]) -> str:
    """An event's JSON text as the journal and the Redis script carry it (encoded once per event)."""
    return _EVENT_ENCODER.encode(event)


def event_line(stream_id: str, prefix: str, payload: str) -> str:
    """The journal line of an event whose JSON is ``payload``."""
    head = json.dumps({"id": stream_id, "prefix": prefix}, ensure_ascii=False)
    return f'{head[:-1]}, "event": {payload}}}'


def parse_line(line: str) -> EventRecord | dict[str, Any]:
    """An event record, or a checkpoint's contents; ValueError for a line that is neither."""
    try:
        record = json.loads(line)
        if CHECKPOINT_KEY in record:
            checkpoint: dict[str, Any] = record[CHECKPOINT_KEY]
            return checkpoint
        return EventRecord(record["id"], record["prefix"], record["event"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a journal record: {exc!r}") from None
