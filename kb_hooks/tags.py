"""Demand and category tags from rule files admins edit (市政设施/井盖, 供水/停水, 噪音扰民).

A rule fires when one of its ``phrases`` occurs (exact or homophone), one phrase of each
``all_of`` group occurs, or one of its ``patterns`` matches the normalized text.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from asr_common.yamlconf import ConfigError, locate, read_yaml, validate_data
from kb_hooks.matcher import Hit, MatchKind, PatternSpec, PhraseMatcher, PhraseSpec, normalized_phrase

RuleKind = Literal["demand", "category"]


class TagRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1)
    kind: RuleKind = "demand"
    phrases: list[str] = Field(default_factory=list)
    all_of: list[list[str]] = Field(default_factory=list)
    patterns: list[str] = Field(default_factory=list)
    homophones: bool = True


class TagRulesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    name: str | None = None
    rules: list[TagRule] = Field(default_factory=list)


@dataclass(frozen=True)
class TagMatch:
    kind: RuleKind
    label: str
    value: str  # the matched text
    begin: int
    end: int
    homophone: bool


class TagRules:
    """An immutable, loaded rule set; swap a whole new one in to change it."""

    def __init__(self, rules: list[TagRule], content_hash: str = "", source: str = "") -> None:
        self.rules = tuple(rules)
        self.content_hash = content_hash
        self.source = source
        phrases: list[PhraseSpec[tuple[int, int]]] = []
        patterns: list[PatternSpec[tuple[int, int]]] = []
        for i, rule in enumerate(self.rules):
            phrases.extend(PhraseSpec((i, -1), p, rule.homophones) for p in rule.phrases)
            for g, group in enumerate(rule.all_of):
                phrases.extend(PhraseSpec((i, g), p, rule.homophones) for p in group)
            patterns.extend(PatternSpec((i, -1), re.compile(p)) for p in rule.patterns)
        self._matcher = PhraseMatcher(phrases, patterns)

    def __len__(self) -> int:
        return len(self.rules)

    def match(self, text: str) -> list[TagMatch]:
        """One match per label that fires, exact preferred, in text order."""
        by_rule: dict[int, list[Hit[tuple[int, int]]]] = {}
        for hit in self._matcher.find(text):
            by_rule.setdefault(hit.payload[0], []).append(hit)
        out: list[TagMatch] = []
        for i, hits in by_rule.items():
            rule = self.rules[i]
            chosen = [h for h in hits if h.payload[1] == -1]
            if rule.all_of:
                groups = [[h for h in hits if h.payload[1] == g] for g in range(len(rule.all_of))]
                if all(groups):
                    picks = [min(g, key=lambda h: (h.kind == "homophone", h.begin)) for g in groups]
                    begin, end = min(h.begin for h in picks), max(h.end for h in picks)
                    kind: MatchKind = "homophone" if any(h.kind == "homophone" for h in picks) else "exact"
                    chosen.append(Hit((i, -1), kind, begin, end))
            if chosen:
                best = min(chosen, key=lambda h: (h.kind == "homophone", h.begin))
                value = text[best.begin : best.end]
                out.append(TagMatch(rule.kind, rule.label, value, best.begin, best.end, best.kind == "homophone"))
        out.sort(key=lambda t: (t.begin, t.label))
        return out


def load_tag_rules(path: Path | str) -> TagRules:
    """Load a YAML rule file; raise ConfigError with file:line messages."""
    path = Path(path)
    data, index = read_yaml(path)
    model = validate_data(path, data, TagRulesFile, index)
    errors: list[str] = []

    def where(*loc: str | int) -> str:
        return f"{locate(path, index, ('rules', *loc))}:"

    for i, rule in enumerate(model.rules):
        if not (rule.phrases or rule.all_of or rule.patterns):
            errors.append(f"{where(i)} rule {rule.label!r} has no phrases, all_of or patterns: it can never fire")
        for k, phrase in enumerate(rule.phrases):
            if not normalized_phrase(phrase):
                errors.append(f"{where(i, 'phrases', k)} phrase {phrase!r} is empty after normalization")
        for g, group in enumerate(rule.all_of):
            if not group or not all(normalized_phrase(p) for p in group):
                errors.append(f"{where(i, 'all_of', g)} every all_of group needs non-empty phrases")
        for p, pattern in enumerate(rule.patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                errors.append(f"{where(i, 'patterns', p)} invalid regular expression {pattern!r}: {exc}")
    if errors:
        raise ConfigError(errors)
    return TagRules(model.rules, hashlib.sha256(path.read_bytes()).hexdigest(), str(path))
