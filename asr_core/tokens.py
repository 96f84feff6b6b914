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


def text_to_tokens(text: str, units: Sequence[str]) -> list[int] | None:
    """Token ids spelling ``text`` in ``units``, longest unit first (None: some part has no unit).

    For hotword phrases: character units spell Chinese one character a unit; with BPE units
    each space-separated word starts with the "▁" marker, as SentencePiece writes it.
    """
    index = {unit: i for i, unit in enumerate(units) if not is_special(unit)}
    longest = max((len(unit) for unit in index), default=0)
    bpe = any(unit.startswith(WORD_BOUNDARY) for unit in index)
    words = text.split()
    pieces = [WORD_BOUNDARY + w for w in words] if bpe else ["".join(words)]
    tokens: list[int] = []
    for piece in pieces:
        at = 0
        while at < len(piece):
            for size in range(min(longest, len(piece) - at), 0, -1):
                found = index.get(piece[at : at + size])
                if found is not None:
                    tokens.append(found)
                    at += size
                    break
            else:
                return None
    return tokens
