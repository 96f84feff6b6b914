"""Token ids -> text, as WeNet turns a decoding result into a transcript.

WeNet joins the units of a result and makes the BPE word-boundary marker "▁" a space, then
strips the ends ("▁HELLO▁WORLD" -> "HELLO WORLD"; character units join without spaces).
Special symbols in angle brackets (``<blank>``, ``<unk>``, ``<sos/eos>``) are never text.
Every transcript the service, ``asr-transcribe`` and the benchmarks print comes from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

WORD_BOUNDARY = "\u2581"  # "▁", SentencePiece's word-start marker in BPE units


def is_special(unit: str) -> bool:
    """Whether a unit is a symbol such as ``<blank>`` rather than text."""
    return len(unit) > 2 and unit[0] == "<" and unit[-1] == ">"


def tokens_to_text(tokens: Iterable[int], units: Sequence[str]) -> str:
    """The transcript of token ids ``tokens`` (indices into ``units``, the model's units.txt)."""
    text = "".join(unit for unit in (units[t] for t in tokens) if not is_special(unit))
    return text.replace(WORD_BOUNDARY, " ").strip()
