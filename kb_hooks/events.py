"""Event v1: the declared type of every event, its one JSON form, and the packaged JSON Schema.

Every event is one flat JSON object: the envelope (``schema_version``, ``event_type``,
``event_id``, ``seq``, ``ts``, ``call_id``, ``sip_call_id``, ``source_call_id``, ``route``,
``participant``) plus the
fields of its type. Here each type is a frozen dataclass whose fields are its JSON fields, by
name and in order: the envelope is declared once, on ``Event``, and filled from the call's
``CallContext`` when an event is made; ``to_json`` writes any event, so a type has exactly one
JSON form (``seq`` excepted: the Publisher stamps it when the event is submitted, so it follows
publish order per call). ``tests/test_events_schema.py`` holds every type to the packaged schema.
docs/events.md describes every field.

Making an event costs a constructor call: nothing is validated on the way out (partials are
published many times a second per call); the types and that test keep the JSON right.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from functools import cache, lru_cache
from importlib import resources
from typing import Any, ClassVar, Literal, NamedTuple

from kb_hooks.event_ids import new_event_id
from kb_hooks.types import CallContext, Participant, ParticipantRole, RedactionMode, ReducedReason

SCHEMA_VERSION = "1"

# Fields declared with this metadata are left out of the JSON while they are None.
OMITTED_WHEN_NONE: Mapping[str, bool] = {"omit_when_none": True}


class EventType(StrEnum):
    """Every ``event_type`` of v1: compare a JSON event's ``event_type`` with these, not with literals."""

    CALL_STARTED = "call.started"
    TRANSCRIPT_PARTIAL = "transcript.partial"
    TRANSCRIPT_FINAL = "transcript.final"
    KB_SUGGESTION = "kb.suggestion"
    TAGS = "tags"
    CALL_ENDED = "call.ended"
    DTMF = "dtmf"
    CALL_ANALYTICS = "call.analytics"
    WORKORDER_UPDATED = "workorder.updated"
    WORKORDER_CONFIRMED = "workorder.confirmed"


SuggestionStatus = Literal["suggested", "confirmed", "withdrawn"]
SuggestionKind = Literal["keyword", "all_of", "pattern"]  # how a KB entry matched (kb_hooks.kb)
TagKind = Literal["demand", "entity", "category"]
WorkorderField = Literal["category", "address", "time", "contact", "statement", "kb_entry"]


def utc_timestamp() -> str:
    """Now as ISO-8601 UTC with milliseconds, e.g. ``2024-05-01T08:30:00.123Z`` (the milliseconds
    truncated, as ``datetime.now`` gives them)."""
    return utc_timestamp_ms(time.time_ns() // 1_000_000)


def utc_timestamp_ms(unix_ms: int) -> str:
    """``unix_ms`` (ms since 1970-01-01 UTC) as ``utc_timestamp`` writes it."""
    second, ms = divmod(unix_ms, 1000)
    return f"{_second_text(second)}{ms:03d}Z"


@lru_cache(maxsize=4)
def _second_text(second: int) -> str:
    """``2024-05-01T08:30:00.`` for unix second ``second``: ``strftime`` once a second, not once an
    event (it was a few % of the kb-hooks thread)."""
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")


class JsonRecord:
    """A frozen dataclass whose JSON object is its fields, by name and in order; nested records
    and participants become objects, tuples arrays, mappings objects."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        return _with_fields({}, self)


def _with_fields(out: dict[str, Any], record: JsonRecord) -> dict[str, Any]:
    """``out`` with the JSON of each field of ``record`` added, in order."""
    for name, omit_when_none in _json_fields(type(record)):
        value = getattr(record, name)
        if value is not None or not omit_when_none:
            out[name] = _json_value(value)
    return out


_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _json_fields(cls: type) -> tuple[tuple[str, bool], ...]:
    """(name, omitted when None) of each field of a record type, looked up once per type."""
    known = _FIELDS.get(cls)
    if known is None:
        known = _FIELDS[cls] = tuple((f.name, bool(f.metadata.get("omit_when_none"))) for f in fields(cls))
    return known


_SCALARS = (str, int, float, bool, type(None))


def _json_value(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Token):
        return value.to_json()
    if isinstance(value, tuple):
        return [item.to_json() if isinstance(item, Token) else _json_value(item) for item in value]
    if isinstance(value, JsonRecord | Participant):
        return value.to_json()
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"an event field holds a {type(value).__name__}, which has no JSON form here")


# -- records inside events ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Span(JsonRecord):
    """Character offsets [begin, end) in the source utterance's published text."""

    begin: int
    end: int


class Token(NamedTuple):
    """A recognized unit as published (redacted); times in ms from the start of the participant's audio.

    A NamedTuple, not a frozen dataclass: a partial carries one per unit, and a tuple is several
    times cheaper to make; its JSON object is written out for the same reason.
    """

    text: str
    begin_ms: int | None
    end_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "begin_ms": self.begin_ms, "end_ms": self.end_ms}


