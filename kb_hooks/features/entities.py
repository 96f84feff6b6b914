"""Entities: phone numbers, ID numbers, addresses, dates and times found in each transcript."""

from __future__ import annotations

from kb_hooks.features.base import Feature

FEATURE = Feature(
    name="entities",
    route_keys=(),
    node_settings=("mask_digit_runs", "tags_on_partials"),
    per_event="finals (and partials with tags_on_partials): kb_hooks.entities.extract_entities, whose "
    "results redaction, tags (kind entity), analytics and the work order read; other partials: "
    "numbers only, for their redaction. The processor's core",
)
