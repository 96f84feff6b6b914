"""call.analytics: talk, silence, overlaps and speaking rate from constructed finals with known
times (exact numbers), the rules file's checks and categories, its file:line errors, the
processor's event, and one call through the bridge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from asr_common.yamlconf import ConfigError
from asr_core.events import Ended, Final
from asr_gateway.bridge import CallBridge
from calls.call import CallInfo, LegInfo
from calls.profile import Profile
from kb_hooks import events as ev
from kb_hooks.analytics import PAUSE_MS, TOKEN_MS, AnalyzedFinal, measure, merge
from kb_hooks.analytics_rules import load_analytics_rules
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.redact import Redactor
from kb_hooks.reload import ReloadableRef
from kb_hooks.types import CallContext, Participant, ParticipantRole, TranscriptUpdate
from tests.bridge_fakes import FakeEngine, RecordingPublisher

RULES = """\
version: 1
checks:
  - id: greeting
    kind: greeting
    phrases: [您好, 你好]
    within_s: 5
  - id: address_read_back
    kind: address_read_back
  - id: closing
    kind: closing
    phrases: [再见, 感谢您的来电]
    last_s: 10
  - id: polite
    kind: forbidden_words
    party: agent
    words: [不知道, 不归我们管]
categories:
  - id: supervisor
    kind: phrases
    label: 要求找领导
    party: caller
    phrases: [找你们领导, 你们主管]
  - id: repeat
    kind: repeat_address
    label: 同一地址重复来电
    within_h: 24
"""


def said(
    role: ParticipantRole, uid: int, text: str, begin: int, end: int, addresses: tuple[str, ...] = ()
) -> AnalyzedFinal:
    """An utterance whose characters evenly fill [begin, end) ms, each token's end known."""
    step = (end - begin) // len(text)
    tokens = tuple((ch, begin + i * step, begin + (i + 1) * step) for i, ch in enumerate(text))
    return AnalyzedFinal(role, uid, text, len(text), begin, end, tokens, addresses)


# -- timing -------------------------------------------------------------------------------


def test_talk_silence_and_overlap_of_a_constructed_call_are_exact() -> None:
    utterances = [
        said("agent", 0, "您好请讲", 1_000, 3_000),  # agent 1.0-3.0 s
        said("caller", 0, "井盖坏了在新华路十二号", 3_500, 9_000),  # caller 3.5-9.0 s (11 chars, 500 ms each)
        said("agent", 1, "好的", 8_000, 9_000),  # agent cuts in at 8.0 s: 1000 ms overlap
        said("caller", 1, "对", 12_000, 12_400),  # caller 12.0-12.4 s
    ]
    m = measure(utterances, duration_ms=15_000)
    assert m.duration_ms == 15_000
    assert m.talk_ms == {"agent": 3_000, "caller": 5_900}
    # talk of anyone: 1.0-3.0, 3.5-9.0, 12.0-12.4 = 2000 + 5500 + 400 ms
    assert m.non_talk_ms == 15_000 - 7_900
    assert (m.overlap.count, m.overlap.total_ms) == (1, 1_000)
    assert m.overlap.interruptions == (ev.Interruption("agent", "caller", 1, 1_000),)
    assert m.speaking_rate == {"agent": round(6 * 60_000 / 3_000, 1), "caller": round(12 * 60_000 / 5_900, 1)}


def test_the_caller_interrupting_the_agent_and_both_starting_at_once() -> None:
    utterances = [
        said("agent", 0, "请您提供地址", 0, 6_000),
        said("caller", 0, "新华路", 4_500, 6_000),  # inside the agent's talk: the caller interrupted
        said("agent", 1, "好", 10_000, 10_500),
        said("caller", 1, "好", 10_000, 10_500),  # at once: counted as the caller's
    ]
    m = measure(utterances, duration_ms=11_000)
    assert m.overlap.count == 2 and m.overlap.total_ms == 1_500 + 500
    assert m.overlap.interruptions == (ev.Interruption("caller", "agent", 2, 2_000),)


def test_talking_at_once_across_a_short_pause_is_one_overlap() -> None:
    utterances = [
        said("caller", 0, "井盖坏了很久了", 0, 7_000),
        said("agent", 0, "好的", 3_000, 4_000),  # the agent cuts in at 3 s ...
        said("agent", 1, "我记下", 4_600, 5_500),  # ... pauses 600 ms (under TURN_GAP_MS) and goes on
        said("agent", 2, "还有吗", 9_000, 9_600),  # a new turn, after the caller stopped
    ]
    m = measure(utterances, duration_ms=10_000)
    assert (m.overlap.count, m.overlap.total_ms) == (1, 1_000 + 900)
    assert m.overlap.interruptions == (ev.Interruption("agent", "caller", 1, 1_900),)
    assert m.talk_ms["agent"] == 1_000 + 900 + 600  # the pause is not talk


