"""``MeasurementRing``: the most recent N measurements (latencies, batch sizes) in constant memory;
``Histogram``: every measurement since start, counted in fixed buckets.

The engine (batch sizes, forward and partial latencies) and the publisher (acknowledgement
latencies) keep their recent measurements here for metrics and benchmarks. The buffer is
allocated and touched up front, so a service's resident memory does not creep up while it
fills (a ``deque(maxlen=N)`` of Python floats grows by ~32 bytes a measurement until full,
which a soak cannot tell from a leak).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

import numpy as np


class MeasurementRing:
    """Append from one thread, read from any: a reader may see a sample or two mid-update,
    which percentiles do not mind."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._data = np.full(capacity, np.nan)  # np.full writes every page now, np.zeros would not
        self._appended = 0

    @property
    def capacity(self) -> int:
        return int(self._data.shape[0])

    @property
    def appended(self) -> int:
        """Samples appended since creation (also those already overwritten)."""
        return self._appended

    def append(self, value: float) -> None:
        self._data[self._appended % self.capacity] = value
        self._appended += 1

    def values(self) -> np.ndarray:
        """The kept samples, oldest first (a copy)."""
        n, cap = self._appended, self.capacity
        if n <= cap:
            return self._data[:n].copy()
        start = n % cap
        return np.concatenate((self._data[start:], self._data[:start]))

    def __len__(self) -> int:
        return min(self._appended, self.capacity)

    def __iter__(self) -> Iterator[float]:
        return iter(self.values().tolist())


# Bucket upper bounds (s) for latencies between about 10 ms and 10 s; (streams) for batch sizes.
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Histogram:
    """Counts of every observation since start in fixed buckets, with their sum.

    Prometheus histogram semantics: bucket ``i`` holds values ``<= bounds[i]``, a last one the
    rest. Unlike recent-sample quantiles, these counts add up across nodes and over time
    windows (``rate`` of the buckets, summed, then ``histogram_quantile``). One writer thread;
    readers from any thread may see a count and the sum one observation apart.
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bucket bounds must be increasing and distinct, got {bounds}")
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) per bucket, the last bound ``inf`` (the total count)."""
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), list(self._counts), strict=True):
            total += count
            out.append((bound, total))
        return out
