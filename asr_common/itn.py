"""Inverse text normalization of Mandarin numbers: spoken numerals to digits (新华路十二号 ->
新华路12号, 一三八... -> 138..., 百分之五十 -> 50%), with cn2an doing each conversion.

Only runs of numeral characters are rewritten, one at a time, so every rewritten span knows
the spoken characters it came from: tokens keep their times, and a normalized span's time
runs from its first spoken token's begin to its last one's end.

Guards against the common non-numbers (cn2an alone would write 一个 as 1个, 十分感谢 as
10分感谢): a one-character run is rewritten only before a unit (号, 楼, 年, 点 ...), 一 only
before an address or date unit, 两 never; a few words (万一, 千万, 一一) are kept.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import cn2an

_NUMERAL = "零〇一二三四五六七八九十百千万亿幺两"
_RUN = re.compile(f"(?:百分之)?[{_NUMERAL}]+(?:点[零〇一二三四五六七八九幺]+)?")
_UNITS = set("号楼层室栋单元块年月日时点岁期路线站")  # after a one-character run: a quantity
_ONE_UNITS = set("号楼层室栋月日")  # 一 alone: only an address or date part ("一个" stays)
_KEPT_WORDS = frozenset({"万一", "千万", "一一", "一万一"})


@dataclass(frozen=True)
class Span:
    """One rewritten run: ``text[begin:end]`` came from ``raw[raw_begin:raw_end]``."""

    begin: int
    end: int
    raw_begin: int
    raw_end: int


@dataclass(frozen=True)
class Normalized:
    text: str
    raw: str
    spans: tuple[Span, ...]


def _convert(run: str) -> str | None:
    """cn2an's digits for one numeral run; None where cn2an does not take it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cn2an warns, and returns the input, on what it cannot parse
        try:
            out = str(cn2an.transform(run, "cn2an"))
        except (ValueError, KeyError):
            return None
    return out if out != run and any(ch.isdigit() for ch in out) else None


def _wanted(run: str, after: str) -> bool:
    if run in _KEPT_WORDS:
        return False
    if len(run) == 1:
        if run == "两":
            return False
        return after in (_ONE_UNITS if run == "一" else _UNITS)
    return True


def normalize_numbers(text: str) -> Normalized:
    """``text`` with its spoken numbers in digits, and where each rewritten span came from."""
    out: list[str] = []
    spans: list[Span] = []
    pos = length = 0
    for match in _RUN.finditer(text):
        run = match.group()
        after = text[match.end() : match.end() + 1]
        digits = _convert(run) if _wanted(run, after) else None
        if digits is None:
            continue
        out.append(text[pos : match.start()])
        length += match.start() - pos
        spans.append(Span(length, length + len(digits), match.start(), match.end()))
        out.append(digits)
        length += len(digits)
        pos = match.end()
    out.append(text[pos:])
    return Normalized("".join(out), text, tuple(spans))


Token = tuple[str, int | None, int | None]


def normalize_tokens(normalized: Normalized, tokens: Sequence[Token]) -> list[Token]:
    """The spoken text's (unit, begin_ms, end_ms) tokens as tokens of the normalized text: the
    tokens of a rewritten span become one token (its digits) from the first one's begin to the
    last one's end (its time where tokens carry one time each, as the engine's CTC spikes); the
    others are kept. Tokens that cannot be placed in the text are kept."""
    if not normalized.spans:
        return list(tokens)
    raw, at = normalized.raw, 0
    placed: list[tuple[int, int] | None] = []  # each token's characters in the raw text
    for unit, _, _ in tokens:
        piece = unit.replace("\u2581", "").strip()
        found = raw.find(piece, at) if piece else -1
        if found < 0:
            placed.append(None)
            continue
        placed.append((found, found + len(piece)))
        at = found + len(piece)
    out: list[Token] = []
    span_iter = iter(normalized.spans)
    span = next(span_iter, None)
    i = 0
    while i < len(tokens):
        where = placed[i]
        if span is None or where is None or where[1] <= span.raw_begin:
            out.append(tokens[i])
            i += 1
            continue
        members = []
        while i < len(tokens) and (where := placed[i]) is not None and where[0] < span.raw_end:
            members.append(tokens[i])
            i += 1
        if members:
            _, last_begin, last_end = members[-1]
            end = last_end if last_end is not None else last_begin  # spike times only: the last one's
            out.append((normalized.text[span.begin : span.end], members[0][1], end))
        span = next(span_iter, None)
    return out
