"""Demand tags: a route's tag rule set matched against finals (``kb_hooks.tags``)."""

from __future__ import annotations

from typing import Any

from kb_hooks.features.base import Feature, FileSet, NodeDefaults, RouteSettings
from kb_hooks.tags import load_tag_rules


def _fields(route: RouteSettings, node: NodeDefaults) -> dict[str, Any]:
    name = route.get("tag_rules")
    return {"tag_rules": (name,) if name else ()}


FEATURE = Feature(
    name="tags",
    route_keys=("tag_rules",),
    node_settings=("tag_rule_sets", "tags_on_partials"),
    file_sets=(FileSet("tags", "tag_rule_sets", load_tag_rules, route_key="tag_rules"),),
    per_event="finals (partials too with tags_on_partials): one tags event with the rules' new "
    "matches and the new entities; the processor's core",
    fields=_fields,
)
