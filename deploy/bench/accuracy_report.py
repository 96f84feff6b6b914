"""What ``asr-bench accuracy`` reports beside the CER: the worst utterances aligned with their
references, a warning where the finals score worse than the partials, the CER difference of
two modes with its bootstrap interval, and the ``--compare`` specification (``KEY=V1,V2``).
Pure functions of texts; the decoding is ``accuracy``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from asr_common.scoring import align, char_errors, marked_diff, scoring_text
from asr_core.context_graph import load_phrases

WORST = 5  # utterances listed per mode with the most errors
RESAMPLES = 2000  # bootstrap resamples of the utterances per CER difference
GAP = "＊"  # an aligned column's empty side (full width: lines up with CJK characters)


def final_method(hyps: dict[str, list[str]]) -> str:
    """The method whose texts the service would publish as finals: "joint", else "rescore",
    else "greedy" (``--beam 0``)."""
    return "joint" if "joint" in hyps else "rescore" if "rescore" in hyps else "greedy"


def finals_warning(mode: str, cer: dict[str, float]) -> str | None:
    """A line for the report when the finals of ``mode`` score worse than its partials (CTC
    greedy): the finals search then costs accuracy instead of adding it."""
    method = "joint" if "joint" in cer else "rescore" if "rescore" in cer else None
    if method is None or cer[method] <= cer["greedy"]:
        return None
    hint = (
        "the attention decoder's proposals hurt on this set: keep attention_beam (engine, route) at 0, "
        "WeNet's rescoring"
        if method == "joint"
        else "the attention rescoring hurts on this set: its decoder may not suit this speech"
    )
    return (
        f"{mode}: finals ({method}) {100 * cer[method]:.1f} % CER are worse than the partials "
        f"(greedy) {100 * cer['greedy']:.1f} %; {hint}"
    )


def worst_utterances(ids: list[str], refs: list[str], hyps: list[str], count: int) -> list[dict[str, Any]]:
    """The ``count`` utterances with the most character errors (then the highest CER), each
    with its alignment: ``diff`` marks the edits in one line, ``ref``/``hyp`` are the scored
    texts aligned column by column (＊ where one side has nothing)."""
    scored = []
    for utt_id, ref, hyp in zip(ids, refs, hyps, strict=True):
        errors, length = char_errors(hyp, ref)
        if errors:
            scored.append((errors, errors / max(1, length), utt_id, ref, hyp))
    scored.sort(key=lambda row: (-row[0], -row[1], row[2]))
    out = []
    for errors, rate, utt_id, ref, hyp in scored[:count]:
        edits = align(scoring_text(ref), scoring_text(hyp))
        out.append(
            {
                "id": utt_id,
                "errors": errors,
                "cer": round(rate, 4),
                "diff": marked_diff(edits),
                "ref": "".join(e.ref or GAP for e in edits),
                "hyp": "".join(e.hyp or GAP for e in edits),
            }
        )
    return out


def paired_difference(
    refs: list[str], first: list[str], second: list[str], resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, Any]:
    """``second``'s corpus CER minus ``first``'s on the same utterances, and how far chance alone
    moves it: the 95 % interval of that difference over ``resamples`` draws of the utterances
    with replacement (a paired bootstrap; seeded, so a rerun reports the same interval).

    Decoding is deterministic, so two runs of one setting differ by nothing; what a difference
    is measured against is which sentences the set happens to hold. An interval that holds 0
    is a difference this set cannot tell from none."""
    first_errors = np.array([char_errors(hyp, ref)[0] for hyp, ref in zip(first, refs, strict=True)])
    second_errors = np.array([char_errors(hyp, ref)[0] for hyp, ref in zip(second, refs, strict=True)])
    lengths = np.array([len(scoring_text(ref)) for ref in refs])
    gained = second_errors - first_errors  # (N,) extra errors per utterance
    draws = np.random.default_rng(seed).integers(0, len(refs), size=(resamples, len(refs)))  # (R, N)
    spread = gained[draws].sum(axis=1) / np.maximum(1, lengths[draws].sum(axis=1))  # (R,)
    low, high = np.percentile(spread, [2.5, 97.5])
    return {
        "difference": round(float(gained.sum() / max(1, lengths.sum())), 4),
        "ci95": [round(float(low), 4), round(float(high), 4)],
        "utterances_differ": sum(a != b for a, b in zip(first, second, strict=True)),
    }


COMPARE_KEYS = ("chunk_ms", "hotwords", "itn", "attention_beam")


def parse_compare(spec: str) -> tuple[str, list[str]]:
    """``KEY=V1,V2[,...]`` -> (key, values); ValueError naming what is wrong."""
    key, _, values = spec.partition("=")
    choices = [v.strip() for v in values.split(",") if v.strip()]
    if key not in COMPARE_KEYS:
        raise ValueError(f"--compare {spec}: the key must be one of {', '.join(COMPARE_KEYS)}")
    if len(choices) < 2:
        raise ValueError(f"--compare {spec}: give two or more values, e.g. chunk_ms=160,320")
    if key == "chunk_ms" and not set(choices) <= {"160", "320", "640"}:
        raise ValueError(f"--compare {spec}: chunk sizes are 160, 320 and 640")
    if key == "attention_beam" and not all(v.isdigit() for v in choices):
        raise ValueError(f"--compare {spec}: attention beams are whole numbers (0: rescore only)")
    if key == "itn" and not set(choices) <= {"off", "on"}:
        raise ValueError(f"--compare {spec}: itn takes off and on")
    if key == "hotwords":
        for value in choices:
            if value != "off":
                load_phrases(Path(value))  # a bad file fails before any decoding
    return key, choices
