"""An event, in its JSON form, as the rows it adds to the archive (sans-IO: no database here).

Text is taken as published: the route has already redacted it (docs/events.md, *Redaction*), so
the archive never sees what the route hid. ``text_raw`` (the spoken form) is not kept: the
published ``text`` is what agents saw and what search finds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kb_hooks.events import EventType

DEFAULT_AGENT_ID_KEY = "X-Agent-Id"


@dataclass(frozen=True, slots=True)
class StartedRow:
    source: str
    source_call_id: str | None
    agent: str | None
    participants: str  # JSON list
    metadata: str  # JSON object


@dataclass(frozen=True, slots=True)
class EndedRow:
    reason: str | None
    stats: str  # JSON object


@dataclass(frozen=True, slots=True)
class FinalRow:
    role: str | None
    aor: str | None
    utterance_id: int | None
    text: str
    begin_ms: int | None
    end_ms: int | None


@dataclass(frozen=True, slots=True)
class KbRow:
    entry_id: str
    title: str | None
    status: str | None
    score: float | None
    utterance_id: int | None


@dataclass(frozen=True, slots=True)
class TagRow:
    kind: str  # demand, category, entity; "analytics" for a call.analytics category
    label: str
    value: str | None
    normalized: str | None


@dataclass(frozen=True, slots=True)
class WorkorderRow:
    kind: str  # "draft" (workorder.updated) or "confirmed"
    revision: int
    fields: str  # JSON object
    confirmed_by: str | None


@dataclass(slots=True)
class EventRows:
    event_id: str
    event_type: str
    call_id: str
    route: str | None
    ts: str
    started: StartedRow | None = None
    ended: EndedRow | None = None
    finals: list[FinalRow] = field(default_factory=list)
    kb_cards: list[KbRow] = field(default_factory=list)
    tags: list[TagRow] = field(default_factory=list)
    workorder: WorkorderRow | None = None
    analytics: str | None = None  # the call.analytics event's JSON


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rows_of(event: Mapping[str, Any], agent_id_key: str = DEFAULT_AGENT_ID_KEY) -> EventRows | None:
    """The rows of ``event``; None for what the archive does not keep (partials, key presses,
    an event without ``event_id`` or ``call_id``)."""
    event_id, call_id = event.get("event_id"), event.get("call_id")
    kind = event.get("event_type")
    if not isinstance(event_id, str) or not isinstance(call_id, str) or not isinstance(kind, str):
        return None
    if kind in (EventType.TRANSCRIPT_PARTIAL, EventType.DTMF) or event.get("is_partial") is True:
        return None
    rows = EventRows(event_id, kind, call_id, _text(event.get("route")), str(event.get("ts") or ""))
    participant = event.get("participant") or {}
    if kind == EventType.CALL_STARTED:
        metadata = event.get("metadata") or {}
        rows.started = StartedRow(
            source=str(event.get("source") or "sip"),  # events before `source` came are SIP calls
            source_call_id=_text(event.get("source_call_id", event.get("sip_call_id"))),
            agent=_text(metadata.get(agent_id_key)),
            participants=_json(event.get("participants") or []),
            metadata=_json(metadata),
        )
    elif kind == EventType.CALL_ENDED:
        rows.ended = EndedRow(_text(event.get("reason")), _json(event.get("stats") or {}))
    elif kind == EventType.TRANSCRIPT_FINAL:
        rows.finals.append(
            FinalRow(
                role=_text(participant.get("role")),
                aor=_text(participant.get("aor")),
                utterance_id=_int(event.get("utterance_id")),
                text=str(event.get("text") or ""),
                begin_ms=_int(event.get("begin_offset_ms")),
                end_ms=_int(event.get("end_offset_ms")),
            )
        )
    elif kind == EventType.KB_SUGGESTION:
        score = event.get("score")
        rows.kb_cards.append(
            KbRow(
                entry_id=str(event.get("entry_id") or ""),
                title=_text(event.get("title")),
                status=_text(event.get("status")),
                score=float(score) if isinstance(score, (int, float)) else None,
                utterance_id=_int(event.get("utterance_id")),
            )
        )
    elif kind == EventType.TAGS:
        for tag in event.get("tags") or []:
            rows.tags.append(
                TagRow(
                    str(tag.get("kind") or ""),
                    str(tag.get("label") or ""),
                    _text(tag.get("value")),
                    _text(tag.get("normalized")),
                )
            )
    elif kind in (EventType.WORKORDER_UPDATED, EventType.WORKORDER_CONFIRMED):
        confirmed = kind == EventType.WORKORDER_CONFIRMED
        rows.workorder = WorkorderRow(
            "confirmed" if confirmed else "draft",
            _int(event.get("revision")) or 0,
            _json(event.get("fields") or {}),
            _text(event.get("confirmed_by")) if confirmed else None,
        )
        address = (event.get("fields") or {}).get("address") or {}
        if address.get("value"):
            rows.tags.append(
                TagRow("workorder", "address", _text(address.get("value")), _text(address.get("normalized")))
            )
    elif kind == EventType.CALL_ANALYTICS:
        rows.analytics = _json(dict(event))
        for category in event.get("categories") or []:
            rows.tags.append(
                TagRow(
                    "analytics",
                    str(category.get("label") or category.get("id") or ""),
                    _text(category.get("phrase")),
                    None,
                )
            )
    return rows
