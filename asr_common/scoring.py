"""Character error rate, the one implementation every scorer uses (benchmarks, the demo, tests).

As WeNet's ``tools/compute-cer.py`` does, punctuation and white space are not scored (a
recognizer that adds "，" or a space between words made no error); every letter or digit, and
so every CJK character, counts once. ``cer`` is the edit distance between the two normalised texts over the
reference's normalised length.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence


def scoring_text(text: str) -> str:
    """``text`` as it is scored: letters and digits (every CJK character is a letter), nothing else."""
    return "".join(ch for ch in text if ch.isalnum())


def edit_distance(ref: Sequence[Hashable], hyp: Sequence[Hashable]) -> int:
    """Levenshtein distance (substitutions, insertions and deletions, each 1) between two
    sequences: strings (characters) or token ids."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[-1]


def char_errors(hyp: str, ref: str) -> tuple[int, int]:
    """(character errors, reference characters) after scoring normalisation, for corpus CERs."""
    hyp, ref = scoring_text(hyp), scoring_text(ref)
    return edit_distance(ref, hyp), len(ref)


def cer(hyp: str, ref: str) -> float:
    """Character error rate of one hypothesis (an empty reference counts as one character)."""
    errors, length = char_errors(hyp, ref)
    return errors / max(1, length)


def corpus_cer(hyps: Iterable[str], refs: Iterable[str]) -> float:
    """All errors over all reference characters (not the mean of per-utterance rates)."""
    errors = length = 0
    for hyp, ref in zip(hyps, refs, strict=True):
        e, n = char_errors(hyp, ref)
        errors, length = errors + e, length + n
    return errors / max(1, length)


def name_hits(hyps: Iterable[str], refs: Iterable[str], names: Iterable[str]) -> tuple[int, int, int]:
    """(names recognized, names in the references, names the hypotheses add) over a corpus.

    A listed name counts each time it occurs in a reference (scoring normalisation, whole name
    only); it is recognized as often as the hypothesis holds it exactly, up to that count. The
    third figure counts names a hypothesis holds more often than its reference (a phrase list
    that fires where nobody said it)."""
    wanted = [scoring_text(n) for n in names]
    hits = total = added = 0
    for hyp, ref in zip(hyps, refs, strict=True):
        hyp, ref = scoring_text(hyp), scoring_text(ref)
        for name in wanted:
            if not name:
                continue
            said, heard = ref.count(name), hyp.count(name)
            total += said
            hits += min(said, heard)
            added += max(0, heard - said)
    return hits, total, added
