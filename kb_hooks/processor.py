"""Turns transcript updates into events: the (redacted) transcript, KB suggestions, tags and
the work-order draft, and at the end of a call its analytics (``call_analytics``).

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

from asr_common.itn import normalize_numbers, normalize_tokens
from asr_common.punctuation import PUNCTUATORS
from kb_hooks.analytics import Utterance, measure, spoken_chars
from kb_hooks.analytics_rules import AnalyticsRules, RecentAddresses, load_analytics_rules
from kb_hooks.config import KbHooksSettings
from kb_hooks.entities import Entity, extract_entities, number_entities
from kb_hooks.events import (
    Alternative,
    CallAnalytics,
    CategoryHit,
    Event,
    KbSuggestion,
    RuleCheck,
    Span,
    SuggestionStatus,
    Tag,
    Tags,
    Token,
    TranscriptFinal,
    TranscriptPartial,
    WorkorderUpdated,
)
from kb_hooks.kb import KbMatch, KnowledgeBase, load_kb
from kb_hooks.redact import SENSITIVE_LABELS, Redacted, Redactor
from kb_hooks.reload import ReloadableRef, ReloadResult
from kb_hooks.tags import TagRules, load_tag_rules
from kb_hooks.types import CallContext, RedactionMode, TranscriptUpdate
from kb_hooks.workorder import StreetList, WorkorderDraft, load_street_list

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
    finals: list[Utterance] = field(default_factory=list)  # kept for call.analytics where the route wants it
    draft: WorkorderDraft | None = None  # where the route wants a work order


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
    ) -> None:
        self.kb = dict(kb)
        self.tag_rules = dict(tag_rules)
        self.analytics_rules = dict(analytics_rules or {})
        self.street_lists = dict(street_lists or {})
        self.clock = clock  # unix s: when a call gave an address (repeat_address categories)
        self._recent_addresses = RecentAddresses()
        self.redactor = redaction
        self.mask_digit_runs = mask_digit_runs
        self.max_suggestions = max_suggestions_per_utterance
        self.tags_on_partials = tags_on_partials
        self._calls: dict[str, _CallState] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: KbHooksSettings) -> TranscriptProcessor:
        """Load every configured KB and rule set; a broken file raises ConfigError (file:line)."""
        return cls(
            {name: ReloadableRef(path, load_kb) for name, path in settings.kb_sets.items()},
            {name: ReloadableRef(path, load_tag_rules) for name, path in settings.tag_rule_sets.items()},
            Redactor(settings.hash_key.get_secret_value().encode()),
            mask_digit_runs=settings.mask_digit_runs,
            max_suggestions_per_utterance=settings.max_suggestions_per_utterance,
            tags_on_partials=settings.tags_on_partials,
            analytics_rules={
                name: ReloadableRef(path, load_analytics_rules) for name, path in settings.analytics_rule_sets.items()
            },
            street_lists={name: ReloadableRef(path, load_street_list) for name, path in settings.street_lists.items()},
        )

    def _files(self) -> dict[str, ReloadableRef[Any]]:
        return {
            **{f"kb:{name}": ref for name, ref in self.kb.items()},
            **{f"tags:{name}": ref for name, ref in self.tag_rules.items()},
            **{f"analytics:{name}": ref for name, ref in self.analytics_rules.items()},
            **{f"streets:{name}": ref for name, ref in self.street_lists.items()},
        }

    def reload_all(self) -> dict[str, ReloadResult]:
        """Reload every changed file (SIGHUP); keys are ``kb:NAME``, ``tags:NAME``, ``analytics:NAME``
        and ``streets:NAME``."""
        return {key: ref.try_reload() for key, ref in self._files().items()}

    def content_hashes(self) -> dict[str, str]:
        """The sha256 of every KB, tag, analytics rules and street file in force (keys as in ``reload_all``)."""
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
            update = _rewritten(update)
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
        if not update.is_partial and ctx.analytics_rules is not None:
            state.finals.append(_utterance(update, entities))
        if not update.is_partial and ctx.workorder is not None:
            events.extend(self._workorder(ctx, state, events))
        return events

    def _workorder(self, ctx: CallContext, state: _CallState, events: list[Event]) -> list[WorkorderUpdated]:
        """``workorder.updated`` when this final's events changed the draft."""
        options = ctx.workorder
        if options is None:
            return []
        if state.draft is None:
            ref = self.street_lists.get(options.streets) if options.streets else None
            state.draft = WorkorderDraft(ref.get() if ref is not None else None, options.fillers)
        changed = state.draft.observe(events)
        if not changed:
            return []
        return [
            WorkorderUpdated(
                call=ctx,
                workorder_id=ctx.call_id,
                revision=state.draft.revision,
                changed=changed,
                fields=state.draft.fields,
            )
        ]

    def call_analytics(self, ctx: CallContext, duration_ms: int) -> CallAnalytics | None:
        """The call's ``call.analytics`` (publish it before ``call.ended``), None where its route
        names no analytics rule set; ``duration_ms``: the longest leg's audio."""
        if ctx.analytics_rules is None:
            return None
        with self._lock:
            state = self._calls.get(ctx.call_id, _CallState())
        numbers = measure(state.finals, duration_ms)
        ref = self.analytics_rules.get(ctx.analytics_rules)
        checks: tuple[RuleCheck, ...] = ()
        categories: tuple[CategoryHit, ...] = ()
        if ref is not None:
            now = self.clock()
            addresses = {a for u in state.finals if u.role != "agent" for a in u.addresses}
            earlier = self._recent_addresses.hours_since(ctx.analytics_rules, addresses, now)
            checks, categories = ref.get().evaluate(state.finals, numbers.duration_ms, earlier)
            self._recent_addresses.remember(ctx.analytics_rules, addresses, now)
        return CallAnalytics(
            call=ctx,
            duration_ms=numbers.duration_ms,
            talk_ms=numbers.talk_ms,
            non_talk_ms=numbers.non_talk_ms,
            overlap=numbers.overlap,
            speaking_rate=numbers.speaking_rate,
            checks=checks,
            categories=categories,
        )

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