@dataclass(frozen=True, slots=True)
class Alternative(JsonRecord):
    """One n-best entry of a final: its (redacted) text and score, best first."""

    text: str
    score: float


@dataclass(frozen=True, slots=True)
class Tag(JsonRecord):
    """A demand or category rule's match, or an entity (phone, id_number, address, date, time)."""

    kind: TagKind
    label: str
    value: str  # as published: redacted for phone and id_number unless the route keeps them
    normalized: str | None  # digits form of entities; None when redacted or not an entity
    span: Span
    homophone: bool
    redacted: bool


@dataclass(frozen=True, slots=True)
class Interruption(JsonRecord):
    """Overlapping talk that ``by`` started while ``of`` was talking (roles)."""

    by: ParticipantRole
    of: ParticipantRole
    count: int
    total_ms: int


@dataclass(frozen=True, slots=True)
class Overlap(JsonRecord):
    """Both parties talking at once: how often, for how long (ms), and who interrupted whom."""

    count: int
    total_ms: int
    interruptions: tuple[Interruption, ...]


@dataclass(frozen=True, slots=True)
class RuleCheck(JsonRecord):
    """One check of the route's analytics rules; ``passed`` None: it did not apply (no address given)."""

    id: str
    kind: str
    passed: bool | None
    participant: ParticipantRole | None  # whose utterance decided it
    utterance_id: int | None
    at_ms: int | None  # that utterance's begin, ms from the start of its participant's audio
    phrase: str | None  # the rule's phrase (or the address) that was found


@dataclass(frozen=True, slots=True)
class CategoryHit(JsonRecord):
    """A rule category the call falls into, with the first utterance that showed it."""

    id: str
    label: str
    participant: ParticipantRole | None
    utterance_id: int | None
    at_ms: int | None
    phrase: str | None


@dataclass(frozen=True, slots=True)
class DraftField(JsonRecord):
    """One field of a work-order draft and the events it came from."""

    value: str  # as published: the contact redacted per the route's policy
    normalized: str | None  # category: None; address: against the street list; time, contact: digits; kb_entry: id
    matched: tuple[str, ...]  # the words that gave it: a category's matched phrases, the street list's street
    event_ids: tuple[str, ...]  # the transcript.final, tags and kb.suggestion events it came from


@dataclass(frozen=True, slots=True)
class WorkorderFields(JsonRecord):
    """The hotline's form, each field None until the call yields it (``kb_hooks.workorder``)."""

    category: DraftField | None = None
    address: DraftField | None = None
    time: DraftField | None = None
    contact: DraftField | None = None
    statement: DraftField | None = None
    kb_entry: DraftField | None = None


@dataclass(frozen=True, slots=True)
class FieldChange(JsonRecord):
    """A field the agent changed against the draft when confirming (None: empty)."""

    field: WorkorderField
    draft: str | None
    confirmed: str | None


# -- the envelope and the event types ----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Event(JsonRecord):
    """The envelope every event carries; a subclass per ``event_type`` adds its fields.

    ``call`` fills ``call_id``, ``source_call_id``, ``sip_call_id`` and ``route`` (it is not kept, so
    ``dataclasses.replace`` needs it again); ``event_id`` and ``ts`` are fresh unless given.
    """

    event_type: ClassVar[EventType]
    call: InitVar[CallContext]
    event_id: str = field(default_factory=new_event_id)
    ts: str = field(default_factory=utc_timestamp)
    call_id: str = field(init=False)
    # The door's own id of the call under v1's first name, for every door (SIP: the Call-ID;
    # AudioSocket: the UUID; WebSocket: the stream id): consumers written before source_call_id read it.
    sip_call_id: str | None = field(init=False)
    source_call_id: str | None = field(init=False)  # the same id under its neutral name
    route: str | None = field(init=False)
    participant: Participant | None = None  # None on call.*

    def __post_init__(self, call: CallContext) -> None:
        object.__setattr__(self, "call_id", call.call_id)
        object.__setattr__(self, "sip_call_id", call.source_call_id)
        object.__setattr__(self, "source_call_id", call.source_call_id)
        object.__setattr__(self, "route", call.route)

    def to_json(self) -> dict[str, Any]:
        """The event's JSON object without ``seq`` (the Publisher adds it)."""
        return _with_fields({"schema_version": SCHEMA_VERSION, "event_type": self.event_type.value}, self)


