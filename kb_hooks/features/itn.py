"""ITN: a final's spoken numbers written in digits (``asr_common.itn``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from asr_common.itn import normalize_numbers, normalize_tokens
from kb_hooks.features.base import Feature, NodeDefaults, RouteSettings
from kb_hooks.types import TranscriptUpdate


def _fields(route: RouteSettings, node: NodeDefaults) -> dict[str, Any]:
    return {"itn": bool(route.get("itn"))}


def _rewrite(final: TranscriptUpdate) -> TranscriptUpdate:
    """Text, tokens and n-best with numbers in digits where the route asks for it."""
    if not final.call.itn:
        return final
    normalized = normalize_numbers(final.text)
    tokens = tuple(normalize_tokens(normalized, [(t[0], t[1], t[2]) for t in final.tokens]))
    nbest = tuple((normalize_numbers(text).text, score) for text, score in final.nbest)
    return replace(final, text=normalized.text, tokens=tokens, nbest=nbest)


FEATURE = Feature(
    name="itn",
    route_keys=("itn",),
    per_event="finals: text, tokens and n-best rewritten with numbers in digits, before redaction; "
    "text_raw keeps the engine's text",
    fields=_fields,
    rewrite=_rewrite,
)
