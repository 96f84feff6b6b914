"""A route's analytics rules: checks every call should pass and categories a call may fall into.

The rules file (YAML, ``kb_hooks.analytics_rule_sets``; a route names one with
``analytics_rules``) lists

* ``checks``: ``greeting`` (a phrase by ``party`` within ``within_s`` of the start),
  ``closing`` (a phrase by ``party`` within the last ``last_s`` of the call),
  ``address_read_back`` (``party`` repeats an address the other party gave), and
  ``forbidden_words`` (none of ``words`` said by ``party``, or by anyone);
* ``categories``: ``phrases`` (one of ``phrases``, or one phrase of each ``all_of`` group, said
  by ``party``, e.g. asks for a supervisor) and ``repeat_address`` (an address of this call was
  given in an earlier call of the same rule set within ``within_h`` hours; remembered by this
  process only, up to ``RecentAddresses.capacity`` addresses).

Phrases match like the tag rules' (normalized text, homophones of two or more Chinese
characters). ``evaluate`` is pure; the caller hands it the finals and what earlier calls said.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from asr_common.yamlconf import ConfigError, locate, read_yaml, validate_data
from kb_hooks.analytics import AnalyzedFinal
from kb_hooks.events import CategoryHit, RuleCheck
from kb_hooks.matcher import normalized_phrase
from kb_hooks.tags import TagRule, TagRules

Party = Literal["caller", "agent"]
_Id = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = _Id


class GreetingCheck(_Rule):
    kind: Literal["greeting"]
    party: Party = "agent"
    phrases: list[str] = Field(min_length=1)
    within_s: float = Field(10.0, gt=0)


class ClosingCheck(_Rule):
    kind: Literal["closing"]
    party: Party = "agent"
    phrases: list[str] = Field(min_length=1)
    last_s: float = Field(30.0, gt=0)


class AddressReadBackCheck(_Rule):
    kind: Literal["address_read_back"]
    party: Party = "agent"


class ForbiddenWordsCheck(_Rule):
    kind: Literal["forbidden_words"]
    party: Party | None = None  # None: anyone
    words: list[str] = Field(min_length=1)


class PhrasesCategory(_Rule):
    kind: Literal["phrases"]
    label: str = Field(min_length=1)
    party: Party | None = None
    phrases: list[str] = Field(default_factory=list)
    all_of: list[list[str]] = Field(default_factory=list)


class RepeatAddressCategory(_Rule):
    kind: Literal["repeat_address"]
    label: str = Field(min_length=1)
    within_h: float = Field(72.0, gt=0)


Check = Annotated[
    GreetingCheck | ClosingCheck | AddressReadBackCheck | ForbiddenWordsCheck, Field(discriminator="kind")
]
Category = Annotated[PhrasesCategory | RepeatAddressCategory, Field(discriminator="kind")]


class AnalyticsRulesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    name: str | None = None
    checks: list[Check] = Field(default_factory=list)
    categories: list[Category] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Found:
    utterance: AnalyzedFinal
    phrase: str


class AnalyticsRules:
    """A loaded, immutable rules file; ``evaluate`` applies it to one call."""

    def __init__(self, model: AnalyticsRulesFile, content_hash: str = "", source: str = "") -> None:
        self.checks = tuple(model.checks)
        self.categories = tuple(model.categories)
        self.content_hash = content_hash
        self.source = source
        rules: list[TagRule] = []
        for rule in (*self.checks, *self.categories):
            if isinstance(rule, GreetingCheck | ClosingCheck):
                rules.append(TagRule(label=rule.id, kind="category", phrases=rule.phrases))
            elif isinstance(rule, ForbiddenWordsCheck):
                rules.append(TagRule(label=rule.id, kind="category", phrases=rule.words))
            elif isinstance(rule, PhrasesCategory):
                rules.append(TagRule(label=rule.id, kind="category", phrases=rule.phrases, all_of=rule.all_of))
        self._phrases = TagRules(rules)

    @property
    def repeat_window_h(self) -> float | None:
        """The longest ``repeat_address`` window (h), None without such a category."""
        windows = [c.within_h for c in self.categories if isinstance(c, RepeatAddressCategory)]
        return max(windows) if windows else None

    def evaluate(
        self, utterances: Sequence[AnalyzedFinal], duration_ms: int, earlier_addresses: Mapping[str, float]
    ) -> tuple[tuple[RuleCheck, ...], tuple[CategoryHit, ...]]:
        """The checks and the categories that apply, for a call of ``duration_ms``;
        ``earlier_addresses``: normalized address -> hours since an earlier call gave it."""
        ordered = sorted(utterances, key=lambda u: (u.begin_ms, u.role, u.utterance_id))
        found: dict[str, list[_Found]] = {}
        for utterance in ordered:
            for match in self._phrases.match(utterance.text):
                found.setdefault(match.label, []).append(_Found(utterance, match.value))
        checks = tuple(self._check(rule, ordered, found, duration_ms) for rule in self.checks)
        categories: list[CategoryHit] = []
        for category in self.categories:
            hit = self._category(category, ordered, found, earlier_addresses)
            if hit is not None:
                categories.append(hit)
        return checks, tuple(categories)

    def _check(
        self, rule: Check, ordered: Sequence[AnalyzedFinal], found: Mapping[str, list[_Found]], duration_ms: int
    ) -> RuleCheck:
        hits = [f for f in found.get(rule.id, []) if rule.party is None or f.utterance.role == rule.party]
        if isinstance(rule, GreetingCheck):
            hit = next((f for f in hits if f.utterance.begin_ms <= rule.within_s * 1000), None)
            return _result(rule, hit is not None, hit)
        if isinstance(rule, ClosingCheck):
            hit = next((f for f in reversed(hits) if f.utterance.end_ms >= duration_ms - rule.last_s * 1000), None)
            return _result(rule, hit is not None, hit)
        if isinstance(rule, ForbiddenWordsCheck):
            first = hits[0] if hits else None
            return _result(rule, first is None, first)
        return _read_back(rule, ordered)

    def _category(
        self,
        rule: Category,
        ordered: Sequence[AnalyzedFinal],
        found: Mapping[str, list[_Found]],
        earlier_addresses: Mapping[str, float],
    ) -> CategoryHit | None:
        if isinstance(rule, PhrasesCategory):
            hit = next(
                (f for f in found.get(rule.id, []) if rule.party is None or f.utterance.role == rule.party), None
            )
            if hit is None:
                return None
            u = hit.utterance
            return CategoryHit(rule.id, rule.label, u.role, u.utterance_id, u.begin_ms, hit.phrase)
        for u in ordered:
            for address in u.addresses:
                if earlier_addresses.get(address, rule.within_h + 1) <= rule.within_h:
                    return CategoryHit(rule.id, rule.label, u.role, u.utterance_id, u.begin_ms, address)
        return None


def _result(rule: Check, passed: bool, hit: _Found | None) -> RuleCheck:
    if hit is None:
        return RuleCheck(rule.id, rule.kind, passed, None, None, None, None)
    u = hit.utterance
    return RuleCheck(rule.id, rule.kind, passed, u.role, u.utterance_id, u.begin_ms, hit.phrase)


def _read_back(rule: AddressReadBackCheck, ordered: Sequence[AnalyzedFinal]) -> RuleCheck:
    """Passed when ``rule.party`` says an address (normalized) after the other party gave it;
    None when the other party gave none."""
    given: list[tuple[int, str]] = [
        (u.begin_ms, a) for u in ordered if u.role not in (rule.party, "mixed") for a in u.addresses
    ]
    if not given:
        return RuleCheck(rule.id, rule.kind, None, None, None, None, None)
    for u in ordered:
        if u.role != rule.party:
            continue
        text = normalized_phrase(u.text)
        for said_at, address in given:
            if said_at <= u.begin_ms and normalized_phrase(address) in text:
                return RuleCheck(rule.id, rule.kind, True, u.role, u.utterance_id, u.begin_ms, address)
    return RuleCheck(rule.id, rule.kind, False, None, None, None, None)


def load_analytics_rules(path: Path | str) -> AnalyticsRules:
    """Load a rules file; ConfigError with ``file:line`` messages (unknown kind, duplicate id,
    a phrase that normalizes to nothing)."""
    path = Path(path)
    data, index = read_yaml(path)
    model = validate_data(path, data, AnalyticsRulesFile, index)
    errors: list[str] = []
    seen: dict[str, tuple[str | int, ...]] = {}
    for section, rules in (("checks", model.checks), ("categories", model.categories)):
        for i, rule in enumerate(rules):
            where = locate(path, index, (section, i, "id"))
            if rule.id in seen:
                first = locate(path, index, seen[rule.id])
                errors.append(f"{where}: id {rule.id!r} is used twice (first at {first}); give each rule its own")
            seen.setdefault(rule.id, (section, i, "id"))
            phrases = _phrases_of(rule)
            for k, phrase in enumerate(phrases):
                if not normalized_phrase(phrase):
                    errors.append(f"{where}: phrase {k} {phrase!r} is empty after normalization")
            if isinstance(rule, PhrasesCategory) and not (rule.phrases or rule.all_of):
                errors.append(f"{where}: category {rule.id!r} has no phrases or all_of: it can never apply")
    if errors:
        raise ConfigError(errors)
    return AnalyticsRules(model, hashlib.sha256(path.read_bytes()).hexdigest(), str(path))


def _phrases_of(rule: Check | Category) -> list[str]:
    if isinstance(rule, GreetingCheck | ClosingCheck):
        return rule.phrases
    if isinstance(rule, ForbiddenWordsCheck):
        return rule.words
    if isinstance(rule, PhrasesCategory):
        return [*rule.phrases, *(p for group in rule.all_of for p in group)]
    return []


class RecentAddresses:
    """Addresses earlier calls gave, per rule set, with when (unix s); the oldest forgotten first.

    In memory: a restart forgets them, and each gateway knows only its own calls.
    """

    capacity = 100_000

    def __init__(self) -> None:
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def hours_since(self, rule_set: str, addresses: Iterable[str], now: float) -> dict[str, float]:
        """Address -> hours since an earlier call of ``rule_set`` gave it, for those ever given."""
        out: dict[str, float] = {}
        for address in addresses:
            at = self._seen.get((rule_set, address))
            if at is not None:
                out[address] = (now - at) / 3600
        return out

    def remember(self, rule_set: str, addresses: Iterable[str], now: float) -> None:
        for address in addresses:
            key = (rule_set, address)
            self._seen.pop(key, None)
            self._seen[key] = now
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
