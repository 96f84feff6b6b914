"""Call analytics from the finals of a call: talk time per party, silence, overlaps, speaking rate.

Sans-IO and pure: the finals of a call, each an ``AnalyzedFinal``, go in once it is over; ``measure``
turns them into numbers. Every time is ms from the start of the
participant's audio; the legs of one call start together (a SIPREC offer, a CUCM pair joined
within ``join_timeout_s``), so one leg's ms are taken as the other's.

When a party talks is read off its finals' tokens: a token is heard from its begin to its end,
or, where the engine gives only one time per token (the CTC peak: the streaming model fires
once it has heard the syllable, not when it starts), over the ``TOKEN_MS`` before that peak,
and a pause of under ``PAUSE_MS`` between such tokens is talk (the breath between syllables);
a longer one is silence. A final without token times counts as talk from its begin to its end
offset. Chunk boundaries (the utterance's offsets, in steps of the chunk) play no part, and
the call's length is the audio its longest leg received, not what the encoder framed of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kb_hooks.events import Interruption, Overlap
from kb_hooks.normalize import fold_char
from kb_hooks.types import ParticipantRole

TOKEN_MS = 200
"""How long (ms) before its CTC peak (its only time, published as its ``begin_ms``) a token
whose end is unknown is taken to be heard: about one Mandarin syllable at a normal rate of four
to five syllables a second. Measured with the
bundled model on constructed calls (tests/test_call_analytics_service.py): a turn's first peak
comes 220-280 ms after its speech starts, its last peak 20-60 ms after its speech ends."""

PAUSE_MS = 300
"""A pause (ms) shorter than this between the heard spans of peak-timed tokens of one utterance
is talk: CTC peaks of one fluent phrase come up to ``TOKEN_MS + PAUSE_MS`` apart."""

TURN_GAP_MS = 1000
"""A party's pause shorter than this (ms) does not end its turn: overlaps are counted per pair of
turns, so a stretch of talking at once that one party's short pause splits is one overlap."""

Interval = tuple[int, int]  # [begin, end) in ms


@dataclass(frozen=True, slots=True)
class AnalyzedFinal:
    """One final as the analytics need it."""

    role: ParticipantRole
    utterance_id: int
    text: str  # the published text's source (numbers in digits where the route has ITN)
    spoken_chars: int  # characters of the spoken form, punctuation and spaces left out
    begin_ms: int  # the utterance's begin and end offsets
    end_ms: int
    tokens: tuple[tuple[str, int | None, int | None], ...]  # (unit, begin_ms, end_ms)
    addresses: tuple[str, ...] = ()  # normalized address entities said in it

    @property
    def talk(self) -> list[Interval]:
        """When this utterance's speaker was talking, merged, in order."""
        return merge(_token_intervals(self))


def spoken_chars(text: str) -> int:
    """Characters that are spoken: punctuation, spaces and symbols left out."""
    return sum(1 for ch in text if fold_char(ch))


def _token_intervals(utterance: AnalyzedFinal) -> list[Interval]:
    timed = [(begin, end) for _, begin, end in utterance.tokens if begin is not None]
    if not timed:
        return [(utterance.begin_ms, utterance.end_ms)] if utterance.end_ms > utterance.begin_ms else []
    if all(end is not None for _, end in timed):
        return merge((begin, end) for begin, end in timed if end is not None and end > begin)
    heard = [(begin, end) if end is not None else _before_peak(begin, utterance.begin_ms) for begin, end in timed]
    return [(begin, end) for begin, end in merge(heard, PAUSE_MS) if end > begin]


def _before_peak(peak_ms: int, utterance_begin_ms: int) -> Interval:
    """When a token known by its CTC peak alone was heard: the ``TOKEN_MS`` up to the peak, not
    before its utterance began."""
    return max(peak_ms - TOKEN_MS, utterance_begin_ms), peak_ms


def merge(intervals: Iterable[Interval], gap_ms: int = 0) -> list[Interval]:
    """The union of ``intervals`` as disjoint intervals in order, those less than ``gap_ms``
    apart (and touching ones) joined."""
    out: list[Interval] = []
    for begin, end in sorted(intervals):
        if out and (begin <= out[-1][1] or begin - out[-1][1] < gap_ms):
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return out


def total(intervals: Iterable[Interval]) -> int:
    return sum(end - begin for begin, end in intervals)


def _intersections(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Where two sorted disjoint interval lists overlap."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        begin, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if begin < end:
            out.append((begin, end))
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _started_at(turns: Sequence[Interval], moment: int) -> int:
    """Begin of the turn that holds ``moment``."""
    return next(begin for begin, end in turns if begin <= moment < end)


def _within(intervals: Sequence[Interval], begin: int, end: int) -> list[Interval]:
    """``intervals`` cut to [begin, end)."""
    return [(max(b, begin), min(e, end)) for b, e in intervals if b < end and e > begin]


@dataclass(frozen=True, slots=True)
class Measures:
    """The timing numbers of a call; ``talk_ms`` and ``speaking_rate`` keyed by role."""

    duration_ms: int
    talk_ms: dict[str, int]
    non_talk_ms: int
    overlap: Overlap
    speaking_rate: dict[str, float]  # characters per minute of talk, one decimal


def measure(utterances: Iterable[AnalyzedFinal], duration_ms: int) -> Measures:
    """Talk, non-talk, overlaps and speaking rate of a call of ``duration_ms`` (the longest leg).

    An overlap is a pair of turns (talk joined over pauses under ``TURN_GAP_MS``) in which both
    parties talk at once; its ms are those of the talk itself. Each is an interruption by the
    party whose turn started later, of the one already talking (when both started at once, the
    caller counts as the one who interrupted the agent).
    """
    talk_by_role: dict[ParticipantRole, list[Interval]] = {}
    chars: dict[str, int] = {}
    for utterance in utterances:
        talk_by_role.setdefault(utterance.role, []).extend(utterance.talk)
        chars[utterance.role] = chars.get(utterance.role, 0) + utterance.spoken_chars
    talk = {role: merge(intervals) for role, intervals in sorted(talk_by_role.items())}
    turns = {role: merge(intervals, TURN_GAP_MS) for role, intervals in talk.items()}
    everyone = merge(interval for intervals in talk.values() for interval in intervals)
    end = max(duration_ms, everyone[-1][1] if everyone else 0)
    roles = sorted(talk)
    count = overlap_ms = 0
    interruptions: dict[tuple[ParticipantRole, ParticipantRole], list[int]] = {}
    for k, first in enumerate(roles):
        for second in roles[k + 1 :]:
            for begin, stop in _intersections(turns[first], turns[second]):
                both = total(_intersections(_within(talk[first], begin, stop), _within(talk[second], begin, stop)))
                if not both:
                    continue
                count += 1
                overlap_ms += both
                first_began = _started_at(turns[first], begin)
                by, of = (first, second) if first_began > _started_at(turns[second], begin) else (second, first)
                tally = interruptions.setdefault((by, of), [0, 0])
                tally[0] += 1
                tally[1] += both
    talk_ms: dict[str, int] = {role: total(intervals) for role, intervals in talk.items()}
    return Measures(
        duration_ms=end,
        talk_ms=talk_ms,
        non_talk_ms=end - total(everyone),
        overlap=Overlap(
            count,
            overlap_ms,
            tuple(Interruption(by, of, n, ms) for (by, of), (n, ms) in sorted(interruptions.items())),
        ),
        speaking_rate={role: round(chars.get(role, 0) * 60_000 / ms, 1) for role, ms in talk_ms.items() if ms > 0},
    )
