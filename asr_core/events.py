"""Results the engine delivers for each stream: partial and final transcripts.

Times are milliseconds of audio from the start of the stream (not wall clock), except
``latency_ms`` (wall clock from the chunk's last sample being handed to the engine until the
event was produced) and ``audio_end_monotonic`` (``time.monotonic()`` of that hand-off, so a
downstream stage can extend the latency measurement, e.g. up to the Redis PUBLISH).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asr_core.surge import FinalsReduction


@dataclass(frozen=True, slots=True)
class NBestEntry:
    tokens: tuple[int, ...]
    text: str
    score: float
    ctc_score: float
    l2r_score: float | None = None
    r2l_score: float | None = None


@dataclass(frozen=True, slots=True)
class Partial:
    """The current best guess of the utterance in progress (CTC greedy)."""

    stream_id: str
    utterance_id: int
    seq: int
    text: str
    tokens: tuple[int, ...]
    token_times_ms: tuple[int, ...]  # begin time of each token (ms from stream start)
    begin_ms: int
    end_ms: int
    latency_ms: float
    audio_end_monotonic: float
    chunk_ms: int  # chunk size in force for the chunk that produced it (asr_core/surge.py)


@dataclass(frozen=True, slots=True)
class Final:
    """An ended utterance: CTC prefix beam search n-best, rescored by the attention decoder."""

    stream_id: str
    utterance_id: int
    seq: int
    text: str
    tokens: tuple[int, ...]
    token_times_ms: tuple[int, ...]
    begin_ms: int
    end_ms: int
    reason: str  # "silence", "max_length", "input_finished", "closed"
    nbest: tuple[NBestEntry, ...] = field(default=())
    confidence: float = 0.0
    latency_ms: float = 0.0  # endpoint detection -> final produced
    audio_end_monotonic: float = 0.0
    chunk_ms: int = 0  # chunk size in force at the utterance's last chunk (asr_core/surge.py)
    # Why it was searched with a narrower beam and no decoder proposals (surge: finals were
    # queueing, or the engine was saturated); None: with the full settings.
    reduced_search: FinalsReduction | None = None


@dataclass(frozen=True, slots=True)
class Ended:
    """The stream is finished: its last Final (if it said anything) came before this."""

    stream_id: str
    seq: int
    reason: str  # "input_finished" or "closed"
    audio_ms: int  # audio received, ms (what a call analytics' duration is)


Event = Partial | Final | Ended
