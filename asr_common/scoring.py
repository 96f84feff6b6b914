"""Character error rate, the one implementation every scorer uses (benchmarks, the demo, tests).

As WeNet's ``tools/compute-cer.py`` does, punctuation and white space are not scored (a
recognizer that adds "，" or a space between words made no error); every letter or digit, and
so every CJK character, counts once. ``cer`` is the edit distance between the two normalised texts over the
reference's normalised length. ``align`` gives the same
distance's columns, for showing a reader where two texts differ.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal


def scoring_text(text: str) -> str:
    """``text`` as it is scored: letters and digits (every CJK character is a letter), nothing else."""
    return "".join(ch for ch in text if ch.isalnum())


def _distance_rows(ref: Sequence[Hashable], hyp: Sequence[Hashable]) -> Iterator[list[int]]:
    """The Levenshtein table one row at a time: row ``i`` holds the distances between
    ``ref[:i]`` and every ``hyp[:j]`` (substitutions, insertions and deletions, each 1)."""
    row = list(range(len(hyp) + 1))
    yield row
    for i, r in enumerate(ref, 1):
        previous, row = row, [i]
        for j, h in enumerate(hyp, 1):
            row.append(min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (r != h)))
        yield row


def edit_distance(ref: Sequence[Hashable], hyp: Sequence[Hashable]) -> int:
    """Levenshtein distance (substitutions, insertions and deletions, each 1) between two
    sequences: strings (characters) or token ids."""
    last_row = deque(_distance_rows(ref, hyp), maxlen=1)[0]  # the earlier rows are dropped as they come
    return last_row[-1]


EditOp = Literal["=", "S", "D", "I"]
"""One column of an alignment: match, substitution, deletion (reference only), insertion (hypothesis only)."""


@dataclass(frozen=True)
class Edit:
    op: EditOp
    ref: str  # "" for an insertion
    hyp: str  # "" for a deletion


def align(ref: str, hyp: str) -> list[Edit]:
    """A minimal alignment of two texts, one ``Edit`` per column; its non-matches number
    ``edit_distance(ref, hyp)``. Where several are minimal, matches are kept and
    deletions and insertions are preferred to substitutions (井盖[-发生了]破损[+了])."""
    table = list(_distance_rows(ref, hyp))
    edits: list[Edit] = []
    i, j = len(ref), len(hyp)
    while i or j:
        if i and j and ref[i - 1] == hyp[j - 1] and table[i][j] == table[i - 1][j - 1]:
            edits.append(Edit("=", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and table[i][j] == table[i - 1][j] + 1:
            edits.append(Edit("D", ref[i - 1], ""))
            i -= 1
        elif j and table[i][j] == table[i][j - 1] + 1:
            edits.append(Edit("I", "", hyp[j - 1]))
            j -= 1
        else:
            edits.append(Edit("S", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
    return edits[::-1]


def marked_diff(edits: Sequence[Edit]) -> str:
    """One line a reader can scan: matches as they are, runs of edits in brackets:
    ``[ref→hyp]`` substituted, ``[-ref]`` deleted, ``[+hyp]`` inserted (井盖[-发生了]破损)."""
    out: list[str] = []
    run: list[Edit] = []

    def close() -> None:
        if run:
            ref, hyp = "".join(e.ref for e in run), "".join(e.hyp for e in run)
            out.append(f"[-{ref}]" if not hyp else f"[+{hyp}]" if not ref else f"[{ref}→{hyp}]")
            run.clear()

    for edit in edits:
        if edit.op == "=":
            close()
            out.append(edit.ref)
        else:
            run.append(edit)
    close()
    return "".join(out)


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
