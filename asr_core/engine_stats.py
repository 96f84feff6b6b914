"""The engine's counters and measurements (``EngineStats``), shared by the ``Engine`` that owns
them, the schedulers and the finalizer threads that update them, and the metrics that read them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from asr_common.latency import BATCH_BUCKETS, LATENCY_BUCKETS_S, STEP_BUCKETS_S, Histogram, MeasurementRing
from asr_core.surge import FinalsReduction


@dataclass(slots=True)
class EngineStats:
    """Counters and bounded samples for metrics and benchmarks (read from any thread; the
    schedulers and the finalizer threads update them under ``lock``)."""

    chunks: int = 0
    batches: int = 0
    finals: int = 0
    behind_realtime_chunks: int = 0
    # Utterances whose trailing silence reached the endpoint rule inside a chunk with speech after
    # it (asr_core.endpoint.silence_ends_inside): the rest of that chunk was read again.
    endpoints_inside_chunks: int = 0
    errors: int = 0
    # Graceful degradation (asr_core/surge.py): moves of a stream one chunk size up or down its
    # ladder, and stream-seconds spent above its own chunk size (summed over streams).
    chunk_moves_up: int = 0
    chunk_moves_down: int = 0
    degraded_stream_seconds: float = 0.0
    # Finals searched with the cheaper settings (surge), by why: finals queued, engine saturated.
    reduced_finals_by_reason: dict[FinalsReduction, int] = field(
        default_factory=lambda: dict.fromkeys(FinalsReduction, 0)
    )
    batch_sizes: MeasurementRing = field(default_factory=lambda: MeasurementRing(100_000))
    forward_ms: MeasurementRing = field(default_factory=lambda: MeasurementRing(100_000))
    partial_latency_ms: MeasurementRing = field(default_factory=lambda: MeasurementRing(500_000))
    final_latency_ms: MeasurementRing = field(default_factory=lambda: MeasurementRing(100_000))
    # Every measurement since start, for /metrics (the rings above keep recent samples for benchmarks).
    batch_size_histogram: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    step_seconds: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS_S))
    partial_latency_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    final_latency_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def reduced_finals(self) -> int:
        """Finals searched with the cheaper settings, whatever the reason."""
        return sum(self.reduced_finals_by_reason.values())
