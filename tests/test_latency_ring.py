"""MeasurementRing keeps the newest measurements, oldest first, in memory fixed at creation;
Histogram counts every measurement in fixed buckets."""

from __future__ import annotations

import numpy as np
import pytest

from asr_common.latency import Histogram, MeasurementRing


def test_keeps_the_newest_samples_in_order() -> None:
    ring = MeasurementRing(4)
    assert len(ring) == 0 and list(ring) == [] and not ring
    for value in range(3):
        ring.append(value)
    assert list(ring) == [0.0, 1.0, 2.0] and len(ring) == 3
    for value in range(3, 10):
        ring.append(value)
    assert list(ring) == [6.0, 7.0, 8.0, 9.0]
    assert len(ring) == 4 and ring.appended == 10
    assert float(np.percentile(list(ring), 50)) == 7.5
    assert max(ring) == 9.0


def test_memory_is_fixed_at_creation() -> None:
    ring = MeasurementRing(1000)
    before = ring._data.__array_interface__["data"][0]
    for value in range(5000):
        ring.append(float(value))
    assert ring._data.__array_interface__["data"][0] == before and ring._data.shape == (1000,)


def test_rejects_an_empty_ring() -> None:
    with pytest.raises(ValueError, match="positive"):
        MeasurementRing(0)


def test_histogram_counts_every_observation_cumulatively() -> None:
    """Prometheus ``le`` semantics: a value equal to a bound is in that bound's bucket."""
    histogram = Histogram((0.1, 0.5, 1.0))
    for value in (0.05, 0.1, 0.3, 0.5, 0.7, 2.0, 30.0):
        histogram.observe(value)
    assert histogram.cumulative() == [(0.1, 2), (0.5, 4), (1.0, 5), (float("inf"), 7)]
    assert histogram.sum == pytest.approx(33.65)


def test_histogram_bounds_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing and distinct"):
        Histogram((0.5, 0.1))
    with pytest.raises(ValueError, match="increasing and distinct"):
        Histogram(())
