"""Text normalization for matching, keeping a map back to the original characters.

ASR output and admin-written phrases differ in width, punctuation and how numbers are
written (``一三八`` vs ``138``, ``十二`` vs ``12``). Both sides go through the same
normalization, and every normalized character remembers the span of original text it came
from, so a match can be reported on the text the user sees.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from pypinyin import Style, lazy_pinyin

DIGIT_CHARS = {"零": 0, "〇": 0, "一": 1, "幺": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5,
               "六": 6, "七": 7, "八": 8, "九": 9}  # fmt: skip
UNIT_CHARS = {"十": 10, "百": 100, "千": 1000, "万": 10_000}
NUMERAL_CHARS = frozenset(DIGIT_CHARS) | frozenset(UNIT_CHARS)


@dataclass(frozen=True)
class Normalized:
    """``text`` plus, for each of its characters, the ``[begin, end)`` span in the original text."""

    text: str
    spans: tuple[tuple[int, int], ...]

    def original_span(self, begin: int, end: int) -> tuple[int, int]:
        """Original-text span covering normalized characters ``[begin, end)``."""
        return self.spans[begin][0], self.spans[end - 1][1]


def _dropped(ch: str) -> bool:
    category = unicodedata.category(ch)
    return category[0] in "PZSC"


def fold_char(ch: str) -> str:
    """Full-width to half-width and lower case (NFKC), '' for punctuation, spaces and symbols."""
    folded = unicodedata.normalize("NFKC", ch).lower()
    return "".join(c for c in folded if not _dropped(c))


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
    i = 0
    while i < len(text):
        ch = text[i]
        if numerals and ch in NUMERAL_CHARS:
            j = i
            while j < len(text) and text[j] in NUMERAL_CHARS:
                j += 1
            run = text[i:j]
            # A lone unit character (十/百/千/万) is a word more often than a number.
            digits = numeral_to_digits(run) if any(c in DIGIT_CHARS for c in run) or len(run) > 1 else run
            out.extend(digits)
            spans.extend([(i, j)] * len(digits))
            i = j
            continue
        folded = fold_char(ch)
        out.extend(folded)
        spans.extend([(i, i + 1)] * len(folded))
        i += 1
    return Normalized("".join(out), tuple(spans))


def pinyin_keys(text: str) -> list[str]:
    """Toneless pinyin of each character of ``text`` (non-Chinese characters stand for themselves).

    The whole string is converted at once so that pypinyin's phrase dictionary picks the
    right reading of polyphones (长 in 长江 vs 长大).
    """
    split_chars: Any = list  # pypinyin accepts a list from ``errors`` though its stubs say str
    return lazy_pinyin(text, style=Style.NORMAL, errors=split_chars)
