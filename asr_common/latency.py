"""``MeasurementRing``: the most recent N measurements (latencies, batch sizes) in constant memory.

The engine (batch sizes, forward and partial latencies) and the publisher (acknowledgement
latencies) keep their recent measurements here for metrics and benchmarks. The buffer is
allocated and touched up front, so a service's resident memory does not creep up while it
fills (a ``deque(maxlen=N)`` of Python floats grows by ~32 bytes a measurement until full,
which a soak cannot tell from a leak).
"""

from __future__ import annotations

from collections.abc import Iterator

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
