"""The agent confirms a call's work order in the console: refused while the call goes on, then
``workorder.confirmed`` after the call's last event (next seq, in its stream, the firehose and
the call's live channel) with what the agent changed; CSRF and visibility as for every write.
Against a real redis-server, the events published by the real Publisher and processor."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis

from asr_gateway.config import load_config
from console.workorders import ConfirmError, confirmation
from kb_hooks import events as ev
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, RedactionMode, TranscriptUpdate, WorkorderOptions
from tests.console_helpers import MANHOLE, LivePublisher, login, running_console, write_configs
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]


@pytest.fixture()
def console(tmp_path: Path, redis_server: RedisServer) -> Iterator[tuple[str, Path]]:
    console_yaml = write_configs(tmp_path, redis_server.url)
    with running_console(console_yaml) as base:
        yield base, console_yaml.parent


def stored_events(url: str, key: str) -> list[dict[str, Any]]:
    """The events of a Redis stream, in order."""
    entries: Any = redis.Redis.from_url(url).xrange(key)
    return [json.loads(fields[b"event"]) for _, fields in entries]


def drafted_call(call_id: str, conf: Path) -> tuple[list[ev.Event], ev.CallEnded]:
    """A call with a work-order draft (the real processor, the example street list), and its end."""
    processor = TranscriptProcessor.from_settings(load_config(conf / "gateway.yaml").kb_hooks)
    ctx = CallContext(call_id, route="pbx-default", redaction=RedactionMode.MASK, kb_set="hotline",
                      tag_rules=("hotline",), workorder=WorkorderOptions(streets="hotline"))  # fmt: skip
    caller = Participant("caller", "sip:citizen@pbx")
    events: list[ev.Event] = [ev.CallStarted(call=ctx, participants=(caller,), metadata={"X-Agent-Id": "1001"})]
    events += processor.process(TranscriptUpdate(ctx, caller, 0, False, MANHOLE))
    return events, ev.CallEnded(call=ctx, reason="bye", stats={})


def test_an_agent_confirms_the_draft_after_the_call_with_what_was_changed(
    console: tuple[str, Path], redis_server: RedisServer, tmp_path: Path
) -> None:
    base, conf = console
    events, ended = drafted_call("wo-call", conf)
    draft = next(e for e in events if isinstance(e, ev.WorkorderUpdated))
    assert draft.fields.address is not None and draft.fields.address.normalized == "新华路12号"
    agent = login(base, "agent1")
    with LivePublisher(redis_server.url, tmp_path / "spool") as publisher:
        for event in events:
            publisher.submit(event)
        publisher.wait_published(len(events))
        url = "/api/calls/wo-call/workorder"
        edit = {"fields": {"time": "明天上午", "statement": draft.fields.statement.value}}  # type: ignore[union-attr]
        early = agent.post(url, json=edit)
        assert early.status_code == 409 and "has not ended" in early.json()["error"]
        publisher.submit(ended)
        publisher.wait_published(len(events) + 1)

    assert agent.post(url, json=edit, headers={"X-CSRF-Token": "wrong"}).status_code == 403
    assert login(base, "agent2").post(url, json=edit).status_code == 404  # another agent's call
    answer = agent.post(url, json=edit)
    assert answer.status_code == 200, answer.text
    wire = answer.json()["event"]
    jsonschema.validate(wire, ev.schema())
    assert wire["event_type"] == "workorder.confirmed" and wire["confirmed_by"] == "agent1"
    assert wire["seq"] == len(events) + 2 and wire["revision"] == draft.revision
    assert wire["changes"] == [{"field": "time", "draft": "今天", "confirmed": "明天上午"}]
    assert wire["fields"]["address"] == json.loads(json.dumps(draft.fields.address.to_json()))
    assert wire["fields"]["time"] == {"value": "明天上午", "normalized": None, "matched": [], "event_ids": []}

    stored = stored_events(redis_server.url, "asr:call:wo-call")
    assert [e["seq"] for e in stored] == list(range(1, len(events) + 3))
    assert stored[-1]["event_id"] == wire["event_id"]
    assert stored_events(redis_server.url, "asr:events")[-1]["event_type"] == "workorder.confirmed"
    shown = agent.get("/api/calls/wo-call").json()["events"]
    assert shown[-1]["event_type"] == "workorder.confirmed"
    assert agent.post(url, json={"fields": {"colour": "red"}}).status_code == 400


def test_a_confirmation_without_a_draft_records_every_field_as_changed() -> None:
    ctx = CallContext("c9", route="default")
    stored = [ev.CallStarted(call=ctx, participants=(), metadata={}).to_json(),
              ev.CallEnded(call=ctx, reason="bye", stats={}).to_json()]  # fmt: skip
    event = confirmation(stored, {"category": "供水/停水", "address": " "}, "agent1")
    assert (event.revision, event.workorder_id, event.call_id) == (0, "c9", "c9")
    assert event.changes == (ev.FieldChange("category", None, "供水/停水"),)
    assert event.fields.address is None
    with pytest.raises(ConfirmError, match="has not ended"):
        confirmation(stored[:1], {}, "agent1")


def test_admins_edit_the_analytics_rules_and_the_street_list_like_the_tag_rules(console: tuple[str, Path]) -> None:
    base, conf = console
    admin = login(base, "admin")
    keys = [f["key"] for f in admin.get("/api/admin/files").json()["files"]]
    assert "analytics:hotline" in keys and "streets:hotline" in keys
    broken = "checks:\n  - id: hello\n    kind: greeting\n    phrases: []\n"
    answer = admin.post("/api/admin/validate", json={"key": "analytics:hotline", "content": broken}).json()
    assert not answer["ok"] and answer["errors"][0].startswith(f"{conf / 'analytics.yaml'}:4 checks.0.phrases:")
    fine = admin.post("/api/admin/validate", json={"key": "streets:hotline", "content": "新华路\n"}).json()
    assert fine == {"ok": True, "errors": []}
