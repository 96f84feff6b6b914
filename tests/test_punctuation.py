"""Punctuation of finals from token times: commas and full stops at pauses, question marks from
particles and question words, numbers never split, the events of a ``punctuation: pauses``
route (text_raw kept, redaction and KB matching unchanged), the hand-punctuated set and its F1."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from pydantic import ValidationError

from asr_common.itn import Token
from asr_common.punctuation import MARKS, PUNCTUATORS, PausePunctuator
from asr_core.events import Ended
from asr_gateway.bridge import CallBridge
from calls.call import CallInfo, LegInfo
from calls.profile import Profile
from deploy.bench import punctuation_bench
from kb_hooks import events as ev
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, RedactionMode, TranscriptUpdate
from tests.bridge_fakes import FakeEngine, RecordingPublisher, bare_processor
from tests.test_events import CALLER, ctx, processor, validated

__all__ = ["processor"]  # the fixture, re-used

SET = Path(__file__).resolve().parents[1] / "recipes" / "testsets" / "punctuated_hotline.txt"


def timed(text: str, pauses: dict[int, int], step: int = 200) -> list[Token]:
    """One token per character ``step`` ms apart, ``pauses[i]`` ms more before character i."""
    tokens: list[Token] = []
    now = 0
    for i, ch in enumerate(text):
        now += (step if i else 0) + pauses.get(i, 0)
        tokens.append((ch, now, None))
    return tokens


def test_pauses_become_commas_and_full_stops() -> None:
    rules = PausePunctuator()
    text = "你好我们小区停水了从早上一直停到现在"
    got = rules.punctuate(text, timed(text, {2: 300, 9: 900}))
    assert got == "你好，我们小区停水了。从早上一直停到现在。"
    assert rules.punctuate(text, timed(text, {})) == text + "。"
    assert rules.punctuate(text, [(ch, None, None) for ch in text]) == text + "。"  # no times: only the end


def test_questions_from_particles_and_question_words() -> None:
    rules = PausePunctuator()
    assert rules.punctuate("是一二三四五热线吗", timed("是一二三四五热线吗", {})) == "是一二三四五热线吗？"
    text = "你们能不能派人过来看一下"
    assert rules.punctuate(text, timed(text, {7: 300})) == "你们能不能派人，过来看一下？"
    text = "我们等着呢你们快来"
    assert rules.punctuate(text, timed(text, {5: 300})) == "我们等着呢？你们快来。"


def test_numbers_are_never_split_and_marks_already_there_are_kept() -> None:
    rules = PausePunctuator()
    text = "电话一三八一二三四五六七八"
    assert rules.punctuate(text, timed(text, {5: 400, 9: 400})) == text + "。"
    digits = "电话13812345678"
    tokens: list[Token] = [("电", 0, None), ("话", 200, None), ("13812345678", 400, 2600)]
    assert rules.punctuate(digits, tokens) == digits + "。"
    text = "你好，我要反映问题"
    assert rules.punctuate(text, timed("你好我要反映问题", {2: 400})) == "你好，我要反映问题。"


def _final(text: str, pauses: dict[int, int], call: object) -> TranscriptUpdate:
    tokens = tuple(timed(text, pauses))
    return TranscriptUpdate(call, CALLER, 0, False, text, tokens, 0, 200 * len(text), 0.9, ((text, -1.0),), 30.0)  # type: ignore[arg-type]


def test_a_pauses_route_punctuates_finals_and_keeps_the_raw_text(processor: TranscriptProcessor) -> None:
    text = "我今天发现新华路十二号井盖发生了破损有安全隐患"
    call = dataclasses.replace(ctx(), punctuation="pauses", itn=True)
    final, suggestion, tags = validated(processor.process(_final(text, {18: 400}, call)))
    assert final["text"] == "我今天发现新华路12号井盖发生了破损，有安全隐患。"
    assert final["text_raw"] == text
    assert final["tokens"][8] == {"text": "12", "begin_ms": 1600, "end_ms": 1800}  # 十's and 二's times
    assert suggestion["matched_text"] == "井盖发生了破损"
    address = next(t for t in tags["tags"] if t["label"] == "address")
    assert final["text"][address["span"]["begin"] : address["span"]["end"]] == "新华路12号"
    off = dataclasses.replace(ctx(), call_id="call-2")
    (plain, *_) = validated(processor.process(_final(text, {18: 400}, off)))
    assert plain["text"] == text and "text_raw" not in plain


def test_a_phone_number_said_with_pauses_is_still_redacted(processor: TranscriptProcessor) -> None:
    text = "我的电话是一三八一二三四五六七八"
    call = dataclasses.replace(ctx(RedactionMode.MASK), punctuation="pauses")
    (final, *_) = validated(processor.process(_final(text, {5: 400, 8: 400, 12: 400}, call)))
    assert not any(ch in "一二三四五六七八" for ch in final["text"]), final["text"]
    assert final["text"].endswith("。")
    assert all(not any(ch in "一二三四五六七八" for ch in t["text"]) for t in final["tokens"])


def test_the_profile_fields() -> None:
    assert Profile().attention_beam is None  # the engine's: 0, WeNet's rescoring
    assert Profile.model_validate({"attention_beam": 4}).attention_beam == 4  # this route's finals are joint
    with pytest.raises(ValidationError, match="attention_beam"):
        Profile.model_validate({"attention_beam": -1})
    assert Profile().punctuation == "off"
    assert Profile.model_validate({"punctuation": False}).punctuation == "off"  # YAML's bare off
    assert Profile.model_validate({"punctuation": "pauses"}).punctuation in PUNCTUATORS
    with pytest.raises(ValidationError, match="punctuation"):
        Profile.model_validate({"punctuation": "model"})


def test_the_hand_punctuated_set_and_its_f1(capsys: pytest.CaptureFixture[str]) -> None:
    lines = [line for line in SET.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) >= 100 and len(set(lines)) == len(lines)
    assert all(line[-1] in MARKS for line in lines)
    assert punctuation_bench.split_marks("喂，你好吗？") == ("喂你好吗", {1: "，", 4: "？"})
    assert punctuation_bench.main(["--seed", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lines"] == len(lines)
    for key in ("breaks", "marks"):
        assert 0 < report[key]["f1"] <= 1 and report[key]["expected"] == sum(
            ch in MARKS for line in lines for ch in line
        )
    assert set(report["per_mark"]) == {"，", "。", "？"}


class _ContextRecordingPublisher(RecordingPublisher):
    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[CallContext] = []

    def call_started(
        self,
        ctx: CallContext,
        participants: Iterable[Participant],
        metadata: Mapping[str, str] | None = None,
        source: ev.CallSourceName = "sip",
    ) -> ev.CallStarted:
        self.contexts.append(ctx)
        return super().call_started(ctx, participants, metadata, source)


def test_the_bridge_hands_a_routes_finals_settings_to_the_engine_and_the_processor() -> None:
    engine, publisher = FakeEngine(), _ContextRecordingPublisher()
    bridge = CallBridge(engine, bare_processor(), publisher)
    bridge.start()
    profile = Profile(attention_beam=4, punctuation="pauses", itn=True)
    info = CallInfo("p1", "sip", "sip-p1", "sip:a@b", None, "sip:r@asr", None, ("127.0.0.1", 5060, "udp"), "joint",
                    profile, False)  # fmt: skip
    bridge.open_leg(info, LegInfo("p1-0", None, "caller", "sip:a@b", "PCMU"))
    engine.callbacks["p1-0"](Ended("p1-0", 0, "input_finished", 1000))
    bridge.call_ended(info, "bye")
    bridge.stop()
    (config,) = engine.configs
    assert config.attention_beam == 4  # this route's finals are joint; the engine's default is rescore
    (call,) = publisher.contexts  # the CallContext every update of the call carries to the processor
    assert call.punctuation == "pauses" and call.itn


def test_token_times_aligned_on_recordings_of_the_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = SET.parents[2] / "tests" / "data" / "hotline_8k"
    data = tmp_path / "calls"
    data.mkdir()
    (data / "wav.scp").write_text(f"a {bundle / 'hotline_1.wav'}\nb {bundle / 'hotline_seed.wav'}\n", encoding="utf-8")
    seed = "我今天发现新华路十二号井盖发生了破损有安全隐患"
    (data / "text").write_text(f"a 早上七点多北京路附近暖气不热\nb {seed}\n", encoding="utf-8")
    lines = tmp_path / "lines.txt"
    marked_seed = "我今天发现新华路十二号井盖发生了破损，有安全隐患。"
    lines.write_text(f"早上七点多，北京路附近暖气不热。\n{marked_seed}\n", encoding="utf-8")
    model = SET.parents[2] / "asr_core" / "demo_model"
    assert punctuation_bench.main(["--set", str(lines), "--audio", str(data), "--model", str(model)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["token_times"].startswith("aligned on") and report["marks"]["expected"] == 4
    assert report["per_mark"]["。"]["hits"] == 2  # each line's end
    lines.write_text(f"别的话。\n{marked_seed}\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        punctuation_bench.main(["--set", str(lines), "--audio", str(data), "--model", str(model)])
    assert "line 1 of the set" in capsys.readouterr().err
