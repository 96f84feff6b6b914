"""KB suggestions: a route's knowledge base matched against every transcript (``kb_hooks.kb``)."""

from __future__ import annotations

from typing import Any

from kb_hooks.features.base import Feature, FileSet, NodeDefaults, RouteSettings
from kb_hooks.kb import load_kb


def _fields(route: RouteSettings, node: NodeDefaults) -> dict[str, Any]:
    return {"kb_set": route.get("kb_set")}


FEATURE = Feature(
    name="kb",
    route_keys=("kb_set",),
    node_settings=("kb_sets", "max_suggestions_per_utterance"),
    file_sets=(FileSet("kb", "kb_sets", load_kb, route_key="kb_set"),),
    per_event="partials suggest, finals confirm or withdraw kb.suggestion events (once per entry and "
    "call unless its score improves); the processor's core",
    fields=_fields,
)