def _rewritten(final: TranscriptUpdate) -> TranscriptUpdate:
    """The final as its route writes it: spoken numbers in digits (``itn``: text, tokens, n-best),
    then punctuation (``punctuation``: text only); where the route asks for either, ``text_raw``
    keeps the engine's text."""
    ctx, update = final.call, final
    if ctx.itn:
        normalized = normalize_numbers(update.text)
        tokens = tuple(normalize_tokens(normalized, [(t[0], t[1], t[2]) for t in update.tokens]))
        nbest = tuple((normalize_numbers(text).text, score) for text, score in update.nbest)
        update = replace(update, text=normalized.text, tokens=tokens, nbest=nbest)
    if ctx.punctuation != "off":
        update = replace(update, text=PUNCTUATORS[ctx.punctuation].punctuate(update.text, update.tokens))
    return replace(update, text_raw=final.text) if ctx.itn or ctx.punctuation != "off" else update


def _utterance(update: TranscriptUpdate, entities: list[Entity]) -> Utterance:
    """A final as ``kb_hooks.analytics`` reads it (the text before redaction: phrases and
    addresses are matched in it, and only the rules' phrases and addresses are published)."""
    return Utterance(
        role=update.participant.role,
        utterance_id=update.utterance_id,
        text=update.text,
        spoken_chars=spoken_chars(update.text_raw if update.text_raw is not None else update.text),
        begin_ms=update.begin_offset_ms,
        end_ms=update.end_offset_ms,
        tokens=update.tokens,
        addresses=tuple(e.normalized for e in entities if e.label == "address"),
    )


def _normalized(update: TranscriptUpdate) -> TranscriptUpdate:
    """The update with spoken numbers in digits (text, tokens, n-best); ``text_raw`` keeps the spoken text."""
    normalized = normalize_numbers(update.text)
    tokens = tuple(normalize_tokens(normalized, [(t[0], t[1], t[2]) for t in update.tokens]))
    nbest = tuple((normalize_numbers(text).text, score) for text, score in update.nbest)
    return replace(update, text=normalized.text, tokens=tokens, nbest=nbest, text_raw=update.text)
