"""The work-order draft: streets normalized against a list, fillers dropped from the statement,
and ``workorder.updated`` as a call's finals fill the form in, each field with its events."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from asr_common.yamlconf import ConfigError
from kb_hooks import events as ev
from kb_hooks.config import KbHooksSettings
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, RedactionMode, TranscriptUpdate, WorkorderOptions
from kb_hooks.workorder import StreetList, drop_fillers, load_street_list

REPO = Path(__file__).resolve().parents[1]
CALLER = Participant("caller", "sip:caller@pbx.local")
AGENT = Participant("agent", "sip:1001@pbx.local")


def test_streets_are_normalized_exactly_by_homophone_or_one_character_off() -> None:
    streets = StreetList(["新华路", "中山东路", "和平路"])
    assert streets.normalize("新华路12号") == ("新华路12号", "新华路")
    assert streets.normalize("新花路12号") == ("新华路12号", "新华路")  # same toneless pinyin
    assert streets.normalize("中三东路8号") == ("中山东路8号", "中山东路")  # one character off
    assert streets.normalize("人民路3号") == ("人民路3号", None)


def test_a_listed_street_further_in_anchors_the_address() -> None:
    streets = StreetList(["新华路", "中山东路", "和平路"])
    assert streets.normalize("派人来看看和平路3号") == ("和平路3号", "和平路")
    assert streets.normalize("新花路12号和平路") == ("新华路12号和平路", "新华路")  # a street at the head wins
    assert streets.normalize("看看人民路3号") == ("看看人民路3号", None)


def test_a_street_list_is_a_phrase_file(tmp_path: Path) -> None:
    path = tmp_path / "streets.txt"
    path.write_text("# streets of the district\n新华路 :2.0\n\n中山东路\n", encoding="utf-8")
    assert load_street_list(path).streets == ("新华路", "中山东路")
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"streets\.txt: not UTF-8"):
        load_street_list(path)


def test_fillers_are_dropped_with_the_punctuation_they_leave() -> None:
    fillers = ("嗯", "那个", "就是")
    assert drop_fillers("嗯，那个，新华路的井盖就是坏了。", fillers) == "新华路的井盖坏了。"


def processor(tmp_path: Path) -> TranscriptProcessor:
    streets = tmp_path / "streets.txt"
    streets.write_text("新华路\n和平路\n", encoding="utf-8")
    settings = KbHooksSettings(
        kb_sets={"hotline": REPO / "deploy" / "config" / "kb.example.yaml"},
        tag_rule_sets={"demands": REPO / "deploy" / "config" / "tags.example.yaml"},
        street_lists={"district": streets},
    )
    return TranscriptProcessor.from_settings(settings)


def call(mode: RedactionMode) -> CallContext:
    return CallContext(
        "wo-1", None, "hotline", None, mode, "hotline", ("demands",), itn=True,
        workorder=WorkorderOptions(streets="district"),
    )  # fmt: skip


def final(ctx: CallContext, who: Participant, uid: int, text: str) -> TranscriptUpdate:
    return TranscriptUpdate(ctx, who, uid, False, text, (), 0, 100 * len(text))


def test_finals_fill_the_draft_in_and_each_field_names_its_events(tmp_path: Path) -> None:
    p = processor(tmp_path)
    ctx = call(RedactionMode.MASK)
    first = p.process(final(ctx, CALLER, 0, "嗯，那个新花路十二号的井盖坏了"))
    updated = [e for e in first if isinstance(e, ev.WorkorderUpdated)]
    assert len(updated) == 1 and first[-1] is updated[0]
    draft = updated[0]
    transcript = next(e for e in first if isinstance(e, ev.TranscriptFinal))
    tags = next(e for e in first if isinstance(e, ev.Tags))
    assert (draft.workorder_id, draft.revision) == ("wo-1", 1)
    assert draft.changed == ("category", "address", "statement", "kb_entry")
    fields, ids = draft.fields, (transcript.event_id, tags.event_id)
    assert fields.category == ev.DraftField("市政设施/井盖", None, ("井盖",), ids)
    assert fields.address == ev.DraftField("新花路12号", "新华路12号", ("新华路",), ids)
    assert fields.statement == ev.DraftField("新花路12号的井盖坏了", None, (), (transcript.event_id,))
    assert fields.contact is None and fields.time is None

    assert not [e for e in p.process(final(ctx, AGENT, 0, "好的")) if isinstance(e, ev.WorkorderUpdated)]

    second = p.process(final(ctx, CALLER, 1, "明天下午三点前修好，我电话是一三八一二三四五六七八"))
    draft = next(e for e in second if isinstance(e, ev.WorkorderUpdated))
    assert draft.revision == 2 and draft.changed == ("time", "contact", "statement")
    assert draft.fields.time is not None and draft.fields.time.value == "明天 下午3点"
    assert draft.fields.contact == ev.DraftField("*" * 11, None, (), draft.fields.contact.event_ids)  # type: ignore[union-attr]
    assert draft.fields.statement is not None
    assert draft.fields.statement.value == "新花路12号的井盖坏了明天下午3点前修好，我电话是***********"
    assert len(draft.fields.statement.event_ids) == 2
    jsonschema.validate({**draft.to_json(), "seq": 3}, ev.schema())


def test_the_contact_is_whole_only_where_the_route_keeps_numbers(tmp_path: Path) -> None:
    p = processor(tmp_path)
    events = p.process(final(call(RedactionMode.KEEP), CALLER, 0, "我的电话是13812345678"))
    draft = next(e for e in events if isinstance(e, ev.WorkorderUpdated))
    assert draft.fields.contact is not None
    assert (draft.fields.contact.value, draft.fields.contact.normalized) == ("13812345678", "13812345678")


def test_the_kb_entry_applied_is_the_confirmed_one(tmp_path: Path) -> None:
    p = processor(tmp_path)
    events = p.process(final(call(RedactionMode.MASK), CALLER, 0, "我今天发现新华路十二号井盖发生了破损"))
    suggestion = next(e for e in events if isinstance(e, ev.KbSuggestion))
    draft = next(e for e in events if isinstance(e, ev.WorkorderUpdated))
    assert draft.fields.kb_entry is not None
    assert (draft.fields.kb_entry.value, draft.fields.kb_entry.normalized) == (suggestion.title, suggestion.entry_id)
    assert draft.fields.kb_entry.event_ids == (suggestion.event_id,)


def test_routes_without_a_workorder_get_no_draft(tmp_path: Path) -> None:
    p = processor(tmp_path)
    plain = CallContext("c2", None, "hotline", None, RedactionMode.MASK, "hotline", ("demands",))
    assert not [e for e in p.process(final(plain, CALLER, 0, "新华路的井盖坏了")) if isinstance(e, ev.WorkorderUpdated)]


def test_the_agents_words_fill_only_the_kb_entry(tmp_path: Path) -> None:
    p = processor(tmp_path)
    ctx = call(RedactionMode.MASK)
    agent_said = p.process(final(ctx, AGENT, 0, "是和平路8号施工噪音吗，我的工号是13812345678"))
    assert [e.changed for e in agent_said if isinstance(e, ev.WorkorderUpdated)] == [("kb_entry",)]
    caller_said = p.process(final(ctx, CALLER, 0, "不是，是井盖坏了"))
    draft = next(e for e in caller_said if isinstance(e, ev.WorkorderUpdated))
    assert draft.fields.category is not None and draft.fields.category.value == "市政设施/井盖"
    assert draft.fields.address is None and draft.fields.contact is None
