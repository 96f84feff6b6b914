"""Graceful degradation under load: which streams move to longer chunks, and when (sans-IO).

A longer chunk costs less per second of audio (fewer steps, larger batches), at some accuracy
and a later partial. When a scheduler falls behind (its lag at or past ``degrade_ms`` for
``degrade_after_s``: a spike of one late batch is not falling behind),
``SurgeController`` moves a share of its streams one size up their ladder (160 -> 320 -> 640
ms), lowest priority first; when the lag has stayed under ``restore_ms`` for
``restore_after_s`` it moves them back down, highest priority first. Between the two thresholds
nothing moves (hysteresis), and two moves are at least ``step_interval_s`` apart, so the effect
of one shows in the lag before the next is decided.

The lag it is fed (``surge_lag_ms``) is the larger of two: how long the scheduler's oldest ready
chunk has waited (``Scheduler.lag_s``), and how far the finals' wait runs past
``finals_reduce_ms``. Finals that still queue after being searched the cheaper way are short of
CPU that the engine threads hold (the finals process yields to them): a longer chunk frees it, so
the node slows its partials down rather than refuse calls because its finals lag.

The controller keeps no streams and reads no clock: it is fed the lag, ``now`` and a view of
each stream (``SurgeStream``) and hands back ``ChunkMove``s; the scheduler applies them between
chunks (``Stream.set_chunk``). Which way it moves is a table, ``TRANSITIONS``.

Finals give way too (``finals_reduction``, a table as well, ``FINALS_REDUCTIONS``): a batch of
ended utterances is searched the cheaper way (``FinalSettings.reduced``: a narrower beam, no
decoder proposals) when its oldest has waited ``finals_reduce_ms`` for its Final, or while the
engine is saturated (a controller ``saturated``: behind with every stream at its longest chunk
already, and until the lag falls under ``restore_ms``). A saturated engine has no cheaper chunk
left to give its partials; the finals' CPU is what is left to give.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum


class Band(Enum):
    """Where the latest lag sample lies against the thresholds."""

    LOW = "low"  # <= restore_ms: room to spare
    MID = "mid"  # between the thresholds: hold
    HIGH = "high"  # >= degrade_ms: falling behind


class Level(Enum):
    """How far the streams are degraded."""

    NONE = "none"  # every stream at its own chunk size
    SOME = "some"  # some moved up, some could still move
    ALL = "all"  # some moved up, none can move further: saturated


class FinalsReduction(StrEnum):
    """Why a final was searched the cheaper way (``Final.reduced_search``; the event's
    ``reduced_reason``, the metric's ``reason`` label)."""

    FINALS_QUEUED = "finals_queued"  # its batch's oldest utterance waited ``finals_reduce_ms``
    ENGINE_SATURATED = "engine_saturated"  # a scheduler was saturated when its batch was searched


class Direction(Enum):
    DEGRADE = "degrade"
    HOLD = "hold"
    RESTORE = "restore"


TRANSITIONS: dict[tuple[Level, Band], Direction] = {
    (Level.NONE, Band.LOW): Direction.HOLD,
    (Level.NONE, Band.MID): Direction.HOLD,
    (Level.NONE, Band.HIGH): Direction.DEGRADE,
    (Level.SOME, Band.LOW): Direction.RESTORE,
    (Level.SOME, Band.MID): Direction.HOLD,
    (Level.SOME, Band.HIGH): Direction.DEGRADE,
    (Level.ALL, Band.LOW): Direction.RESTORE,
    (Level.ALL, Band.MID): Direction.HOLD,
    (Level.ALL, Band.HIGH): Direction.HOLD,  # nothing left to give: admission's business
}


@dataclass(frozen=True, slots=True)
class SurgeSettings:
    """When streams move. Times in ms of lag and s of wall clock."""

    degrade_ms: float = 300.0  # lag at or past which one more share of streams moves up
    degrade_after_s: float = 1.0  # behind this long before each move up (a spike moves nothing)
    restore_ms: float = 100.0  # lag at or under which (for ``restore_after_s``) a share moves back
    restore_after_s: float = 10.0  # calm this long before each move back
    step_interval_s: float = 2.0  # at least this long between two moves: a chunk of each stream to show
    step_share: float = 0.25  # share of the scheduler's streams one move takes (at least one stream)
    sample_interval_s: float = 0.1  # the scheduler feeds the controller at most this often
    # Finals under surge: a batch of ended utterances whose oldest has waited this long (ms) for
    # its Final is searched with a beam of ``finals_beam`` and without the decoder's proposals,
    # so finals catch up before they queue past ``EngineOptions.finals_behind_ms``.
    finals_reduce_ms: float = 1500.0
    finals_beam: int = 4
    # ... and, however short their wait, while any scheduler is saturated: no stream left to move
    # to a longer chunk and still behind, so the finals' CPU is the only CPU left to give.
    finals_reduce_when_saturated: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.restore_ms < self.degrade_ms:
            raise ValueError(
                f"surge restore_ms ({self.restore_ms}) must be at least 0 and below degrade_ms ({self.degrade_ms})"
            )
        if not 0 < self.step_share <= 1:
            raise ValueError(f"surge step_share must be in (0, 1], got {self.step_share}")
        if min(self.step_interval_s, self.restore_after_s, self.degrade_after_s, self.sample_interval_s) < 0:
            raise ValueError(
                "surge step_interval_s, restore_after_s, degrade_after_s and sample_interval_s must not be negative"
            )
        if self.finals_reduce_ms < 0 or self.finals_beam < 1:
            raise ValueError(
                f"surge finals_reduce_ms must not be negative ({self.finals_reduce_ms}) "
                f"and finals_beam at least 1 ({self.finals_beam})"
            )


@dataclass(frozen=True, slots=True)
class SurgeStream:
    """What the controller knows of a stream."""

    stream_id: str
    priority: int  # higher: moved up later, moved back sooner
    ladder: tuple[int, ...]  # chunk sizes (ms) it may run at, ascending, its route's own first
    chunk_ms: int  # in force now, one of ``ladder``

    @property
    def step(self) -> int:
        """Index of ``chunk_ms`` in ``ladder`` (0: not degraded)."""
        return self.ladder.index(self.chunk_ms)


@dataclass(frozen=True, slots=True)
class ChunkMove:
    """Run ``stream_id`` at ``chunk_ms`` from its next chunk on."""

    stream_id: str
    chunk_ms: int


def movable(streams: Sequence[SurgeStream]) -> bool:
    """Whether any of ``streams`` can still move to a longer chunk."""
    return any(s.step < len(s.ladder) - 1 for s in streams)


def level_of(streams: Sequence[SurgeStream]) -> Level:
    if not any(s.step > 0 for s in streams):
        return Level.NONE
    return Level.SOME if movable(streams) else Level.ALL


class SurgeController:
    """The policy of one scheduler's streams; see the module docstring."""

    def __init__(self, settings: SurgeSettings) -> None:
        self.settings = settings
        self._last_move = -math.inf
        self._low_since: float | None = None  # start of the current run of LOW samples
        self._high_since: float | None = None  # start of the current run of HIGH samples
        self.saturated = False  # behind with every stream at its largest chunk (until the lag is LOW)

    def band(self, lag_ms: float) -> Band:
        if lag_ms >= self.settings.degrade_ms:
            return Band.HIGH
        if lag_ms <= self.settings.restore_ms:
            return Band.LOW
        return Band.MID

    def decide(self, now: float, lag_ms: float, streams: Sequence[SurgeStream]) -> tuple[ChunkMove, ...]:
        """The moves this lag sample (ms, at monotonic ``now`` s) calls for; often none."""
        band = self.band(lag_ms)
        self._low_since = (self._low_since if self._low_since is not None else now) if band is Band.LOW else None
        self._high_since = (self._high_since if self._high_since is not None else now) if band is Band.HIGH else None
        level = level_of(streams)
        # Saturated from a HIGH sample with nothing left to move until the lag is LOW again (or a
        # stream can move): a MID sample between two late batches does not flip the finals back.
        self.saturated = not movable(streams) and (band is Band.HIGH or (self.saturated and band is Band.MID))
        direction = TRANSITIONS[(level, band)]
        if direction is Direction.HOLD or now - self._last_move < self.settings.step_interval_s:
            return ()
        if direction is Direction.RESTORE:
            assert self._low_since is not None  # RESTORE only comes from LOW
            if now - self._low_since < self.settings.restore_after_s:
                return ()
        if direction is Direction.DEGRADE:
            assert self._high_since is not None  # DEGRADE only comes from HIGH
            if now - self._high_since < self.settings.degrade_after_s:
                return ()
        moves = self._moves(direction, streams)
        if moves:
            self._last_move = now
            if direction is Direction.RESTORE:
                self._low_since = now  # each further step back waits for its own calm spell
            else:
                self._high_since = now  # and each step up for lag that outlasts the last one
        return moves

    def _moves(self, direction: Direction, streams: Sequence[SurgeStream]) -> tuple[ChunkMove, ...]:
        share = max(1, math.ceil(self.settings.step_share * len(streams)))
        if direction is Direction.DEGRADE:
            # Lowest priority first; within it the least degraded, so a route steps 160 -> 320
            # as a whole before any of it goes on to 640.
            up = sorted((s for s in streams if s.step < len(s.ladder) - 1), key=lambda s: (s.priority, s.step))
            return tuple(ChunkMove(s.stream_id, s.ladder[s.step + 1]) for s in up[:share])
        down = sorted((s for s in streams if s.step > 0), key=lambda s: (-s.priority, -s.step))
        return tuple(ChunkMove(s.stream_id, s.ladder[s.step - 1]) for s in down[:share])


def surge_lag_ms(settings: SurgeSettings, chunk_lag_ms: float, finals_lag_ms: float) -> float:
    """The lag the controller acts on: the chunks' (how long the oldest ready chunk has waited),
    or the finals' wait past ``finals_reduce_ms`` where that is longer (see the module docstring)."""
    return max(chunk_lag_ms, finals_lag_ms - settings.finals_reduce_ms)


# (engine saturated, the batch's oldest final waited ``finals_reduce_ms`` or more) -> why its finals
# are searched the cheaper way; None: the full settings. Where both hold the older rule's reason
# is given, so ENGINE_SATURATED counts exactly the finals that saturation made cheaper.
FINALS_REDUCTIONS: dict[tuple[bool, bool], FinalsReduction | None] = {
    (False, False): None,
    (False, True): FinalsReduction.FINALS_QUEUED,
    (True, False): FinalsReduction.ENGINE_SATURATED,
    (True, True): FinalsReduction.FINALS_QUEUED,
}


def finals_reduction(settings: SurgeSettings, *, saturated: bool, waited_ms: float) -> FinalsReduction | None:
    """Why a batch of finals whose oldest utterance has waited ``waited_ms`` (ms since its
    endpoint) is searched the cheaper way, with the engine ``saturated`` or not; None: it is not.
    ``settings.finals_reduce_when_saturated`` false: saturation alone reduces nothing."""
    saturated = saturated and settings.finals_reduce_when_saturated
    return FINALS_REDUCTIONS[(saturated, waited_ms >= settings.finals_reduce_ms)]


def chunk_ladder(
    chunk_ms: int, left_chunks: int, max_chunk_ms: int, allowed_chunk_ms: Sequence[int], frame_ms: int
) -> tuple[tuple[int, int], ...]:
    """(chunk ms, left chunks) a stream of ``chunk_ms`` chunks keeping ``left_chunks`` may run at,
    ascending from its own, up to ``max_chunk_ms``.

    Its attention window (``chunk_ms * left_chunks``, encoder frames of ``frame_ms``) stays the
    same at every size: 160 ms x 8 = 320 ms x 4 = 640 ms x 2. So its cache slot keeps its window
    and the frames in it when it moves, and the model attends over the same stretch of past
    audio. A size whose chunk does not divide that window (240 ms of a 1280 ms window) is
    skipped; so is any size a stream's window is smaller than."""
    window = chunk_ms // frame_ms * left_chunks  # encoder frames
    ladder = [(chunk_ms, left_chunks)]
    for size in sorted(allowed_chunk_ms):
        frames = size // frame_ms
        if chunk_ms < size <= max_chunk_ms and size % frame_ms == 0 and window % frames == 0:
            ladder.append((size, window // frames))
    return tuple(ladder)
