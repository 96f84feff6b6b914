"""RTP receive counters summed over every leg of the node, open or closed, for ``/metrics``."""

from __future__ import annotations

from typing import Any

from rtp.leg import RtpLeg
from rtp.stats import LegStats

RTP_COUNTERS = ("packets", "lost", "late", "duplicate", "reordered", "bad_packets", "foreign_packets", "dtmf_events",
                "foreign_address", "foreign_port", "unknown_payload_packets", "concealed_samples",
                "srtp_auth_failed", "srtp_replayed", "srtp_bad")  # fmt: skip


class RtpTotals:
    """The closed legs' counters, plus the open legs' read at each ``snapshot``."""

    def __init__(self) -> None:
        self.closed = dict.fromkeys(RTP_COUNTERS, 0)
        self.open: set[RtpLeg] = set()

    def snapshot(self) -> dict[str, int]:
        totals = dict(self.closed)
        for leg in list(self.open):
            for name in RTP_COUNTERS:
                totals[name] += getattr(leg.stats, name)
        return totals

    def leg_closed(self, leg: RtpLeg, stats: LegStats) -> None:
        if leg in self.open:
            self.open.discard(leg)
            for name in RTP_COUNTERS:
                self.closed[name] += getattr(stats, name)


class CountedRtpLeg(RtpLeg):
    """An ``RtpLeg`` whose counters are added to the node's ``RtpTotals`` when it closes."""

    def __init__(self, totals: RtpTotals, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._totals = totals
        totals.open.add(self)

    async def close(self) -> LegStats:
        stats = await super().close()
        self._totals.leg_closed(self, stats)
        return stats