def test_tokens_with_peak_times_only_are_heard_over_token_ms_before_each_peak() -> None:
    # CTC peaks only (what the engine gives): 300, 500, 700 ms, then a pause, then 2000 ms.
    tokens = (("井", 300, None), ("盖", 500, None), ("坏", 700, None), ("了", 2_000, None))
    u = AnalyzedFinal("caller", 0, "井盖坏了", 4, 0, 2_500, tokens)
    assert u.talk == [(300 - TOKEN_MS, 700), (2_000 - TOKEN_MS, 2_000)]
    untimed = AnalyzedFinal("caller", 1, "好", 1, 3_000, 3_600, (("好", None, None),))
    assert untimed.talk == [(3_000, 3_600)]


def test_a_pause_under_pause_ms_between_peaks_is_talk_and_nothing_is_heard_before_the_utterance() -> None:
    gap = TOKEN_MS + PAUSE_MS - 40  # peaks this far apart: a pause of PAUSE_MS - 40 ms between their spans
    tokens = (("我", 100, None), ("们", 100 + gap, None), ("好", 100 + 2 * gap + 40, None))
    u = AnalyzedFinal("caller", 0, "我们好", 3, 50, 2_000, tokens)
    assert u.talk == [(50, 100 + gap), (100 + 2 * gap + 40 - TOKEN_MS, 100 + 2 * gap + 40)]


def test_merge_joins_touching_and_overlapping_intervals() -> None:
    assert merge([(5, 7), (0, 2), (2, 3), (6, 9)]) == [(0, 3), (5, 9)]


def test_a_call_where_nobody_spoke_is_all_non_talk() -> None:
    m = measure([], duration_ms=4_000)
    assert (m.talk_ms, m.non_talk_ms, m.overlap.count, m.speaking_rate) == ({}, 4_000, 0, {})


# -- rules --------------------------------------------------------------------------------


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "analytics.yaml"
    path.write_text(RULES, encoding="utf-8")
    return path


def call_utterances() -> list[AnalyzedFinal]:
    return [
        said("agent", 0, "您好请讲", 1_000, 3_000),
        said("caller", 0, "新华路12号的井盖坏了", 3_500, 9_000, ("新华路12号",)),
        said("agent", 1, "好的新华路12号我记下了", 9_500, 12_000),
        said("caller", 1, "再不修我就找你们领导", 12_500, 15_000),
        said("agent", 2, "感谢您的来电再见", 20_000, 22_000),
    ]


def test_checks_pass_and_categories_apply_with_the_deciding_utterance(rules_file: Path) -> None:
    rules = load_analytics_rules(rules_file)
    checks, categories = rules.evaluate(call_utterances(), 23_000, {})
    by_id = {c.id: c for c in checks}
    assert by_id["greeting"] == ev.RuleCheck("greeting", "greeting", True, "agent", 0, 1_000, "您好")
    assert by_id["address_read_back"] == ev.RuleCheck(
        "address_read_back", "address_read_back", True, "agent", 1, 9_500, "新华路12号"
    )
    assert by_id["closing"].passed is True and by_id["closing"].utterance_id == 2
    assert by_id["polite"] == ev.RuleCheck("polite", "forbidden_words", True, None, None, None, None)
    assert categories == (ev.CategoryHit("supervisor", "要求找领导", "caller", 1, 12_500, "找你们领导"),)


def test_checks_fail_and_a_repeat_address_is_a_category(rules_file: Path) -> None:
    rules = load_analytics_rules(rules_file)
    utterances = [
        said("agent", 0, "喂", 1_000, 1_500),
        said("agent", 1, "您好", 7_000, 8_000),  # too late for greeting (within 5 s)
        said("caller", 0, "和平路8号又停水了", 8_500, 12_000, ("和平路8号",)),
        said("agent", 2, "这个不归我们管", 12_500, 14_000),
    ]
    checks, categories = rules.evaluate(utterances, 40_000, {"和平路8号": 3.0})
    by_id = {c.id: c for c in checks}
    assert [by_id[k].passed for k in ("greeting", "address_read_back", "closing", "polite")] == [
        False,
        False,
        False,
        False,
    ]
    assert by_id["polite"].phrase == "不归我们管" and by_id["polite"].at_ms == 12_500
    assert categories == (ev.CategoryHit("repeat", "同一地址重复来电", "caller", 0, 8_500, "和平路8号"),)
    _, older = rules.evaluate(utterances, 40_000, {"和平路8号": 30.0})  # outside within_h: 24
    assert older == ()


