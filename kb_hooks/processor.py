"""Turns transcript updates into events: the (redacted) transcript, KB suggestions, tags and
the events of the registered features (``kb_hooks.features``: the work-order draft ...), and at
the end of a call its analytics (``call_analytics``).

The core (entities, redaction, KB, tags) runs first: every feature sees the published text. A
final is first rewritten by the features that rewrite (ITN, punctuation), and after the core's
events each feature with ``on_final`` adds its own, in registry order.

Runs on the engine's thread; pure CPU work on one utterance (two Aho-Corasick passes, a few
regular expressions), no I/O. Per-call state makes each KB entry appear once per call unless
its score improves, and lets a final confirm or withdraw what a partial suggested.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from kb_hooks.analytics_rules import AnalyticsRules, RecentAddresses
from kb_hooks.config import KbHooksSettings
from kb_hooks.entities import Entity, extract_entities, number_entities
from kb_hooks.events import (
    Alternative,
    CallAnalytics,
    Event,
    KbSuggestion,
    Span,
    SuggestionStatus,
    Tag,
    Tags,
    Token,
    TranscriptFinal,
    TranscriptPartial,
)
from kb_hooks.features import FEATURES, FinalStep, Registry
from kb_hooks.features import analytics as analytics_feature
from kb_hooks.kb import KbMatch, KnowledgeBase
from kb_hooks.redact import SENSITIVE_LABELS, Redacted, Redactor
from kb_hooks.reload import ReloadableRef, ReloadResult
from kb_hooks.tags import TagRules
from kb_hooks.types import CallContext, RedactionMode, TranscriptUpdate
from kb_hooks.workorder import StreetList

_TAGGED_ENTITIES = frozenset({"phone", "id_number", "address", "date", "time"})
_SCORE_EPSILON = 1e-6


@dataclass
class _Suggestion:
    status: SuggestionStatus
    score: float
    event: KbSuggestion  # the last event emitted for the entry, reused to build a withdrawal


@dataclass
class _CallState:
    suggestions: dict[str, _Suggestion] = field(default_factory=dict)
    # entries suggested on partials of an utterance and not yet confirmed or withdrawn
    pending: dict[tuple[Any, ...], set[str]] = field(default_factory=dict)
    tags_seen: set[tuple[str, str, str]] = field(default_factory=set)
    last_partial: dict[tuple[Any, ...], tuple[str, Redacted]] = field(default_factory=dict)
    features: dict[str, dict[str, Any]] = field(default_factory=dict)  # feature name -> its state (FinalStep.state)


class TranscriptProcessor:
    """``process(update)`` -> events to hand to ``Publisher.submit`` in order."""

    def __init__(
        self,
        kb: Mapping[str, ReloadableRef[KnowledgeBase]],
        tag_rules: Mapping[str, ReloadableRef[TagRules]],
        redaction: Redactor,
        *,
        mask_digit_runs: int = 7,
        max_suggestions_per_utterance: int = 3,
        tags_on_partials: bool = False,
        analytics_rules: Mapping[str, ReloadableRef[AnalyticsRules]] | None = None,
        street_lists: Mapping[str, ReloadableRef[StreetList]] | None = None,
        clock: Callable[[], float] = time.time,
        features: Registry = FEATURES,
        files: Mapping[str, Mapping[str, ReloadableRef[Any]]] | None = None,
    ) -> None:
        """``files``: the loaded files of ``features``' other file sets, by kind, then name."""
        self.features = features
        self.kb = dict(kb)
        self.tag_rules = dict(tag_rules)
        self.analytics_rules = dict(analytics_rules or {})
        self.street_lists = dict(street_lists or {})
        self.files: dict[str, dict[str, ReloadableRef[Any]]] = {
            **{kind: dict(refs) for kind, refs in (files or {}).items()},
            "kb": self.kb, "tags": self.tag_rules, "analytics": self.analytics_rules, "streets": self.street_lists,
        }  # fmt: skip
        self._rewrites = [f.rewrite for f in features if f.rewrite is not None]
        # (name, its files by name, on_final) of each feature that adds events to finals
        self._on_final = [
            (f.name, {name: ref for s in f.file_sets for name, ref in self.files.get(s.kind, {}).items()}, f.on_final)
            for f in features
            if f.on_final is not None
        ]
        self.clock = clock  # unix s: when a call gave an address (repeat_address categories)
        self._recent_addresses = RecentAddresses()
        self.redactor = redaction
        self.mask_digit_runs = mask_digit_runs
        self.max_suggestions = max_suggestions_per_utterance
        self.tags_on_partials = tags_on_partials
        self._calls: dict[str, _CallState] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: KbHooksSettings, features: Registry = FEATURES) -> TranscriptProcessor:
        """Load every file of ``features``' file sets; a broken file raises ConfigError (file:line)."""
        refs: dict[str, dict[str, ReloadableRef[Any]]] = {
            file_set.kind: {name: ReloadableRef(path, file_set.load) for name, path in file_set.paths(settings).items()}
            for file_set in features.file_sets()
        }
        return cls(
            refs.pop("kb", {}),
            refs.pop("tags", {}),
            Redactor(settings.hash_key.get_secret_value().encode()),
            mask_digit_runs=settings.mask_digit_runs,
            max_suggestions_per_utterance=settings.max_suggestions_per_utterance,
            tags_on_partials=settings.tags_on_partials,
            analytics_rules=refs.pop("analytics", {}),
            street_lists=refs.pop("streets", {}),
            features=features,
            files=refs,
        )

    def _files(self) -> dict[str, ReloadableRef[Any]]:
        return {f"{kind}:{name}": ref for kind, refs in self.files.items() for name, ref in refs.items()}

    def reload_all(self) -> dict[str, ReloadResult]:
        """Reload every changed file (SIGHUP); keys are ``KIND:NAME`` (``kb:hotline``, ``tags:NAME``,
        ``analytics:NAME``, ``streets:NAME``: the kinds of the features' file sets)."""
        return {key: ref.try_reload() for key, ref in self._files().items()}

    def content_hashes(self) -> dict[str, str]:
        """The sha256 of every file in force (keys as in ``reload_all``)."""
        return {key: ref.content_hash for key, ref in self._files().items()}

    def end_call(self, call_id: str) -> None:
        """Forget a call's suggestion and tag state."""
        with self._lock:
            self._calls.pop(call_id, None)

    def active_calls(self) -> int:
        return len(self._calls)

    def process(self, update: TranscriptUpdate) -> list[Event]:
        ctx = update.call
        if not update.is_partial and update.text_raw is None:
            update = self._rewritten(update)
        with self._lock:  # the call's state is made once, not built and dropped for every event
            state = self._calls.get(ctx.call_id)
            if state is None:
                state = self._calls[ctx.call_id] = _CallState()
        utterance = (*update.participant.key(), update.utterance_id)
        last = state.last_partial.get(utterance)
        if update.is_partial and last is not None and last[0] == update.text:
            # The engine repeats a partial while nothing new is decoded: same matches, skip them.
            return [self._transcript(update, last[1])]
        # A partial's entities serve its redaction (numbers) and, only with tags_on_partials, its tags.
        find = number_entities if update.is_partial and not self.tags_on_partials else extract_entities
        entities = find(update.text, self.mask_digit_runs)
        redacted = self.redactor.redact(update.text, entities, ctx.redaction)
        if update.is_partial:
            state.last_partial[utterance] = (update.text, redacted)
        else:
            state.last_partial.pop(utterance, None)
        events: list[Event] = [self._transcript(update, redacted)]
        events.extend(self._suggestions(update, redacted, state))
        if not update.is_partial or self.tags_on_partials:
            tags = self._tags(update, entities, redacted, state)
            if tags is not None:
                events.append(tags)
        if not update.is_partial:
            for name, files, on_final in self._on_final:
                step = FinalStep(update, entities, events, files, state.features.setdefault(name, {}))
                events.extend(on_final(step))
        return events

    def _rewritten(self, final: TranscriptUpdate) -> TranscriptUpdate:
        """The final as its route writes it (the rewriting features in order: ITN, punctuation ...);
        where one of them rewrote it, ``text_raw`` keeps the engine's text."""
        update = final
        for rewrite in self._rewrites:
            update = rewrite(update)
        return update if update is final else replace(update, text_raw=final.text)

    def call_analytics(self, ctx: CallContext, duration_ms: int) -> CallAnalytics | None:
        """The call's ``call.analytics`` (publish it before ``call.ended``), None where its route
        names no analytics rule set; ``duration_ms``: the longest leg's audio."""
        if ctx.analytics_rules is None:
            return None
        with self._lock:
            state = self._calls.get(ctx.call_id, _CallState())
        kept = state.features.get(analytics_feature.FEATURE.name, {})
        rules = self.analytics_rules.get(ctx.analytics_rules)
        return analytics_feature.call_analytics(ctx, kept, duration_ms, rules, self._recent_addresses, self.clock)

    def _transcript(self, update: TranscriptUpdate, redacted: Redacted) -> TranscriptPartial | TranscriptFinal:
        if redacted.replacements:
            texts = self.redactor.redact_tokens(update.text, [t[0] for t in update.tokens], redacted)
            tokens = tuple(Token(text, t[1], t[2]) for text, t in zip(texts, update.tokens, strict=True))
        else:
            tokens = tuple(map(Token._make, update.tokens))  # (text, begin_ms, end_ms) each, as they came
        text_raw = self._redact_text(update.text_raw, update.call) if update.text_raw is not None else None
        make: type[TranscriptPartial] | partial[TranscriptFinal] = TranscriptPartial
        if not update.is_partial:
            nbest = tuple(
                Alternative(redacted.text if text == update.text else self._redact_text(text, update.call), score)
                for text, score in update.nbest
            )
            make = partial(
                TranscriptFinal, nbest=nbest, reduced_search=update.reduced_search, reduced_reason=update.reduced_reason
            )
        return make(
            call=update.call,
            participant=update.participant,
            utterance_id=update.utterance_id,
            text=redacted.text,
            begin_offset_ms=update.begin_offset_ms,
            end_offset_ms=update.end_offset_ms,
            tokens=tokens,
            confidence=update.confidence,
            latency_ms=update.latency_ms,
            text_raw=text_raw,
            chunk_ms=update.chunk_ms,
        )

    def _redact_text(self, text: str, ctx: CallContext) -> str:
        """``text`` as published (redaction hides numbers only: no need for places, dates, times)."""
        return self.redactor.redact(text, number_entities(text, self.mask_digit_runs), ctx.redaction).text

    def _span(self, redacted: Redacted, begin: int, end: int) -> Span:
        return Span(redacted.map_offset(begin), redacted.map_offset(end))

    def _suggestion_event(
        self, update: TranscriptUpdate, redacted: Redacted, match: KbMatch, status: SuggestionStatus
    ) -> KbSuggestion:
        span = self._span(redacted, match.begin, match.end)
        return KbSuggestion(
            call=update.call,
            participant=update.participant,
            utterance_id=update.utterance_id,
            is_partial=update.is_partial,
            entry_id=match.entry.id,
            title=match.entry.title,
            score=match.score,
            status=status,
            match_kind=match.kind,
            homophone=match.homophone,
            matched_text=redacted.text[span.begin : span.end],
            span=span,
            priority=match.entry.priority,
            entry_tags=tuple(match.entry.tags),
            summary=match.entry.summary,
            url=match.entry.url,
        )

    def _suggestions(self, update: TranscriptUpdate, redacted: Redacted, state: _CallState) -> list[KbSuggestion]:
        ref = self.kb.get(update.call.kb_set) if update.call.kb_set else None
        if ref is None:
            return []
        matches = ref.get().match(update.text)[: self.max_suggestions]
        utterance = (*update.participant.key(), update.utterance_id)
        out: list[KbSuggestion] = []
        for match in matches:
            previous = state.suggestions.get(match.entry.id)
            if update.is_partial:
                if previous is not None and previous.status != "withdrawn":
                    improves = previous.status == "suggested" and match.score > previous.score + _SCORE_EPSILON
                    if not improves:
                        continue
                status: SuggestionStatus = "suggested"
                state.pending.setdefault(utterance, set()).add(match.entry.id)
            else:
                if (
                    previous is not None
                    and previous.status == "confirmed"
                    and match.score <= previous.score + _SCORE_EPSILON
                ):
                    continue
                status = "confirmed"
            event = self._suggestion_event(update, redacted, match, status)
            state.suggestions[match.entry.id] = _Suggestion(status, match.score, event)
            out.append(event)
        if not update.is_partial:
            matched = {m.entry.id for m in matches}
            for entry_id in sorted(state.pending.pop(utterance, set()) - matched):
                out.extend(self._withdraw(update, state, entry_id))
        return out

    def _withdraw(self, update: TranscriptUpdate, state: _CallState, entry_id: str) -> list[KbSuggestion]:
        previous = state.suggestions.get(entry_id)
        if previous is None or previous.status != "suggested":
            return []
        event = previous.event.withdrawn(update.call, update.participant, update.utterance_id)
        previous.status, previous.event = "withdrawn", event
        return [event]

    def _tags(
        self, update: TranscriptUpdate, entities: list[Entity], redacted: Redacted, state: _CallState
    ) -> Tags | None:
        tags: list[Tag] = []
        for name in update.call.tag_rules:
            ref = self.tag_rules.get(name)
            if ref is None:
                continue
            for match in ref.get().match(update.text):
                if (match.kind, match.label, "") in state.tags_seen:
                    continue
                state.tags_seen.add((match.kind, match.label, ""))
                span = self._span(redacted, match.begin, match.end)
                value = redacted.text[span.begin : span.end]
                tags.append(Tag(match.kind, match.label, value, None, span, match.homophone, redacted=False))
        for entity in entities:
            if entity.label not in _TAGGED_ENTITIES or ("entity", entity.label, entity.normalized) in state.tags_seen:
                continue
            state.tags_seen.add(("entity", entity.label, entity.normalized))
            hidden = entity.label in SENSITIVE_LABELS and update.call.redaction is not RedactionMode.KEEP
            tags.append(
                Tag(
                    "entity",
                    entity.label,
                    self.redactor.published_value(entity, update.call.redaction),
                    None if hidden else entity.normalized,
                    self._span(redacted, entity.begin, entity.end),
                    homophone=False,
                    redacted=hidden,
                )
            )
        if not tags:
            return None
        return Tags(
            call=update.call,
            participant=update.participant,
            utterance_id=update.utterance_id,
            is_partial=update.is_partial,
            tags=tuple(tags),
        )
