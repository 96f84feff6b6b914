"""What the subscriber's events show in ``asr-bench e2e``: latencies, CER,
admitted calls and calls without all their finals (``deploy/bench/e2e_bench.py`` has the run)."""

from __future__ import annotations

from typing import Any

import numpy as np

from asr_common.scoring import cer
from asr_gateway.dev.demo import Received
from kb_hooks.events import EventType


def quantiles(samples: list[float], qs: tuple[float, ...] = (0.5, 0.95)) -> dict[str, float | None]:
    values = np.asarray(samples, dtype=np.float64)
    return {f"p{round(q * 100)}": (round(float(np.quantile(values, q)), 1) if values.size else None) for q in qs}


def calls_admitted(received: list[Received]) -> set[str]:
    """The call ids of the call.started events the subscriber got."""
    return {str(r.event.get("call_id")) for r in received if r.event.get("event_type") == EventType.CALL_STARTED}


def finals_missing(received: list[Received], admitted: set[str], last_final_past_ms: float) -> int:
    """Admitted calls without all their finals: no call.ended arrived, or none of their finals
    ends past ``last_final_past_ms`` (ms of the call's audio: inside its last sentence)."""
    ended: set[str] = set()
    complete: set[str] = set()
    for item in received:
        event, kind = item.event, item.event.get("event_type")
        if kind == EventType.CALL_ENDED:
            ended.add(str(event.get("call_id")))
        elif kind == EventType.TRANSCRIPT_FINAL and float(event.get("end_offset_ms") or 0) > last_final_past_ms:
            complete.add(str(event.get("call_id")))
    return len(admitted - (ended & complete))


def measure(
    received: list[Received], audio_end: dict[str, float], reference: str, window: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Latencies and CER from the events as the subscriber got them; with ``window`` the
    latencies (partials, and ``final_ms``: the finals' engine latency) of events that arrived
    within it only."""
    partial_ms: list[float] = []
    final_ms: list[float] = []
    started: dict[str, float] = {}
    first_partial_ms: dict[str, float] = {}
    finals: dict[str, list[tuple[int, str]]] = {}
    ended = 0
    for item in received:
        event, kind = item.event, item.event.get("event_type")
        call_id = str(event.get("call_id"))
        if kind == EventType.CALL_STARTED:
            started[call_id] = item.at
        elif kind == EventType.TRANSCRIPT_PARTIAL:
            end = audio_end.get(str(event.get("event_id")))
            if end is not None and (window is None or window[0] <= item.at <= window[1]):
                partial_ms.append((item.at - end) * 1000)
            if call_id not in first_partial_ms and call_id in started:
                first_partial_ms[call_id] = (item.at - started[call_id]) * 1000
        elif kind == EventType.TRANSCRIPT_FINAL:
            finals.setdefault(call_id, []).append((int(event.get("seq", 0)), str(event.get("text", ""))))
            if window is not None and window[0] <= item.at <= window[1] and event.get("latency_ms") is not None:
                final_ms.append(float(event["latency_ms"]))
        elif kind == EventType.CALL_ENDED:
            ended += 1
    scores = [cer("".join(text for _, text in sorted(items)), reference) for items in finals.values()]
    return {
        "calls_ended": ended,
        "first_partial_latency_ms": quantiles(list(first_partial_ms.values())),
        "partial_latency_ms": quantiles(partial_ms, (0.5, 0.95, 0.99)),
        "partials": len(partial_ms),
        "cer": round(float(np.mean(scores)), 4) if scores else None,
        "final_ms": final_ms,
    }