def test_read_back_does_not_apply_when_no_address_was_given(rules_file: Path) -> None:
    checks, _ = load_analytics_rules(rules_file).evaluate([said("caller", 0, "你好", 0, 500)], 1_000, {})
    assert next(c for c in checks if c.id == "address_read_back").passed is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("checks:\n  - id: a\n    kind: greting\n    phrases: [您好]\n", "rules.yaml:2 checks.0: Input tag 'greting'"),
        ("checks:\n  - id: a\n    kind: greeting\n    phrases: [您好]\n  - id: a\n    kind: closing\n"
         "    phrases: [再见]\n", "rules.yaml:5 checks.1.id: id 'a' is used twice (first at rules.yaml:2"),
        ("categories:\n  - id: c\n    kind: phrases\n    label: x\n", "rules.yaml:2 categories.0.id: category 'c'"),
        ("checks:\n  - id: a\n    kind: forbidden_words\n    words: ['，']\n", "phrase 0 '，' is empty"),
    ],
)  # fmt: skip
def test_a_broken_rules_file_names_file_and_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_analytics_rules(path)
    assert any(expected in line.replace(str(tmp_path) + "/", "") for line in caught.value.errors), caught.value.errors


# -- the processor and the bridge ---------------------------------------------------------


def processor_with(rules_file: Path, now: list[float]) -> TranscriptProcessor:
    return TranscriptProcessor(
        {}, {}, Redactor(b"k"), analytics_rules={"hotline": ReloadableRef(rules_file, load_analytics_rules)},
        clock=lambda: now[0],
    )  # fmt: skip


def test_the_processor_makes_call_analytics_and_remembers_addresses_across_calls(rules_file: Path) -> None:
    now = [1_000_000.0]
    processor = processor_with(rules_file, now)
    first = CallContext("c1", route="hotline", analytics_rules="hotline", itn=True)
    greeting = (("您", 0, 250), ("好", 250, 500))
    processor.process(TranscriptUpdate(first, Participant("agent"), 0, False, "您好", greeting, 0, 500))
    report = "新华路十二号井盖坏了"
    tokens = tuple((ch, 1_000 + 100 * i, 1_100 + 100 * i) for i, ch in enumerate(report))
    processor.process(TranscriptUpdate(first, Participant("caller"), 0, False, report, tokens, 1_000, 2_000))
    analytics = processor.call_analytics(first, 3_000)
    assert analytics is not None
    wire = analytics.to_json()
    jsonschema.validate({**wire, "seq": 1}, ev.schema())
    assert wire["event_type"] == "call.analytics" and wire["participant"] is None
    assert wire["talk_ms"] == {"agent": 500, "caller": 1_000}  # ITN's 12 spans 十二 (200 ms)
    assert wire["non_talk_ms"] == 3_000 - 1_500
    assert wire["speaking_rate"]["caller"] == round(10 * 60_000 / 1_000, 1)  # spoken characters: 十二 is two
    assert {c["id"]: c["passed"] for c in wire["checks"]}["greeting"] is True
    assert wire["categories"] == []
    processor.end_call("c1")

    now[0] += 3_600
    second = CallContext("c2", route="hotline", analytics_rules="hotline", itn=True)
    processor.process(TranscriptUpdate(second, Participant("caller"), 0, False, "新华路十二号还是没修", (), 0, 1_500))
    repeat = processor.call_analytics(second, 2_000)
    assert repeat is not None
    assert [(c.id, c.phrase) for c in repeat.categories] == [("repeat", "新华路12号")]
    assert processor.call_analytics(CallContext("c3"), 1_000) is None  # the route names no rule set


def test_call_analytics_comes_right_before_call_ended_through_the_bridge(rules_file: Path) -> None:
    engine, publisher = FakeEngine(units=["<blank>", "您", "好", "井", "盖"]), RecordingPublisher()
    bridge = CallBridge(engine, processor_with(rules_file, [0.0]), publisher)
    bridge.start()
    profile = Profile(analytics_rules="hotline", role="agent")
    info = CallInfo("a1", "sip", "sip-a1", "sip:a@b", None, "sip:r@asr", "hotline", ("127.0.0.1", 5060, "udp"),
                    "hotline", profile, False)  # fmt: skip
    bridge.open_leg(info, LegInfo("a1-0", None, "agent", "sip:a@b", "PCMU"))
    on_event: Any = engine.callbacks["a1-0"]
    on_event(Final("a1-0", 0, 1, "您好", (1, 2), (400, 600), 300, 1_500, "silence"))
    on_event(Ended("a1-0", 2, "input_finished", 4_000))
    bridge.call_ended(info, "bye")
    bridge.stop()

    kinds = [type(e) for e in publisher.events]
    assert kinds[-2:] == [ev.CallAnalytics, ev.CallEnded]
    analytics = publisher.events[-2]
    assert isinstance(analytics, ev.CallAnalytics)
    # the engine gives CTC peaks only (400, 600 ms): heard over TOKEN_MS before each, from the
    # utterance's begin (300 ms) on: 300-400, 400-600
    assert analytics.talk_ms == {"agent": 300}
    assert analytics.duration_ms == 4_000 and analytics.non_talk_ms == 4_000 - 300
    assert bridge.worker_errors == 0
