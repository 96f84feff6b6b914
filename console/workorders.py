"""The agent's confirmation of a call's work-order draft: ``workorder.confirmed`` into the call's stream.

The gateway numbers a call's events (``seq``) and stream entries (``<ms>-<seq>``) until
``call.ended`` and publishes nothing of the call after it. So a work order is confirmed once its
call has ended: the draft is complete then, and the console appends its event after the call's
last one (the next ``seq``, an entry id after the last) with the gateway's own publishing script
(``kb_hooks.publish_script``): the call stream, the firehose, the event-id set and the pub/sub
channels, so every reader (the console's feeds, ``asr-gateway tail``, consumer groups) sees it
like any other event. The changes the agent made against the draft are the draft's accuracy
measure (docs/workorder.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from calls.profile import Profile
from calls.routing import load_routes
from console.feeds import stream_id_key
from console.webhooks import Delivery
from kb_hooks.config import RedisSettings
from kb_hooks.events import DraftField, EventType, FieldChange, WorkorderConfirmed, WorkorderFields
from kb_hooks.keys import KeyLayout
from kb_hooks.publish_script import ADDED, ALREADY_THERE, PUBLISH_LUA, pack
from kb_hooks.types import CallContext
from kb_hooks.workorder import FIELD_NAMES

MAX_FIELD_CHARS = 4000
_SHOWN_NORMALIZED = frozenset({"address", "time"})


class ConfirmError(Exception):
    """A confirmation that cannot be taken; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _draft_field(value: Any) -> DraftField | None:
    if not isinstance(value, Mapping):
        return None
    return DraftField(
        str(value.get("value", "")),
        value.get("normalized") if isinstance(value.get("normalized"), str) else None,
        tuple(str(m) for m in value.get("matched") or ()),
        tuple(str(i) for i in value.get("event_ids") or ()),
    )


def form_value(name: str, drafted: DraftField | None) -> str | None:
    """What the form shows of a drafted field: the address and the time normalized, the rest as
    published (static/console.js shows the same)."""
    if drafted is None:
        return None
    if name in _SHOWN_NORMALIZED and drafted.normalized:
        return drafted.normalized
    return drafted.value


def _submitted(fields: Mapping[str, Any]) -> dict[str, str | None]:
    """The form's values by field name; an empty one is None. ConfirmError for unknown names."""
    unknown = sorted(set(fields) - set(FIELD_NAMES))
    if unknown:
        raise ConfirmError(400, f"unknown work-order fields {', '.join(unknown)}; known: {', '.join(FIELD_NAMES)}")
    out: dict[str, str | None] = {}
    for name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise ConfirmError(400, f"field {name} must be a string or null")
        text = (value or "").strip()[:MAX_FIELD_CHARS]
        out[name] = text or None
    return out


def confirmation(stored: Sequence[Mapping[str, Any]], fields: Mapping[str, Any], user: str) -> WorkorderConfirmed:
    """The ``workorder.confirmed`` of a call whose stored events are ``stored``, the agent
    having submitted ``fields`` (name -> value; a field left out keeps the draft's value)."""
    started = next((e for e in stored if e.get("event_type") == EventType.CALL_STARTED), None)
    if not any(e.get("event_type") == EventType.CALL_ENDED for e in stored):
        raise ConfirmError(409, "the call has not ended: confirm the work order once it has (its draft is complete)")
    submitted = _submitted(fields)
    drafts = [e for e in stored if e.get("event_type") == EventType.WORKORDER_UPDATED]
    last = drafts[-1] if drafts else {}
    draft_fields = last.get("fields") or {}
    confirmed: dict[str, DraftField | None] = {}
    changes: list[FieldChange] = []
    for name in FIELD_NAMES:
        drafted = _draft_field(draft_fields.get(name))
        was = form_value(name, drafted)
        now = submitted.get(name, was)
        if now == was:
            confirmed[name] = drafted
            continue
        confirmed[name] = DraftField(now, None, (), ()) if now is not None else None
        changes.append(FieldChange(name, was, now))
    source = started or (stored[0] if stored else {})
    source_call_id = source.get("source_call_id", source.get("sip_call_id"))  # events written before it: the latter
    call = CallContext(str(source.get("call_id")), source_call_id, source.get("route"))
    return WorkorderConfirmed(
        call=call,
        workorder_id=str(last.get("workorder_id") or call.call_id),
        revision=int(last.get("revision") or 0),
        confirmed_by=user,
        fields=WorkorderFields(**confirmed),
        changes=tuple(changes),
    )


def route_profile(routes: Path | None, route: str | None) -> Profile | None:
    """The profile that took a call of ``route`` (an event's ``route``: a route's name, None for
    the default profile) in the routes file in force; None when it has none."""
    router = load_routes(routes) if routes is not None else None
    if router is None:
        return None
    by_name = {r.name: r.profile for r in router.routes.routes}
    name = by_name.get(route) if route is not None else router.routes.default_profile
    return router.routes.profiles.get(name) if name is not None else None


def webhook_delivery(profile: Profile | None, wire: Mapping[str, Any]) -> Delivery | None:
    """The ticket-system delivery of a published ``workorder.confirmed`` where the profile has a webhook."""
    section = profile.workorder if profile is not None else None
    if section is None or section.webhook_url is None:
        return None
    body = json.dumps(wire, ensure_ascii=False, separators=(",", ":"))
    return Delivery(str(wire["event_id"]), str(wire["workorder_id"]), section.webhook_url, section.webhook_secret_env,
                    body)  # fmt: skip


@dataclass(frozen=True)
class _Appended:
    """One event for ``kb_hooks.publish_script.pack``."""

    call_id: str
    event_type: str
    event_id: str
    prefix: str
    stream_id: str
    wire: str
    partial: bool = False

    def payload(self) -> str:
        return self.wire


async def append_after(
    client: aioredis.Redis,
    settings: RedisSettings,
    layout: KeyLayout,
    prefix: str,
    stored: Sequence[tuple[str, Mapping[str, Any]]],
    event: WorkorderConfirmed,
) -> dict[str, Any]:
    """Publish ``event`` after the call's last stored entry; returns its JSON (with ``seq``)."""
    last_ms, last_seq = stream_id_key(stored[-1][0]) if stored else (0, 0)
    seq = max([last_seq, *(int(e.get("seq") or 0) for _, e in stored)]) + 1
    ms = max(time.time_ns() // 1_000_000, last_ms)
    wire = {**event.to_json(), "seq": seq}
    item = _Appended(event.call_id, event.event_type.value, event.event_id, prefix, f"{ms}-{seq}",
                     json.dumps(wire, ensure_ascii=False, separators=(",", ":")))  # fmt: skip
    (call,) = pack([item], settings, layout)
    reply: Any = await client.eval(PUBLISH_LUA, len(call.keys), *call.keys, *call.args)
    result = reply[0] if isinstance(reply, list) and reply else reply
    if result not in (ADDED, ALREADY_THERE):
        raise ConfirmError(503, f"Redis refused the work order: {result!r}")
    return wire
