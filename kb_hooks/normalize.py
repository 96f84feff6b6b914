"""Text normalization for matching, keeping a map back to the original characters.

ASR output and admin-written phrases differ in width, punctuation and how numbers are
written (``一三八`` vs ``138``, ``十二`` vs ``12``). Both sides go through the same
normalization, and every normalized character remembers the span of original text it came
from, so a match can be reported on the text the user sees.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pypinyin import Style, lazy_pinyin

DIGIT_CHARS = {"零": 0, "〇": 0, "一": 1, "幺": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5,
               "六": 6, "七": 7, "八": 8, "九": 9}  # fmt: skip
UNIT_CHARS = {"十": 10, "百": 100, "千": 1000, "万": 10_000}
NUMERAL_CHARS = frozenset(DIGIT_CHARS) | frozenset(UNIT_CHARS)
_NUMERAL_RUN = re.compile(f"[{''.join(sorted(NUMERAL_CHARS))}]+")


@dataclass(frozen=True)
class Normalized:
    """``text`` plus, for each of its characters, the ``[begin, end)`` span in the original text."""

    text: str
    spans: tuple[tuple[int, int], ...]

    def original_span(self, begin: int, end: int) -> tuple[int, int]:
        """Original-text span covering normalized characters ``[begin, end)``."""
        return self.spans[begin][0], self.spans[end - 1][1]


@lru_cache(maxsize=16_384)
def fold_char(ch: str) -> str:
    """Full-width to half-width and lower case (NFKC), '' for punctuation, spaces and symbols."""
    folded = unicodedata.normalize("NFKC", ch).lower()
    return "".join(c for c in folded if unicodedata.category(c)[0] not in "PZSC")


def chinese_number_value(run: str) -> int | None:
    """Value of a positional Chinese numeral such as 十二, 一百零三, 三千五 (None if malformed)."""
    total, section, digit, last_unit, zero_seen = 0, 0, None, 1, False
    for ch in run:
        if ch in DIGIT_CHARS:
            if digit is not None:
                return None
            digit = DIGIT_CHARS[ch]
            if digit == 0:
                digit, zero_seen = None, True
            continue
        unit = UNIT_CHARS[ch]
        if unit == 10_000:
            total += (section + (digit or 0) or 1) * unit
            section = 0
        else:
            section += (1 if digit is None else digit) * unit
        digit, last_unit, zero_seen = None, unit, False
    if digit is not None and last_unit >= 100 and not zero_seen:
        digit *= last_unit // 10  # 三千五 is 3500, 三千零五 is 3005
    return total + section + (digit or 0)


def numeral_to_digits(run: str) -> str:
    """``一三八`` -> ``138``, ``十二`` -> ``12``; digit-by-digit when there is no unit character."""
    if any(ch in UNIT_CHARS for ch in run):
        value = chinese_number_value(run)
        if value is not None:
            return str(value)
    return "".join(str(DIGIT_CHARS[ch]) if ch in DIGIT_CHARS else ch for ch in run)


def normalize(text: str, numerals: bool = True) -> Normalized:
    """Fold width/case, drop punctuation and spaces, and (optionally) write numerals as digits."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    numeral_runs = {m.start(): m.end() for m in _NUMERAL_RUN.finditer(text)} if numerals else {}
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if "\u4e00" <= ch <= "\u9fff" and i not in numeral_runs:  # common case: a Chinese character
            out.append(ch)
            spans.append((i, i + 1))
            i += 1
            continue
        j = numeral_runs.get(i)
        if j is not None:
            run = text[i:j]
            # A lone unit character (十/百/千/万) is a word more often than a number.
            digits = numeral_to_digits(run) if len(run) > 1 or run in DIGIT_CHARS else run
            out.extend(digits)
            spans.extend([(i, j)] * len(digits))
            i = j
            continue
        folded = fold_char(ch)
        out.extend(folded)
        spans.extend([(i, i + 1)] * len(folded))
        i += 1
    return Normalized("".join(out), tuple(spans))


@lru_cache(maxsize=32_768)
def char_pinyin(ch: str) -> str:
    """Toneless pinyin of one character in its most common reading (the character itself if not Chinese)."""
    return lazy_pinyin(ch, style=Style.NORMAL)[0] if "\u3400" <= ch <= "\u9fff" else ch


def pinyin_keys(text: str) -> list[str]:
    """Toneless pinyin of each character of ``text``, one character at a time (cached, fast).

    Phrases are also registered under their in-context reading (see ``phrase_readings``), so
    a polyphone read differently in a phrase (行 in 银行) still matches.
    """
    return [char_pinyin(ch) for ch in text]


def phrase_readings(phrase: str) -> set[tuple[str, ...]]:
    """The per-character and the in-context (pypinyin phrase dictionary) readings of a phrase."""
    split_chars: Any = list  # pypinyin accepts a list from ``errors`` though its stubs say str
    in_context = lazy_pinyin(phrase, style=Style.NORMAL, errors=split_chars)
    return {tuple(pinyin_keys(phrase)), tuple(in_context)}
