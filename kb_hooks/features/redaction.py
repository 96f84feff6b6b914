"""Redaction: how phone and ID numbers appear in what is published (``kb_hooks.redact``)."""

from __future__ import annotations

from typing import Any

from kb_hooks.features.base import Feature, NodeDefaults, RouteSettings
from kb_hooks.types import RedactionMode


def _fields(route: RouteSettings, node: NodeDefaults) -> dict[str, Any]:
    """The route's ``redaction``; unset (None): the node's ``kb_hooks.default_redaction``."""
    mode = route.get("redaction")
    return {"redaction": RedactionMode(mode) if mode is not None else node.redaction}


FEATURE = Feature(
    name="redaction",
    route_keys=("redaction",),
    node_settings=("default_redaction", "hash_key", "mask_digit_runs"),
    per_event="every transcript, n-best, suggestion and tag: numbers masked, kept or hashed; the "
    "processor's core (kb_hooks.processor), so every later feature sees the published text",
    fields=_fields,
)
