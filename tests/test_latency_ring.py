"""MeasurementRing keeps the newest measurements, oldest first, in memory fixed at creation."""

from __future__ import annotations

import numpy as np
import pytest

from asr_common.latency import MeasurementRing


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
