"""Text generator: numbers as spoken, determinism, held-out splits, vocabulary width."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipes import textgen


@pytest.mark.parametrize(
    ("value", "spoken"),
    [
        (0, "零"),
        (7, "七"),
        (10, "十"),
        (12, "十二"),
        (20, "二十"),
        (105, "一百零五"),
        (110, "一百一十"),
        (1001, "一千零一"),
        (2024, "二千零二十四"),
        (10000, "一万"),
        (10001, "一万零一"),
        (123456, "十二万三千四百五十六"),
    ],
)
def test_int_to_chinese(value: int, spoken: str) -> None:
    assert textgen.int_to_chinese(value) == spoken


@given(st.integers(0, 99_999_999))
def test_int_to_chinese_uses_only_number_characters(value: int) -> None:
    assert set(textgen.int_to_chinese(value)) <= set("零一二三四五六七八九十百千万")


def test_digits_to_chinese() -> None:
    assert textgen.digits_to_chinese("13800") == "一三八零零"
    with pytest.raises(ValueError, match="only digits"):
        textgen.digits_to_chinese("12a")


def test_same_seed_same_sentences_other_seed_other_sentences() -> None:
    assert textgen.generate(300, seed=5) == textgen.generate(300, seed=5)
    assert textgen.generate(300, seed=5) != textgen.generate(300, seed=6)


def test_sentences_are_distinct_and_spoken_as_characters() -> None:
    sentences = textgen.generate(500, seed=1)
    assert len({s.text for s in sentences}) == 500
    for s in sentences:
        assert not any(ch.isdigit() or ch.isascii() for ch in s.transcript), s.text


def test_splits_hold_out_sentences_and_templates() -> None:
    splits = textgen.make_splits(1000, 100, seed=3)
    assert splits.train[0].text == textgen.SEED_SENTENCE
    train_texts = {s.transcript for s in splits.train}
    assert len(splits.test_sentences) == len(splits.test_templates) == 100
    assert not train_texts & {s.transcript for s in splits.test_sentences + splits.test_templates}
    assert {s.template for s in splits.test_templates} <= textgen.TEST_TEMPLATES
    assert not {s.template for s in splits.train + splits.test_sentences} & textgen.TEST_TEMPLATES


def test_mix_of_hotline_and_everyday_with_wide_vocabulary() -> None:
    sentences = textgen.generate(2000, seed=0)
    hotline = sum(s.template.startswith("hotline.") for s in sentences)
    assert 0.5 < hotline / len(sentences) < 0.7
    _, common = textgen.char_coverage(sentences)
    assert common > 1200
    assert len(textgen.common_chars()) == 3500


def test_rare_set_favours_rare_characters_and_keeps_out_test_sentences() -> None:
    splits = textgen.make_splits(3000, 200, seed=0)
    flat = textgen.make_rare_set(3000, seed=5, splits=splits)
    assert len(flat) == 3000
    train_chars = {ch for s in splits.train for ch in s.transcript}
    assert all(set(s.transcript) <= train_chars for s in flat)
    held_out = {s.transcript for s in (*splits.test_sentences, *splits.test_templates)}
    assert not held_out & {s.transcript for s in flat}
    assert not {s.template for s in flat} & textgen.TEST_TEMPLATES

    counts = Counter(ch for s in splits.train for ch in s.transcript)
    rare = {ch for ch, n in counts.items() if n < 5}

    def rare_hits(sentences: list[textgen.Sentence]) -> int:
        return sum(ch in rare for s in sentences for ch in s.transcript)

    usual = textgen.generate(3000, 5, 0.2, frozenset(textgen.TEMPLATES) - textgen.TEST_TEMPLATES)
    assert rare_hits(flat) > 2 * rare_hits(usual)
    assert textgen.generate(50, 1) == textgen.generate(50, 1)  # the context variable was reset
