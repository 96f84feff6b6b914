"""Punctuation of finals (``asr_common.punctuation``), after ITN."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from asr_common.punctuation import PUNCTUATORS
from kb_hooks.features.base import Feature, NodeDefaults, RouteSettings
from kb_hooks.types import TranscriptUpdate


def _fields(route: RouteSettings, node: NodeDefaults) -> dict[str, Any]:
    return {"punctuation": route.get("punctuation", "off")}


def _rewrite(final: TranscriptUpdate) -> TranscriptUpdate:
    if final.call.punctuation == "off":
        return final
    return replace(final, text=PUNCTUATORS[final.call.punctuation].punctuate(final.text, final.tokens))


FEATURE = Feature(
    name="punctuation",
    route_keys=("punctuation",),
    per_event="finals: the text punctuated (tokens and n-best as they are), before redaction; "
    "text_raw keeps the engine's text",
    fields=_fields,
    rewrite=_rewrite,
)
