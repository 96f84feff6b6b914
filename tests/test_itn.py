"""Inverse text normalization of spoken numbers, per numeric class, its guards against words
that only look numeric, token times of rewritten spans, and the events of an ``itn`` route:
normalized text for KB/tags/entities/redaction, digit phone and ID numbers still redacted."""

from __future__ import annotations

import dataclasses

import pytest

from asr_common.itn import Span, normalize_numbers, normalize_tokens
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import RedactionMode
from tests.test_events import SEED, ctx, json_of, processor, update, validated

__all__ = ["processor"]  # the fixture, re-used


@pytest.mark.parametrize(
    ("spoken", "written"),
    [
        ("新华路十二号", "新华路12号"),  # house number
        ("幸福小区三栋二单元五零二室", "幸福小区3栋2单元502室"),  # building, unit, room
        ("电话一三八一二三四五六七八", "电话13812345678"),  # phone, digit by digit
        ("幺三八一二三四五六七八", "13812345678"),  # 幺 for 1
        ("三一零一零一一九九零零三零七一二三四", "310101199003071234"),  # ID number
        ("二零二四年三月五日", "2024年3月5日"),  # date
        ("下午三点", "下午3点"),  # hour
        ("一千二百三十四元", "1234元"),  # amount
        ("三点五公斤", "3.5公斤"),  # decimal
        ("百分之五十", "50%"),  # percent
        ("第十一号", "第11号"),
    ],
)
def test_numeric_classes(spoken: str, written: str) -> None:
    assert normalize_numbers(spoken).text == written


@pytest.mark.parametrize("text", ["一个人十分感谢", "万一漏水", "千万不要", "快一点", "两个人", "统一", "一一核对"])
def test_words_that_only_look_numeric_are_kept(text: str) -> None:
    assert normalize_numbers(text).text == text and normalize_numbers(text).spans == ()


def test_spans_and_token_times() -> None:
    result = normalize_numbers("新华路十二号百分之五十")
    assert result.text == "新华路12号50%"
    assert result.spans == (Span(3, 5, 3, 5), Span(6, 9, 6, 11))
    tokens = [(ch, 100 * i, 100 * i + 80) for i, ch in enumerate(result.raw)]
    assert normalize_tokens(result, tokens) == [
        ("新", 0, 80), ("华", 100, 180), ("路", 200, 280),
        ("12", 300, 480),  # 十 begins, 二 ends
        ("号", 500, 580),
        ("50%", 600, 1080),  # 百分之五十: five spoken tokens
    ]  # fmt: skip
    assert normalize_tokens(normalize_numbers("没有数字"), tokens[:2]) == tokens[:2]


def test_an_itn_route_publishes_normalized_text_and_the_spoken_form(processor: TranscriptProcessor) -> None:
    call = dataclasses.replace(ctx(), itn=True)
    final, suggestion, tags = validated(processor.process(update(SEED, False, call=call)))
    assert final["text"] == SEED.replace("十二号", "12号")
    assert final["text_raw"] == SEED
    assert {"text": "12", "begin_ms": 800, "end_ms": 980} in final["tokens"]
    assert suggestion["matched_text"] == "井盖发生了破损"
    address = next(t for t in tags["tags"] if t["label"] == "address")
    assert address["value"] == "新华路12号"
    assert final["text"][address["span"]["begin"] : address["span"]["end"]] == "新华路12号"
    # partials keep the spoken form
    (partial, *_) = json_of(processor.process(update("新华路十二号", True, utterance_id=1, call=call)))
    assert partial["text"] == "新华路十二号" and "text_raw" not in partial


@pytest.mark.parametrize(
    "spoken", ["我的电话是一三八一二三四五六七八", "身份证号是三一零一零一一九九零零三零七一二三四"]
)
def test_digit_phone_and_id_numbers_are_redacted_after_itn(processor: TranscriptProcessor, spoken: str) -> None:
    call = dataclasses.replace(ctx(RedactionMode.MASK), itn=True)
    (final, *_) = validated(processor.process(update(spoken, False, call=call)))
    assert not any(ch.isdigit() for ch in final["text"]), final["text"]
    assert not any(ch in "一二三四五六七八九零" for ch in final["text_raw"]), final["text_raw"]
    assert all(not any(ch.isdigit() for ch in tok["text"]) for tok in final["tokens"])
    assert all(not any(ch.isdigit() for ch in alt["text"]) for alt in final["nbest"])
