"""TranscriptProcessor -> events: schema v1 for every type, suggestions' lifecycle, tags, redaction."""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kb_hooks import events as ev
from kb_hooks.config import KbHooksSettings
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, RedactionMode, TranscriptUpdate, WorkorderOptions

REPO = Path(__file__).resolve().parents[1]
SEED = "我今天发现新华路十二号井盖发生了破损，有安全隐患"
CALLER = Participant("caller", "sip:caller@pbx.local", None)
_seq = itertools.count(1)


@pytest.fixture
def processor() -> TranscriptProcessor:
    settings = KbHooksSettings(
        kb_sets={"hotline": REPO / "deploy" / "config" / "kb.example.yaml"},
        tag_rule_sets={"demands": REPO / "deploy" / "config" / "tags.example.yaml"},
    )
    return TranscriptProcessor.from_settings(settings)


def ctx(mode: RedactionMode = RedactionMode.MASK, call_id: str = "call-1") -> CallContext:
    return CallContext(call_id, "a84b4c76e66710@pbx.local", "hotline", None, mode, "hotline", ("demands",))


def update(text: str, partial: bool, utterance_id: int = 0, call: CallContext | None = None) -> TranscriptUpdate:
    tokens = tuple((ch, 100 * i, 100 * i + 80) for i, ch in enumerate(text))
    return TranscriptUpdate(call or ctx(), CALLER, utterance_id, partial, text, tokens, 0, 100 * len(text),
                            0.91, () if partial else ((text, -1.2), (text[:-1], -3.4)), 35.0)  # fmt: skip


def json_of(events: list[ev.Event]) -> list[dict[str, Any]]:
    """The events' JSON as published: the Publisher stamps ``seq``."""
    return [{**event.to_json(), "seq": next(_seq)} for event in events]


def validated(events: list[ev.Event]) -> list[dict[str, Any]]:
    wire = json_of(events)
    for event in wire:
        jsonschema.validate(event, ev.schema())
    return wire


def test_every_event_type_matches_the_schema(processor: TranscriptProcessor) -> None:
    call = ctx()
    agent = Participant("agent", "sip:1001@pbx.local", "agent-1001")
    typed: list[ev.Event] = [ev.CallStarted(call=call, participants=(CALLER, agent), metadata={})]
    typed += processor.process(update("我今天发现新华路", True))
    typed += processor.process(update(SEED, False, call=replace(call, workorder=WorkorderOptions())))
    typed.append(ev.Dtmf.press(call, CALLER, "#", 0, 120))
    draft = next(e for e in typed if isinstance(e, ev.WorkorderUpdated))
    category = ev.DraftField("市政设施/路灯", None, (), ())
    typed.append(
        ev.WorkorderConfirmed(
            call=call, workorder_id=draft.workorder_id, revision=draft.revision, confirmed_by="agent-1001",
            fields=replace(draft.fields, category=category),
            changes=(ev.FieldChange("category", "市政设施/井盖", "市政设施/路灯"),),
        )
    )  # fmt: skip
    analytics = processor.call_analytics(replace(call, analytics_rules="hotline"), 61_000)
    assert analytics is not None
    typed.append(analytics)
    typed.append(ev.CallEnded(call=call, reason="bye", stats={"duration_ms": 61_000, "utterances": 1}))
    events = validated(typed)
    assert {e["event_type"] for e in events} == set(ev.EventType)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**events[1], "participant": {"role": "boss", "aor": None, "label": None}}, ev.schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**events[1], "is_partial": False}, ev.schema())


def test_seed_example_end_to_end(processor: TranscriptProcessor) -> None:
    events = validated(processor.process(update(SEED, False)))
    final, suggestion, tags = events
    assert final["event_type"] == "transcript.final" and final["text"] == SEED
    assert final["tokens"][0] == {"text": "我", "begin_ms": 0, "end_ms": 80}
    assert suggestion["title"] == "井盖破损应急处置流程"
    assert (suggestion["status"], suggestion["matched_text"]) == ("confirmed", "井盖发生了破损")
    found = {(t["kind"], t["label"], t["value"]) for t in tags["tags"]}
    assert ("demand", "市政设施/井盖", "井盖") in found
    assert ("entity", "address", "新华路十二号") in found
    address = next(t for t in tags["tags"] if t["label"] == "address")
    assert SEED[address["span"]["begin"] : address["span"]["end"]] == "新华路十二号"


