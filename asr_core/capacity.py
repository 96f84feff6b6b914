"""What a scheduler's streams cost, measured per chunk size, and what they would cost at their
longest chunks: the admission check's idea of real capacity under surge (asr_core/surge.py).

A longer chunk costs less per second of audio (fewer steps, larger batches). A node whose
streams may move to longer chunks is full only when even their longest chunks would keep its
scheduler busy more than all of the time; until then surge can absorb a new call. The costs
come from the scheduler's own batches (``observe``), kept current by an exponentially weighted
mean, so they follow what the machine gives now (other processes, the finals, turbo clocks).
"""

from __future__ import annotations

from collections.abc import Iterable

COST_SMOOTHING = 0.05
"""Weight of each new batch in the mean: about the latest 20 batches of a chunk size count."""


class ChunkCosts:
    """Scheduler seconds per stream-second of audio, per chunk size (ms).

    Written by the scheduler's thread, read by any (single dict reads and writes).
    """

    def __init__(self, smoothing: float = COST_SMOOTHING) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self._cost: dict[int, float] = {}

    def observe(self, chunk_ms: int, streams: int, seconds: float) -> None:
        """A batch of ``streams`` chunks of ``chunk_ms`` took ``seconds`` of the scheduler."""
        cost = seconds / (streams * chunk_ms / 1000.0)
        previous = self._cost.get(chunk_ms)
        self._cost[chunk_ms] = cost if previous is None else previous + self.smoothing * (cost - previous)

    def cost(self, chunk_ms: int) -> float | None:
        """Seconds per stream-second at ``chunk_ms``; None until a batch of that size ran."""
        return self._cost.get(chunk_ms)

    def load(self, chunk_sizes: Iterable[int]) -> float | None:
        """The share of the scheduler's time streams running at ``chunk_sizes`` (one per
        stream) would take: over 1.0, they fall behind. None while a size has no measurement."""
        total = 0.0
        for chunk_ms in chunk_sizes:
            cost = self._cost.get(chunk_ms)
            if cost is None:
                return None
            total += cost
        return total
