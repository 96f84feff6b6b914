"""Hotwords: a route's phrase file biasing its calls' CTC search (``asr_core.context_graph``)."""

from __future__ import annotations

from kb_hooks.features.base import Feature

FEATURE = Feature(
    name="hotwords",
    route_keys=("hotwords",),
    per_event="nothing per event here: the engine uses it. asr_gateway.hotwords.HotwordLists loads "
    "each route's phrase file (relative to the routes file) as a context graph, checks and "
    "reloads it with the routes, and a call's streams search their finals with it",
)
