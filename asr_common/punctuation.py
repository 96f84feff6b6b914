"""Punctuation of finals: commas and full stops from the pauses between tokens, question marks
from sentence-final particles (吗, 呢, 吧), A-not-A questions (是不是, 能不能 ...) and question
words (请问, 什么, 怎么, 多少 ...).

WeNet's runtime outputs no punctuation, and an agent reads 我今天发现新华路十二号井盖发生了破损有安全
隐患 as one run. A final carries one time per token (its CTC spike, ms; an ITN-rewritten number
spans from its first spoken token to its last), so the gap between two tokens is how long the
speaker took between them: a gap well past the utterance's own typical gap is a pause, and a
pause is where a written sentence would have a comma or, when long, a full stop. The utterance
ends with a full stop (the engine ended it at 800 ms of silence). Nothing is ever inserted
between two numerals: a phone number said with pauses stays one run for the entity finder and
redaction.

``Punctuator`` is what a punctuation model (a CT-Transformer as FunASR's, say) implements to
replace the rules: it gets the final's text and tokens and returns the text with marks added,
the characters otherwise unchanged. ``PUNCTUATORS`` maps a route's ``punctuation:`` word to one.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from asr_common.itn import Token

PunctuationName = Literal["off", "pauses"]
"""A route's ``punctuation:``: ``off``, or ``pauses`` (``PausePunctuator``)."""

COMMA, STOP, QUESTION = "，", "。", "？"
MARKS = frozenset("，。？！、；：,.?!;:")
_QUESTION_PARTICLES = frozenset("吗呢吧")
_QUESTION_CUES = (
    *("是不是", "能不能", "有没有", "可不可以", "会不会", "要不要", "行不行", "对不对", "好不好", "管不管"),  # A-not-A
    *("请问", "什么", "怎么", "为什么", "哪", "多少", "多长时间", "多久", "谁"),  # question words
)
_NUMERALS = frozenset("零〇一二三四五六七八九十百千万亿幺两0123456789")


class Punctuator(Protocol):
    """Adds punctuation to a final: ``text`` with marks inserted, every other character kept in
    order (``text_raw`` keeps the text without them). ``tokens`` are the final's (unit,
    begin_ms, end_ms) in the order of ``text``; times may be None."""

    def punctuate(self, text: str, tokens: Sequence[Token]) -> str: ...


@dataclass(frozen=True)
class PausePunctuator:
    """The rules: a gap between two tokens' times that exceeds the utterance's median gap by
    ``comma_pause_ms`` is a comma, by ``stop_pause_ms`` a full stop; a break after a question
    particle, or ending a sentence that holds an A-not-A question or a question word, is a
    question mark."""

    comma_pause_ms: int = 180
    stop_pause_ms: int = 600

    def punctuate(self, text: str, tokens: Sequence[Token]) -> str:
        if not text.strip():
            return text
        spans = _place(text, tokens)
        gaps = _gaps(tokens)
        usual = statistics.median([g for g in gaps if g is not None] or [0])
        breaks: dict[int, str] = {}  # text position (after a character) -> mark
        for i, gap in enumerate(gaps):
            here, after = spans[i], spans[i + 1]
            if gap is None or here is None or after is None:
                continue
            end = here[1]
            if text[end - 1] in _NUMERALS and text[after[0]] in _NUMERALS:
                continue
            if any(ch in MARKS for ch in text[end : after[0]]):
                continue  # the text has a mark there already
            pause = gap - usual
            if pause >= self.stop_pause_ms:
                breaks[end] = STOP
            elif pause >= self.comma_pause_ms:
                breaks[end] = COMMA
        if text[-1] not in MARKS:
            breaks[len(text.rstrip())] = STOP
        out, start, sentence = [], 0, ""
        for position in sorted(breaks):
            clause = text[start:position]
            sentence += clause
            out.append(clause)
            out.append(QUESTION if _is_question(clause, sentence, breaks[position]) else breaks[position])
            sentence = sentence if breaks[position] == COMMA else ""
            start = position
        out.append(text[start:])
        return "".join(out)


def _is_question(clause: str, sentence: str, mark: str) -> bool:
    """A clause that ends in a question particle, or a sentence (the clauses since the last
    full stop) that asks A-not-A or with a question word."""
    if clause.rstrip()[-1:] in _QUESTION_PARTICLES:
        return True
    return mark == STOP and any(cue in sentence for cue in _QUESTION_CUES)


def _place(text: str, tokens: Sequence[Token]) -> list[tuple[int, int] | None]:
    """Each token's characters in ``text`` (word-piece marks and spaces skipped); None where it
    is not found in order."""
    spans: list[tuple[int, int] | None] = []
    at = 0
    for unit, _, _ in tokens:
        piece = unit.replace("\u2581", "").strip()
        found = text.find(piece, at) if piece else -1
        if found < 0:
            spans.append(None)
            continue
        spans.append((found, found + len(piece)))
        at = found + len(piece)
    return spans


def _gaps(tokens: Sequence[Token]) -> list[int | None]:
    """ms from each token (its end, else its time) to the next one's begin; None where a time is missing."""
    gaps: list[int | None] = []
    for (_, begin, end), (_, next_begin, _) in itertools.pairwise(tokens):
        last = end if end is not None else begin
        gaps.append(None if last is None or next_begin is None else next_begin - last)
    return gaps


PUNCTUATORS: dict[str, Punctuator] = {"pauses": PausePunctuator()}
"""A route's ``punctuation:`` word -> its punctuator (``off`` is not listed: nothing is done)."""
