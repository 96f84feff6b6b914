"""The publisher's counters and latency statistics: what ``/metrics``, the logs and the
benchmarks read.

Counters are plain int attributes, counted on the publisher's event loop; partials dropped at
the inbox are counted apart, by the submitting threads under the publisher's lock. Latencies:
the last ``LATENCY_SAMPLES`` of each kind for percentiles, and every audio-to-acknowledgement
since start in a histogram (it sums across nodes).
"""

from __future__ import annotations

from collections.abc import Iterable

from asr_common.latency import LATENCY_BUCKETS_S, Histogram, MeasurementRing

COUNTERS = (
    "connected",
    "submitted",
    "published",
    "partials_dropped",
    "duplicates_suppressed",
    "rejected",
    "spooled",
    "replayed",
    "spool_full_dropped",
    "spool_corrupt_skipped",
    "spool_torn_records",
    "calls_ended_on_restart",
    "inbox_full_dropped",
    "redis_errors",
    "reconnects",
    "replica_ack_timeouts",
)
LATENCY_SAMPLES = 100_000
PERCENTILES = (0.5, 0.95, 0.99)


def percentile(samples: Iterable[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``samples`` by rank; None when there are none."""
    ordered = sorted(samples)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class PublisherStats:
    """The counters (``COUNTERS``, read them by name) and acknowledgement latencies (s)."""

    def __init__(self) -> None:
        self.connected = False
        self.submitted = 0
        self.published = 0
        self._inbox_partials_dropped = 0  # counted by submitters, under the publisher's lock
        self._loop_partials_dropped = 0  # counted on the event loop
        self.duplicates_suppressed = 0
        self.rejected = 0
        self.spooled = 0
        self.replayed = 0
        self.spool_full_dropped = 0
        self.spool_corrupt_skipped = 0
        self.spool_torn_records = 0
        self.calls_ended_on_restart = 0
        self.inbox_full_dropped = 0
        self.redis_errors = 0
        self.reconnects = 0
        self.replica_ack_timeouts = 0
        self.ack_latency_s = MeasurementRing(LATENCY_SAMPLES)  # submit -> Redis acknowledged
        self.audio_to_ack_s = MeasurementRing(LATENCY_SAMPLES)  # the audio's end -> Redis acknowledged
        self.audio_to_ack_histogram = Histogram(LATENCY_BUCKETS_S)  # every one since start, for /metrics

    @property
    def partials_dropped(self) -> int:
        return self._inbox_partials_dropped + self._loop_partials_dropped

    def record_ack(self, submitted: float, audio_end: float | None, now: float) -> None:
        """An event submitted at ``submitted`` (``time.monotonic()``), its audio ending at
        ``audio_end`` when it has audio, is in Redis at ``now``."""
        self.ack_latency_s.append(now - submitted)
        if audio_end is not None:
            self.audio_to_ack_s.append(now - audio_end)
            self.audio_to_ack_histogram.observe(now - audio_end)

    def counters(self) -> dict[str, int]:
        """Every counter by name (``connected`` as a bool)."""
        return {name: getattr(self, name) for name in COUNTERS}

    def latency_percentiles_ms(self) -> dict[str, float | None]:
        """``ack_p50_ms`` ... ``audio_to_ack_p99_ms`` of the recent samples (None: no sample)."""
        out: dict[str, float | None] = {}
        for name, samples in (("ack", self.ack_latency_s), ("audio_to_ack", self.audio_to_ack_s)):
            for q in PERCENTILES:
                value = percentile(samples, q)
                out[f"{name}_p{round(q * 100)}_ms"] = None if value is None else round(value * 1000, 3)
        return out
