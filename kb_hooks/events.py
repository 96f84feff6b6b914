"""Event envelope v1: builders for every event type and the packaged JSON Schema.

Every event is one flat JSON object: the envelope (``schema_version``, ``event_type``,
``event_id``, ``seq``, ``ts``, ``call_id``, ``sip_call_id``, ``route``, ``participant``) plus the
fields of its type. ``seq`` is stamped by the Publisher when the event is submitted, so it
follows publish order per call. docs/events.md describes every field.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any, Literal

from kb_hooks.types import CallContext, Participant, RedactionMode

SCHEMA_VERSION = "1"
EventType = Literal[
    "call.started", "transcript.partial", "transcript.final", "kb.suggestion", "tags", "call.ended", "dtmf"
]
EVENT_TYPES: tuple[EventType, ...] = (
    "call.started",
    "transcript.partial",
    "transcript.final",
    "kb.suggestion",
    "tags",
    "call.ended",
    "dtmf",
)
Event = dict[str, Any]


def utc_timestamp(moment: datetime | None = None) -> str:
    """ISO-8601 UTC with milliseconds, e.g. ``2024-05-01T08:30:00.123Z``."""
    moment = moment or datetime.now(UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def envelope(event_type: EventType, ctx: CallContext, participant: Participant | None) -> Event:
    """The common fields; ``seq`` is added by the Publisher."""
    return {
        "schema_version": SCHEMA_VERSION,
        "event_type": event_type,
        "event_id": uuid.uuid4().hex,
        "ts": utc_timestamp(),
        "call_id": ctx.call_id,
        "sip_call_id": ctx.sip_call_id,
        "route": ctx.route,
        "participant": participant.to_json() if participant is not None else None,
    }


def call_started(
    ctx: CallContext, participants: Iterable[Participant], metadata: Mapping[str, str] | None = None
) -> Event:
    event = envelope("call.started", ctx, None)
    event["participants"] = [p.to_json() for p in participants]
    event["metadata"] = dict(metadata or {})
    return event


def call_ended(ctx: CallContext, reason: str, stats: Mapping[str, Any] | None = None) -> Event:
    event = envelope("call.ended", ctx, None)
    event["reason"] = reason
    event["stats"] = dict(stats or {})
    return event


def dtmf(ctx: CallContext, participant: Participant, key: str, index: int, duration_ms: int) -> Event:
    """One RFC 4733 key press of ``participant``. The key is published only where the call's
    redaction is ``keep``: callers key in ID and card numbers, and a keyed hash of one of
    sixteen keys would hide nothing, so ``hash`` masks like ``mask``."""
    event = envelope("dtmf", ctx, participant)
    shown = ctx.redaction is RedactionMode.KEEP
    event["digit"] = key if shown else None
    event["redacted"] = not shown
    event["index"] = index
    event["duration_ms"] = duration_ms
    return event


def is_partial(event: Mapping[str, Any]) -> bool:
    return event.get("event_type") == "transcript.partial"


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of event v1, shipped inside the package."""
    text = resources.files("kb_hooks").joinpath("schema/event-v1.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded
