"""Phrase matching shared by the KB and the tag rules: exact (Aho-Corasick on normalized text),
homophone (Aho-Corasick on toneless pinyin) and regular expressions.

Mandarin ASR errors are mostly homophones (警盖 for 井盖), so a phrase of two or more Chinese
characters also matches any text with the same toneless pinyin. Exact beats homophone in the
scores the callers give.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, Literal, TypeVar

import ahocorasick

from kb_hooks.normalize import Normalized, normalize, phrase_readings, pinyin_keys

PayloadT = TypeVar("PayloadT", bound=Hashable)
MatchKind = Literal["exact", "homophone", "pattern"]

_SEP = "|"
_CJK = re.compile(r"[\u3400-\u9fff]")


@dataclass(frozen=True)
class Hit(Generic[PayloadT]):
    """One occurrence of a phrase or pattern; ``begin``/``end`` index the original text."""

    payload: PayloadT
    kind: MatchKind
    begin: int
    end: int


@dataclass(frozen=True)
class PhraseSpec(Generic[PayloadT]):
    payload: PayloadT
    phrase: str
    homophones: bool = True


@dataclass(frozen=True)
class PatternSpec(Generic[PayloadT]):
    payload: PayloadT
    pattern: re.Pattern[str]


def normalized_phrase(phrase: str) -> str:
    """The form a phrase is matched in; empty when it has nothing matchable."""
    return normalize(phrase).text


def _pinyin_string(keys: Sequence[str]) -> str:
    return _SEP + _SEP.join(keys) + _SEP


@dataclass(frozen=True)
class Prepared:
    """A text in the forms the automatons search; shared by the KB and every tag rule set."""

    norm: Normalized  # numerals as digits, for exact phrases and patterns
    plain: Normalized  # numerals kept, for pinyin
    haystack: str  # "|wo|jin|tian|..." pinyin of ``plain``
    token_at_end: dict[int, int]  # haystack position of the separator closing token i -> i


@lru_cache(maxsize=4096)
def prepare(text: str) -> Prepared:
    """Normalize and transliterate once per distinct text (partials repeat, KB and tags share)."""
    plain = normalize(text, numerals=False)
    keys = pinyin_keys(plain.text)
    token_at_end: dict[int, int] = {}
    pos = 0
    for index, key in enumerate(keys):
        pos += len(_SEP) + len(key)
        token_at_end[pos] = index
    return Prepared(normalize(text), plain, _pinyin_string(keys), token_at_end)


class PhraseMatcher(Generic[PayloadT]):
    """Finds every phrase and pattern occurrence in a text (one pass per automaton)."""

    def __init__(self, phrases: Sequence[PhraseSpec[PayloadT]], patterns: Sequence[PatternSpec[PayloadT]] = ()) -> None:
        self._exact: ahocorasick.Automaton | None = None
        self._pinyin: ahocorasick.Automaton | None = None
        exact: dict[str, list[PayloadT]] = {}
        sounds: dict[str, list[PayloadT]] = {}
        for spec in phrases:
            key = normalized_phrase(spec.phrase)
            if not key:
                continue
            exact.setdefault(key, []).append(spec.payload)
            plain = normalize(spec.phrase, numerals=False).text
            if spec.homophones and len(_CJK.findall(plain)) >= 2:
                for reading in phrase_readings(plain):
                    sounds.setdefault(_pinyin_string(reading), []).append(spec.payload)
        if exact:
            self._exact = ahocorasick.Automaton()
            for key, payloads in exact.items():
                self._exact.add_word(key, (len(key), tuple(payloads)))
            self._exact.make_automaton()
        if sounds:
            self._pinyin = ahocorasick.Automaton()
            for key, payloads in sounds.items():
                self._pinyin.add_word(key, (key.count(_SEP) - 1, tuple(payloads)))
            self._pinyin.make_automaton()
        self._patterns = list(patterns)

    def find(self, text: str) -> list[Hit[PayloadT]]:
        """All hits in ``text``; a homophone hit on the same span as an exact hit of the same payload is dropped."""
        hits: list[Hit[PayloadT]] = []
        prepared = prepare(text)
        norm = prepared.norm
        if self._exact is not None and norm.text:
            for end, (length, payloads) in self._exact.iter(norm.text):
                begin, stop = norm.original_span(end - length + 1, end + 1)
                hits.extend(Hit(p, "exact", begin, stop) for p in payloads)
        if self._pinyin is not None:
            hits.extend(self._homophone_hits(prepared, {(h.payload, h.begin, h.end) for h in hits}))
        if self._patterns and norm.text:
            hits.extend(self._pattern_hits(norm))
        return hits

    def _homophone_hits(self, prepared: Prepared, exact: set[tuple[PayloadT, int, int]]) -> list[Hit[PayloadT]]:
        assert self._pinyin is not None
        plain, haystack, token_at_end = prepared.plain, prepared.haystack, prepared.token_at_end
        if not plain.text:
            return []
        out: list[Hit[PayloadT]] = []
        for end, (count, payloads) in self._pinyin.iter(haystack):
            last = token_at_end[end]
            begin, stop = plain.original_span(last - count + 1, last + 1)
            out.extend(Hit(p, "homophone", begin, stop) for p in payloads if (p, begin, stop) not in exact)
        return out

    def _pattern_hits(self, norm: Normalized) -> list[Hit[PayloadT]]:
        out: list[Hit[PayloadT]] = []
        for spec in self._patterns:
            for m in spec.pattern.finditer(norm.text):
                if m.end() > m.start():
                    begin, stop = norm.original_span(m.start(), m.end())
                    out.append(Hit(spec.payload, "pattern", begin, stop))
        return out