def test_partial_suggestion_confirmed_or_withdrawn_by_the_final(processor: TranscriptProcessor) -> None:
    first = json_of(processor.process(update("警盖破损", True, 0)))
    assert [(e["status"], e["homophone"]) for e in first if e["event_type"] == "kb.suggestion"] == [("suggested", True)]
    assert not [
        e for e in json_of(processor.process(update("警盖破损了", True, 0))) if e["event_type"] == "kb.suggestion"
    ]
    repeated = json_of(processor.process(update("警盖破损了", True, 0)))
    assert [e["event_type"] for e in repeated] == ["transcript.partial"] and repeated[0]["text"] == "警盖破损了"
    confirmed = [
        e for e in json_of(processor.process(update("井盖破损了", False, 0))) if e["event_type"] == "kb.suggestion"
    ]
    assert [(e["status"], e["score"]) for e in confirmed] == [("confirmed", 1.0)]
    again = json_of(processor.process(update("井盖破损了", False, 1)))
    assert not [e for e in again if e["event_type"] == "kb.suggestion"]  # once per call

    processor.process(update("路灯不亮", True, 2))
    final = processor.process(update("路上有灯", False, 2))
    withdrawn = validated([e for e in final if isinstance(e, ev.KbSuggestion)])
    assert [(e["entry_id"], e["status"]) for e in withdrawn] == [("kb-streetlight", "withdrawn")]
    processor.end_call("call-1")
    assert processor.active_calls() == 0


def test_tags_once_per_call_and_only_on_finals(processor: TranscriptProcessor) -> None:
    assert [e["event_type"] for e in json_of(processor.process(update("井盖坏了", True)))] == [
        "transcript.partial", "kb.suggestion"]  # fmt: skip
    assert any(e["event_type"] == "tags" for e in json_of(processor.process(update("井盖坏了", False))))
    assert not any(e["event_type"] == "tags" for e in json_of(processor.process(update("井盖坏了", False, 1))))


@pytest.mark.parametrize("mode", list(RedactionMode))
def test_redaction_per_route(processor: TranscriptProcessor, mode: RedactionMode) -> None:
    text = "我的电话是幺三八零零一三八零零零"
    final, tags = validated(processor.process(update(text, False, call=ctx(mode))))
    phone = next(t for t in tags["tags"] if t["label"] == "phone")
    if mode is RedactionMode.KEEP:
        assert final["text"] == text and phone["normalized"] == "13800138000" and not phone["redacted"]
    else:
        assert "幺三八" not in final["text"] and "13800138000" not in str(final)
        assert phone["redacted"] and phone["normalized"] is None
        assert final["text"][phone["span"]["begin"] : phone["span"]["end"]] == phone["value"]
        assert all("三" not in t["text"] for t in final["tokens"][5:])
        assert "幺三八" not in final["nbest"][0]["text"]


def test_dtmf_key_is_published_only_where_redaction_is_keep() -> None:
    shown = ev.Dtmf.press(ctx(RedactionMode.KEEP), CALLER, "7", 3, 100)
    assert (shown.digit, shown.redacted, shown.index, shown.duration_ms) == ("7", False, 3, 100)
    for mode in (RedactionMode.MASK, RedactionMode.HASH):
        hidden = ev.Dtmf.press(ctx(mode), CALLER, "7", 3, 100)
        assert (hidden.digit, hidden.redacted) == (None, True)
    validated([shown, hidden])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**json_of([shown])[0], "digit": "77"}, ev.schema())


def _old_utc_timestamp(moment: datetime) -> str:
    """How ``ts`` was written before the per-second cache: strftime of the moment, ms truncated."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def test_timestamps_are_written_as_before_across_seconds_days_and_years() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    starts = [int((datetime(2026, 12, 31, 23, 59, 58, tzinfo=UTC) - epoch).total_seconds() * 1000), 1_700_000_000_999]
    rng = random.Random(3)
    starts += [rng.randrange(0, 4_000_000_000_000) for _ in range(50)]
    for start in starts:
        for unix_ms in range(start, start + 2_500, 7):  # crosses a second or two: the cached text must follow
            assert ev.utc_timestamp_ms(unix_ms) == _old_utc_timestamp(epoch + timedelta(milliseconds=unix_ms))


def test_now_is_a_schema_timestamp_between_its_neighbours() -> None:
    before = _old_utc_timestamp(datetime.now(UTC))
    now = ev.utc_timestamp()
    after = _old_utc_timestamp(datetime.now(UTC))
    assert before <= now <= after
    assert re.fullmatch(ev.schema()["properties"]["ts"]["pattern"], now)