CallSourceName = Literal["sip", "audiosocket", "audio_fork", "websocket"]
"""The front doors (``calls.call.CallSource``, restated here: kb_hooks does not use the call model)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallStarted(Event):
    event_type = EventType.CALL_STARTED
    participants: tuple[Participant, ...]
    metadata: Mapping[str, str]  # From/To, dialled number, SIPREC session id, the route's listed headers
    source: CallSourceName = "sip"  # the front door the call came in by


@dataclass(frozen=True, slots=True, kw_only=True)
class Transcript(Event):
    """What partials and finals share; only its two subclasses are events."""

    participant: Participant
    utterance_id: int
    is_partial: bool = field(init=False)
    text: str
    begin_offset_ms: int  # utterance start, ms from the start of the participant's audio
    end_offset_ms: int
    tokens: tuple[Token, ...]
    confidence: float | None
    latency_ms: float | None  # engine latency of this result
    text_raw: str | None = field(default=None, metadata=OMITTED_WHEN_NONE)  # engine's text: ITN/punctuation rewrote it
    # The engine's chunk size (ms) in force for this result: the route's, or longer while the
    # node was behind (surge); left out where unknown.
    chunk_ms: int | None = field(default=None, metadata=OMITTED_WHEN_NONE)

    def to_json(self) -> dict[str, Any]:
        """Written out instead of the field loop of ``Event.to_json``: partials are most of the
        events a node publishes (about 2.5x cheaper; ``tests/test_events_schema.py`` holds both
        forms equal, key order included)."""
        out = {
            "schema_version": SCHEMA_VERSION,
            "event_type": self.event_type.value,
            "event_id": self.event_id,
            "ts": self.ts,
            "call_id": self.call_id,
            "sip_call_id": self.sip_call_id,
            "source_call_id": self.source_call_id,
            "route": self.route,
            "participant": self.participant.to_json(),
            "utterance_id": self.utterance_id,
            "is_partial": self.is_partial,
            "text": self.text,
            "begin_offset_ms": self.begin_offset_ms,
            "end_offset_ms": self.end_offset_ms,
            "tokens": [{"text": text, "begin_ms": begin, "end_ms": end} for text, begin, end in self.tokens],
            "confidence": self.confidence,
            "latency_ms": self.latency_ms,
        }
        if self.text_raw is not None:
            out["text_raw"] = self.text_raw
        if self.chunk_ms is not None:
            out["chunk_ms"] = self.chunk_ms
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptPartial(Transcript):
    event_type = EventType.TRANSCRIPT_PARTIAL
    is_partial: Literal[True] = field(default=True, init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptFinal(Transcript):
    event_type = EventType.TRANSCRIPT_FINAL
    is_partial: Literal[False] = field(default=False, init=False)
    nbest: tuple[Alternative, ...]
    # True where the engine searched it with a narrower beam and without the decoder's proposals
    # under surge (a little less accurate), and why; both left out otherwise.
    reduced_search: bool | None = field(default=None, metadata=OMITTED_WHEN_NONE)
    reduced_reason: ReducedReason | None = field(default=None, metadata=OMITTED_WHEN_NONE)

    def __post_init__(self, call: CallContext) -> None:
        Transcript.__post_init__(self, call)
        if self.reduced_reason is not None and self.reduced_search is not True:
            raise ValueError(f"reduced_reason {self.reduced_reason!r} given for a final not searched the reduced way")

    def to_json(self) -> dict[str, Any]:
        out = Transcript.to_json(self)
        out["nbest"] = [alternative.to_json() for alternative in self.nbest]
        if self.reduced_search is not None:
            out["reduced_search"] = self.reduced_search
        if self.reduced_reason is not None:
            out["reduced_reason"] = self.reduced_reason
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class KbSuggestion(Event):
    event_type = EventType.KB_SUGGESTION
    participant: Participant
    utterance_id: int
    is_partial: bool  # of the source utterance
    entry_id: str
    title: str
    score: float
    status: SuggestionStatus
    match_kind: SuggestionKind
    homophone: bool
    matched_text: str
    span: Span
    priority: int
    entry_tags: tuple[str, ...]
    summary: str
    url: str | None

    def withdrawn(self, call: CallContext, participant: Participant, utterance_id: int) -> KbSuggestion:
        """This suggestion withdrawn by the final of ``utterance_id``: a new event, same entry."""
        return KbSuggestion(
            call=call,
            participant=participant,
            utterance_id=utterance_id,
            is_partial=False,
            entry_id=self.entry_id,
            title=self.title,
            score=self.score,
            status="withdrawn",
            match_kind=self.match_kind,
            homophone=self.homophone,
            matched_text=self.matched_text,
            span=self.span,
            priority=self.priority,
            entry_tags=self.entry_tags,
            summary=self.summary,
            url=self.url,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Tags(Event):
    event_type = EventType.TAGS
    participant: Participant
    utterance_id: int
    is_partial: bool
    tags: tuple[Tag, ...]  # at least one


@dataclass(frozen=True, slots=True, kw_only=True)
class CallEnded(Event):
    event_type = EventType.CALL_ENDED
    reason: str  # bye, rtp-timeout, shutdown, node_restart ...
    stats: Mapping[str, Any]  # free-form: audio_ms, dtmf_events ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Dtmf(Event):
    """One RFC 4733 key press of ``participant``; make it with ``Dtmf.press``."""

    event_type = EventType.DTMF
    participant: Participant
    digit: str | None  # None unless the route's redaction is keep
    redacted: bool
    index: int  # the participant's key presses, counted from 0
    duration_ms: int

    @classmethod
    def press(cls, call: CallContext, participant: Participant, key: str, index: int, duration_ms: int) -> Dtmf:
        """The key is published only where the call's redaction is ``keep``: callers key in ID
        and card numbers, and a keyed hash of one of sixteen keys would hide nothing, so
        ``hash`` masks like ``mask``."""
        shown = call.redaction is RedactionMode.KEEP
        return cls(
            call=call,
            participant=participant,
            digit=key if shown else None,
            redacted=not shown,
            index=index,
            duration_ms=duration_ms,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAnalytics(Event):
    """What the call's finals show once it is over (``kb_hooks.analytics``); just before ``call.ended``.

    Times in ms; per-party values keyed by role (``caller``, ``agent``, ``mixed``).
    """

    event_type = EventType.CALL_ANALYTICS
    duration_ms: int  # the longest leg's audio
    talk_ms: Mapping[str, int]  # role -> ms in which that party talked
    non_talk_ms: int  # ms of the call in which nobody talked
    overlap: Overlap
    speaking_rate: Mapping[str, float]  # role -> characters per minute of its talk
    checks: tuple[RuleCheck, ...]
    categories: tuple[CategoryHit, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkorderUpdated(Event):
    """The call's work-order draft after a final filled or changed ``changed`` (all fields sent)."""

    event_type = EventType.WORKORDER_UPDATED
    workorder_id: str  # the call_id: one work order per call
    revision: int  # 1, 2 ... per call
    changed: tuple[WorkorderField, ...]
    fields: WorkorderFields


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkorderConfirmed(Event):
    """The agent confirmed the draft (the console): the fields as confirmed and what the agent changed."""

    event_type = EventType.WORKORDER_CONFIRMED
    workorder_id: str
    revision: int  # the draft revision the agent saw
    confirmed_by: str  # the console user
    fields: WorkorderFields
    changes: tuple[FieldChange, ...]  # the draft's accuracy measure: empty when nothing was changed


# Every event type of v1 and its declared type.
EVENT_CLASSES: Mapping[EventType, type[Event]] = {
    cls.event_type: cls
    for cls in (
        CallStarted,
        TranscriptPartial,
        TranscriptFinal,
        KbSuggestion,
        Tags,
        CallEnded,
        Dtmf,
        CallAnalytics,
        WorkorderUpdated,
        WorkorderConfirmed,
    )
}


def is_partial(event: Mapping[str, Any]) -> bool:
    """Whether a JSON event (read back from the journal or Redis) is a ``transcript.partial``."""
    return event.get("event_type") == EventType.TRANSCRIPT_PARTIAL


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of event v1, shipped inside the package."""
    text = resources.files("kb_hooks").joinpath("schema/event-v1.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded
