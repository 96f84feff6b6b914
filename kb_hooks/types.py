"""Input types of kb_hooks: what the composition root hands over for every call and transcript.

kb_hooks never imports the SIP, RTP or engine packages; the service converts its own records
into these small frozen dataclasses, so this package can be tested and reused on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, NamedTuple

from asr_common.punctuation import PunctuationName

ParticipantRole = Literal["caller", "agent", "mixed"]
# Why a final was searched the cheaper way under surge (asr_core.surge.FinalsReduction, restated:
# kb_hooks does not use the engine): its batch had queued finals_reduce_ms, or the engine was
# saturated (behind with every stream at its longest chunk).
ReducedReason = Literal["finals_queued", "engine_saturated"]


class RedactionMode(StrEnum):
    """How phone and ID numbers appear in published text (per route)."""

    MASK = "mask"  # replaced by '*' of the same length
    KEEP = "keep"  # published as recognized
    HASH = "hash"  # replaced by a keyed hash token, stable across calls for correlation


@dataclass(frozen=True)
class Participant:
    """One side of the call as the dashboards know it."""

    role: ParticipantRole
    aor: str | None = None  # SIP address of record, e.g. "sip:1001@pbx.local"
    label: str | None = None  # the SDP/SIPREC stream label, or an agent id
    name: str | None = None  # display name (From header; SIPREC participant name)

    def key(self) -> tuple[str, str | None, str | None]:
        return (self.role, self.aor, self.label)

    def to_json(self) -> dict[str, str | None]:
        return {"role": self.role, "aor": self.aor, "label": self.label, "name": self.name}


DEFAULT_FILLERS = ("嗯", "呃", "啊", "那个", "就是", "然后", "这个")
"""Words left out of a work order's statement where the route lists none."""


@dataclass(frozen=True)
class WorkorderOptions:
    """A route's work-order draft (``kb_hooks.workorder``)."""

    streets: str | None = None  # name of the street list (kb_hooks.street_lists) addresses are normalized against
    fillers: tuple[str, ...] = DEFAULT_FILLERS  # dropped from the statement


@dataclass(frozen=True)
class CallContext:
    """Per-call facts that every event of the call carries, plus the call's KB/tag/redaction choice."""

    call_id: str
    source_call_id: str | None = None  # the front door's own id of the call (SIP: the Call-ID header)
    route: str | None = None
    key_prefix: str | None = None  # overrides RedisSettings.key_prefix for this call when set
    redaction: RedactionMode = RedactionMode.MASK
    kb_set: str | None = None  # name of the knowledge base to match; None disables KB matching
    tag_rules: tuple[str, ...] = ()  # names of the tag rule sets to apply
    itn: bool = False  # finals: spoken numbers to digits (asr_common.itn); text_raw keeps the spoken form
    punctuation: PunctuationName = "off"  # finals: asr_common.punctuation.PUNCTUATORS' key; text_raw keeps the text
    analytics_rules: str | None = None  # name of the analytics rule set; None: no call.analytics
    workorder: WorkorderOptions | None = None  # None: no work-order draft
    # Other registered features' values by feature name (kb_hooks.features: Feature.option); a
    # feature the call's route leaves off is absent.
    options: Mapping[str, object] = field(default_factory=dict, hash=False)

    def option(self, feature: str) -> object | None:
        """The call's value for ``feature`` (``kb_hooks.features``), None where its route leaves it off."""
        return self.options.get(feature)


class TokenTiming(NamedTuple):
    """A recognized unit with its times in ms from the start of the stream (None when unknown).

    A plain ``(token, begin_ms, end_ms)`` tuple is accepted wherever a TokenTiming is.
    """

    token: str
    begin_ms: int | None = None
    end_ms: int | None = None


@dataclass(frozen=True)
class TranscriptUpdate:
    """One partial or final hypothesis of one utterance of one participant."""

    call: CallContext
    participant: Participant
    utterance_id: int
    is_partial: bool
    text: str
    tokens: tuple[tuple[str, int | None, int | None], ...] = ()
    begin_offset_ms: int = 0  # utterance start, ms from the start of the participant's audio
    end_offset_ms: int = 0
    confidence: float | None = None
    nbest: tuple[tuple[str, float], ...] = ()  # (text, score), best first; finals only
    latency_ms: float | None = None  # engine-side latency the engine measured for this result
    audio_end_monotonic: float | None = None  # time.monotonic() when the chunk's last sample arrived
    text_raw: str | None = None  # the engine's text where the route rewrites it (ITN, punctuation)
    chunk_ms: int | None = None  # the engine's chunk size in force for this result (longer under surge)
    reduced_search: bool | None = None  # finals: True where searched the cheaper way under surge
    reduced_reason: ReducedReason | None = None  # ... and why
