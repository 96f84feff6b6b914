"""Per-route redaction of phone and ID numbers in published text.

Modes (``RedactionMode``): ``mask`` replaces each character by ``*`` (offsets unchanged),
``hash`` replaces the number by ``[phone:3f9a0c1b2d4e]`` (HMAC-SHA256 of the digits with the
configured key, so one number correlates across calls without being readable), ``keep``
publishes it. The entity tag that says a number was present is published in every mode.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from kb_hooks.entities import Entity
from kb_hooks.types import RedactionMode

SENSITIVE_LABELS = frozenset({"phone", "id_number", "number"})
_WORD_PIECE_MARK = "▁"


@dataclass(frozen=True)
class Redacted:
    """Published text and the replacements made, as (begin, end, replacement) on the original text."""

    text: str
    replacements: tuple[tuple[int, int, str], ...]

    def map_offset(self, pos: int) -> int:
        """Where original offset ``pos`` lands in the published text (inside a replacement: its start or end)."""
        shift = 0
        for begin, end, replacement in self.replacements:
            if pos <= begin:
                break
            if pos < end:
                if len(replacement) == end - begin:
                    return pos + shift
                return begin + shift + (len(replacement) if pos > begin else 0)
            shift += len(replacement) - (end - begin)
        return pos + shift


class Redactor:
    """Hides sensitive entities according to a call's mode."""

    def __init__(self, hash_key: bytes = b"") -> None:
        self._key = hash_key

    def published_value(self, entity: Entity, mode: RedactionMode) -> str:
        """The value an entity tag carries (and the text shows) under ``mode``."""
        if entity.label not in SENSITIVE_LABELS or mode is RedactionMode.KEEP:
            return entity.value
        if mode is RedactionMode.MASK:
            return "".join(" " if ch == " " else "*" for ch in entity.value)
        digest = hmac.new(self._key, entity.normalized.encode(), hashlib.sha256).hexdigest()[:12]
        return f"[{entity.label}:{digest}]"

    def redact(self, text: str, entities: Sequence[Entity], mode: RedactionMode) -> Redacted:
        if mode is RedactionMode.KEEP:
            return Redacted(text, ())
        replacements = tuple(
            (e.begin, e.end, self.published_value(e, mode))
            for e in sorted(entities, key=lambda e: e.begin)
            if e.label in SENSITIVE_LABELS
        )
        if not replacements:
            return Redacted(text, ())
        parts: list[str] = []
        last = 0
        for begin, end, replacement in replacements:
            parts.append(text[last:begin])
            parts.append(replacement)
            last = end
        parts.append(text[last:])
        return Redacted("".join(parts), replacements)

    @staticmethod
    def redact_tokens(text: str, tokens: Sequence[str], redacted: Redacted) -> list[str]:
        """Mask every token that overlaps a replaced span of ``text`` (tokens carry times, not the hash)."""
        if not redacted.replacements:
            return list(tokens)
        spans = _align(text, tokens)
        out: list[str] = []
        for token, span in zip(tokens, spans, strict=True):
            hidden = span is None or any(b < span[1] and span[0] < e for b, e, _ in redacted.replacements)
            if hidden and (span is not None or any(ch.isdigit() or ch in "零〇一二三四五六七八九幺两" for ch in token)):
                token = "".join(ch if ch in (" ", _WORD_PIECE_MARK) else "*" for ch in token)
            out.append(token)
        return out


def _align(text: str, tokens: Sequence[str]) -> list[tuple[int, int] | None]:
    """Span of each token in ``text`` (spaces and word-piece marks skipped); None where it is not found."""
    spans: list[tuple[int, int] | None] = []
    pos = 0
    for token in tokens:
        piece = token.replace(_WORD_PIECE_MARK, "").strip()
        found = text.find(piece, pos) if piece else -1
        if found < 0 or any(ch.isalnum() for ch in text[pos:found]):  # spaces and punctuation between tokens
            spans.append(None)
            continue
        spans.append((found, found + len(piece)))
        pos = found + len(piece)
    return spans
