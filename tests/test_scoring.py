"""asr_common.scoring: the one CER of the project (punctuation and spaces not scored, as WeNet's
compute-cer.py), and asr_core.tokens: the one ids -> text (WeNet's joining rules)."""

from __future__ import annotations

import pytest

from asr_common.scoring import cer, char_errors, corpus_cer, edit_distance, scoring_text
from asr_core.tokens import tokens_to_text


def test_edit_distance_of_strings_and_token_ids() -> None:
    assert edit_distance("井盖破损", "井破损了") == 2
    assert edit_distance("", "abc") == edit_distance("abc", "") == 3
    assert edit_distance((1, 2, 3), (1, 3)) == 1
    assert edit_distance("kitten", "sitting") == 3


def test_cer_ignores_punctuation_and_spaces() -> None:
    assert cer("井盖破损", "井盖破损") == 0.0
    assert cer("井盖，破损。", "井盖破损") == 0.0
    assert cer("HELLO WORLD", "HELLOWORLD") == 0.0
    assert scoring_text(" 井盖, 12号！") == "井盖12号"
    assert cer("井破损", "井盖破损") == 0.25
    assert cer("", "井盖") == 1.0
    assert cer("井盖", "") == 2.0  # an empty reference counts as one character


def test_corpus_cer_weighs_by_reference_length() -> None:
    hyps, refs = ["井盖", "破损了"], ["井盖发生", "破损"]
    assert char_errors(hyps[0], refs[0]) == (2, 4)
    assert corpus_cer(hyps, refs) == pytest.approx(3 / 6)
    with pytest.raises(ValueError):
        corpus_cer(hyps, refs[:1])


def test_tokens_to_text_follows_wenet() -> None:
    units = ["<blank>", "<unk>", "\u2581HELLO", "\u2581WOR", "LD", "你", "<sos/eos>", "<", "好"]
    assert tokens_to_text([2, 3, 4, 1, 5, 6, 0], units) == "HELLO WORLD你"
    assert tokens_to_text([5, 8], units) == "你好"
    assert tokens_to_text([7, 5], units) == "<你"  # a literal "<" unit is text
    assert tokens_to_text([], units) == ""
