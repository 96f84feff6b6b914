"""Knowledge base: entries admins edit (YAML or CSV) and the matcher that suggests them.

An entry is suggested when any of its ``keywords`` occurs in an utterance, when one phrase of
each ``all_of`` group occurs anywhere in it (井盖 ... 破损), or when one of its ``patterns``
matches the normalized text. Scores: exact keyword 1.0, pattern 0.9, exact all_of 0.85,
homophone keyword 0.7, all_of with a homophone 0.6; ties are broken by ``priority``.
"""

from __future__ import annotations

import csv
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from asr_common.yamlconf import ConfigError, format_validation_error, locate, read_yaml, validate_data
from kb_hooks.events import SuggestionKind
from kb_hooks.matcher import Hit, PatternSpec, PhraseMatcher, PhraseSpec, normalized_phrase

SCORES: dict[tuple[SuggestionKind, bool], float] = {
    ("keyword", False): 1.0,
    ("pattern", False): 0.9,
    ("all_of", False): 0.85,
    ("keyword", True): 0.7,
    ("all_of", True): 0.6,
}
CSV_LIST_SEPARATOR = "|"


class KbEntry(BaseModel):
    """One procedure, answer or script the agent should see."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    title: str = Field(min_length=1)
    keywords: list[str] = Field(default_factory=list)
    all_of: list[list[str]] = Field(default_factory=list)
    patterns: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    priority: int = Field(0, ge=0, le=100)
    summary: str = ""
    url: str | None = None
    homophones: bool = True


class KbFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    name: str | None = None
    entries: list[KbEntry] = Field(default_factory=list)


@dataclass(frozen=True)
class KbMatch:
    """The best way one entry matched one utterance."""

    entry: KbEntry
    score: float
    kind: SuggestionKind
    homophone: bool
    begin: int  # span in the utterance text, characters [begin, end)
    end: int


_PhrasePayload = tuple[int, int]  # (entry index, -1 for keywords or the all_of group index)


def _check_entries(path: Path | str, entries: Sequence[KbEntry], where: Any) -> list[str]:
    """Semantic checks pydantic cannot do; ``where(i, *keys)`` gives an error prefix."""
    errors: list[str] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.id in seen:
            errors.append(f"{where(i, 'id')} duplicate id {entry.id!r} (first used by entry {seen[entry.id]})")
        seen.setdefault(entry.id, i)
        if not (entry.keywords or entry.all_of or entry.patterns):
            errors.append(f"{where(i)} entry {entry.id!r} has no keywords, all_of or patterns: it can never match")
        for k, keyword in enumerate(entry.keywords):
            if not normalized_phrase(keyword):
                errors.append(f"{where(i, 'keywords', k)} keyword {keyword!r} is empty after normalization")
        for g, group in enumerate(entry.all_of):
            if not group or not all(normalized_phrase(p) for p in group):
                errors.append(f"{where(i, 'all_of', g)} every all_of group needs non-empty phrases")
        for p, pattern in enumerate(entry.patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                errors.append(f"{where(i, 'patterns', p)} invalid regular expression {pattern!r}: {exc}")
    return errors


class KnowledgeBase:
    """An immutable, loaded KB; swap a whole new one in to change it (see ReloadableRef)."""

    def __init__(self, entries: Sequence[KbEntry], content_hash: str = "", source: str = "") -> None:
        self.entries = tuple(entries)
        self.content_hash = content_hash
        self.source = source
        phrases: list[PhraseSpec[_PhrasePayload]] = []
        patterns: list[PatternSpec[_PhrasePayload]] = []
        for i, entry in enumerate(self.entries):
            phrases.extend(PhraseSpec((i, -1), kw, entry.homophones) for kw in entry.keywords)
            for g, group in enumerate(entry.all_of):
                phrases.extend(PhraseSpec((i, g), p, entry.homophones) for p in group)
            patterns.extend(PatternSpec((i, -1), re.compile(p)) for p in entry.patterns)
        self._matcher = PhraseMatcher(phrases, patterns)

    def __len__(self) -> int:
        return len(self.entries)

    def match(self, text: str) -> list[KbMatch]:
        """Best match per entry, best first (score, then priority)."""
        by_entry: dict[int, list[Hit[_PhrasePayload]]] = {}
        for hit in self._matcher.find(text):
            by_entry.setdefault(hit.payload[0], []).append(hit)
        matches = [m for i, hits in by_entry.items() if (m := self._best(self.entries[i], hits)) is not None]
        matches.sort(key=lambda m: (-m.score, -m.entry.priority, m.begin))
        return matches

    @staticmethod
    def _best(entry: KbEntry, hits: list[Hit[_PhrasePayload]]) -> KbMatch | None:
        candidates: list[KbMatch] = []
        for hit in hits:
            if hit.payload[1] != -1:
                continue
            kind: SuggestionKind = "pattern" if hit.kind == "pattern" else "keyword"
            homophone = hit.kind == "homophone"
            candidates.append(KbMatch(entry, SCORES[(kind, homophone)], kind, homophone, hit.begin, hit.end))
        if entry.all_of:
            chosen: list[Hit[_PhrasePayload]] = []
            for g in range(len(entry.all_of)):
                group_hits = [h for h in hits if h.payload[1] == g]
                if not group_hits:
                    break
                chosen.append(min(group_hits, key=lambda h: (h.kind != "exact", h.begin)))
            else:
                homophone = any(h.kind == "homophone" for h in chosen)
                begin, end = min(h.begin for h in chosen), max(h.end for h in chosen)
                candidates.append(KbMatch(entry, SCORES[("all_of", homophone)], "all_of", homophone, begin, end))
        if not candidates:
            return None
        return max(candidates, key=lambda m: (m.score, -(m.end - m.begin)))


def _file_hash(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc}"]) from None


def _load_yaml(path: Path) -> list[KbEntry]:
    data, index = read_yaml(path)
    model = validate_data(path, data, KbFile, index)

    def where(i: int, *keys: str | int) -> str:
        return f"{locate(path, index, ('entries', i, *keys))}:"

    errors = _check_entries(path, model.entries, where)
    if errors:
        raise ConfigError(errors)
    return model.entries


_CSV_LIST_FIELDS = ("keywords", "patterns", "tags")


def _load_csv(path: Path) -> list[KbEntry]:
    """CSV with a header row; list columns use '|' between items; all_of groups use ';' between groups."""
    errors: list[str] = []
    entries: list[KbEntry] = []
    rows: list[int] = []
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh)
            known = set(KbEntry.model_fields)
            unknown = [c for c in reader.fieldnames or [] if c not in known]
            if unknown:
                allowed = ", ".join(KbEntry.model_fields)
                raise ConfigError([f"{path}:1 unknown column(s) {', '.join(unknown)}; allowed: {allowed}"])
            for row in reader:
                line = reader.line_num
                record: dict[str, Any] = {k: v.strip() for k, v in row.items() if k is not None and v not in (None, "")}
                for name in _CSV_LIST_FIELDS:
                    if name in record:
                        record[name] = [x.strip() for x in record[name].split(CSV_LIST_SEPARATOR) if x.strip()]
                if "all_of" in record:
                    record["all_of"] = [
                        [x.strip() for x in group.split(CSV_LIST_SEPARATOR) if x.strip()]
                        for group in record["all_of"].split(";")
                    ]
                try:
                    entries.append(KbEntry.model_validate(record))
                    rows.append(line)
                except ValidationError as exc:
                    errors.extend(
                        f"{path}:{line} (row {line - 1}) {msg.split(' ', 1)[1]}"
                        for msg in format_validation_error(path, exc, {})
                    )
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError([f"{path}: cannot read CSV: {exc}"]) from None

    def where(i: int, *keys: str | int) -> str:
        return f"{path}:{rows[i]} (row {rows[i] - 1}) {'.'.join(str(k) for k in keys) or 'entry'}:"

    errors.extend(_check_entries(path, entries, where))
    if errors:
        raise ConfigError(errors)
    return entries


def load_kb(path: Path | str) -> KnowledgeBase:
    """Load a KB from ``.yaml``/``.yml`` or ``.csv``; raise ConfigError with file:line messages."""
    path = Path(path)
    content_hash = _file_hash(path)
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        entries = _load_yaml(path)
    elif suffix == ".csv":
        entries = _load_csv(path)
    else:
        raise ConfigError([f"{path}: unknown KB format {suffix!r}; use .yaml, .yml or .csv"])
    return KnowledgeBase(entries, content_hash=content_hash, source=str(path))
