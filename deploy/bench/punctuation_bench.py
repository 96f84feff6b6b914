"""``asr-bench punctuation``: precision, recall and F1 of the finals' rule-based punctuation
(``asr_common.punctuation``) on hand-punctuated hotline sentences; prints one JSON object.

    asr-bench punctuation --set recipes/testsets/punctuated_hotline.txt

The set is text without audio, so each line's token times are **synthesized**, as one
utterance (one final): one token per character, spaced by the line's speaking rate (a mean
interval drawn from 170-260 ms, 4-6 characters a second, each interval varied by a lognormal
factor, sigma 0.25); after a comma the speaker pauses 120-500 ms three times in four (and runs
on otherwise), after a full stop or question mark inside the line 250-800 ms nine times in ten,
and 5 % of the other character boundaries get a hesitation of 120-400 ms (seeded, ``--seed``).
The F1 therefore measures the rules against *that pause model* plus their text cues (question
particles 吗/呢/吧, A-not-A questions): how well the thresholds separate the assumed
punctuation pauses from hesitations and the particles pick the question marks. It does not
measure how real callers pause; the hand-placed marks are the reference either way.

``--audio DIR --model DIR`` takes the times from recordings of the same lines instead (a test
set in any ``asr-bench accuracy`` layout, its utterances in the set's line order, e.g. the
set rendered by the demo recipe: ``python -m recipes.recipe --stage more --out
asr_core/demo_model --work exp/testsets --sentences recipes/testsets/punctuated_hotline.txt``):
each reference's characters are aligned to the model's CTC posteriors (Viterbi, 320 ms chunk
mask; ``ctc_search.ctc_token_frames_topk``, as the finals place a winning proposal's tokens)
and a token's time is its frame's. Recognition errors play no part: it measures the rules
on the speaker's (there: espeak-ng's) pauses as the engine's token times show them.

Scored per mark position (after which character): ``breaks`` counts a mark at the right place
whatever its kind, ``marks`` only the same mark; ``per_mark`` splits by ，。？; ``inside``
leaves out each line's last mark (which the rules always set: the engine ended the utterance).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asr_common.itn import Token
from asr_common.punctuation import COMMA, MARKS, QUESTION, STOP, PausePunctuator, Punctuator

SET = Path(__file__).resolve().parents[2] / "recipes" / "testsets" / "punctuated_hotline.txt"


def split_marks(text: str) -> tuple[str, dict[int, str]]:
    """(the characters without marks, {number of characters before a mark: the mark})."""
    chars: list[str] = []
    marks: dict[int, str] = {}
    for ch in text.strip():
        if ch in MARKS:
            marks[len(chars)] = ch
        elif not ch.isspace():
            chars.append(ch)
    return "".join(chars), marks


def synthesize_times(raw: str, marks: dict[int, str], rng: random.Random) -> list[Token]:
    """One (character, spike ms, None) token per character, with the pause model of the module's docstring."""
    interval = rng.uniform(170, 260)
    tokens: list[Token] = []
    now = 0.0
    for i, ch in enumerate(raw):
        if i:
            now += interval * rng.lognormvariate(0, 0.25)
            mark = marks.get(i)
            if mark == COMMA and rng.random() < 0.75:
                now += rng.uniform(120, 500)
            elif mark in (STOP, QUESTION) and rng.random() < 0.9:
                now += rng.uniform(250, 800)
            elif mark is None and rng.random() < 0.05:
                now += rng.uniform(120, 400)
        tokens.append((ch, round(now), None))
    return tokens


def _f1(hits: int, predicted: int, expected: int) -> dict[str, float | int]:
    precision = hits / predicted if predicted else 0.0
    recall = hits / expected if expected else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(f1, 4),
        "hits": hits,
        "predicted": predicted,
        "expected": expected,
    }


TimesFn = Callable[[int, str, dict[int, str]], list[Token]]
"""(line index, characters, hand-placed marks) -> one timed token per character."""


def synthesized(seed: int) -> TimesFn:
    rng = random.Random(seed)
    return lambda _index, raw, marks: synthesize_times(raw, marks, rng)


def aligned(model_dir: Path, audio: Path, lines: Sequence[str]) -> TimesFn:
    """Token times from recordings of ``lines``: each reference aligned to the model's CTC
    posteriors (320 ms chunk mask), a character's time its frame's, in ms."""
    import torch

    from asr_core.ctc_search import ctc_token_frames_topk, ctc_topk
    from asr_core.frontend import compute_fbank, encoder_frame_ms
    from asr_core.model.loader import load_wenet_model
    from deploy.bench.accuracy import read_audio

    loaded = load_wenet_model(model_dir)
    frame_ms = encoder_frame_ms(loaded.frontend, loaded.subsampling)
    ids = {unit: i for i, unit in enumerate(loaded.units)}
    items = read_audio(audio, loaded.frontend.sample_rate)
    if len(items) != len(lines):
        raise ValueError(f"{audio}: {len(items)} utterances for the set's {len(lines)} lines")

    def times(index: int, raw: str, _marks: dict[int, str]) -> list[Token]:
        utt_id, text, samples = items[index]
        if split_marks(text)[0] != raw:
            raise ValueError(f"{audio}: {utt_id} is {text!r}, line {index + 1} of the set {raw!r}")
        fbank = torch.from_numpy(compute_fbank(samples, loaded.frontend)).unsqueeze(0)
        with torch.inference_mode():
            enc, _ = loaded.model.encoder(fbank, torch.tensor([fbank.size(1)]), decoding_chunk_size=8)
            values, topk_ids = ctc_topk(loaded.model.ctc_log_probs(enc)[0], 10)
        tokens = [ids.get(ch, ids.get("<unk>", 1)) for ch in raw]
        frames = ctc_token_frames_topk(values, topk_ids, tokens, loaded.vocab_size, loaded.blank_id)
        if len(frames) != len(raw):
            return [(ch, None, None) for ch in raw]  # no alignment: the rules see no times
        return [(ch, frame * frame_ms, None) for ch, frame in zip(raw, frames, strict=True)]

    return times


def score(lines: Sequence[str], punctuator: Punctuator, times: TimesFn) -> dict[str, Any]:
    """The scores of the module's docstring, and a few lines the rules got wrong."""
    counts = {key: [0, 0, 0] for key in ("breaks", "marks", "inside_breaks", "inside_marks", COMMA, STOP, QUESTION)}
    wrong: list[dict[str, str]] = []
    for index, line in enumerate(lines):
        raw, expected = split_marks(line)
        got_text = punctuator.punctuate(raw, times(index, raw, expected))
        got_raw, got = split_marks(got_text)
        if got_raw != raw:
            raise ValueError(f"the punctuator changed the characters of {raw!r}: {got_text!r}")
        last = len(raw)
        for key, positions in (("breaks", None), ("inside_breaks", last)):
            exp = {p for p in expected if p != positions}
            pred = {p for p in got if p != positions}
            counts[key][0] += len(exp & pred)
            counts[key][1] += len(pred)
            counts[key][2] += len(exp)
        for key, positions in (("marks", None), ("inside_marks", last)):
            exp_items = {(p, m) for p, m in expected.items() if p != positions}
            pred_items = {(p, m) for p, m in got.items() if p != positions}
            counts[key][0] += len(exp_items & pred_items)
            counts[key][1] += len(pred_items)
            counts[key][2] += len(exp_items)
        for mark in (COMMA, STOP, QUESTION):
            exp_at = {p for p, m in expected.items() if m == mark}
            pred_at = {p for p, m in got.items() if m == mark}
            counts[mark][0] += len(exp_at & pred_at)
            counts[mark][1] += len(pred_at)
            counts[mark][2] += len(exp_at)
        if got != expected and len(wrong) < 10:
            wrong.append({"reference": line.strip(), "punctuated": got_text})
    return {
        "breaks": _f1(*counts["breaks"]),
        "marks": _f1(*counts["marks"]),
        "inside": {"breaks": _f1(*counts["inside_breaks"]), "marks": _f1(*counts["inside_marks"])},
        "per_mark": {mark: _f1(*counts[mark]) for mark in (COMMA, STOP, QUESTION)},
        "wrong": wrong,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="asr-bench punctuation", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--set", type=Path, default=SET, help="hand-punctuated sentences, one utterance a line")
    parser.add_argument("--seed", type=int, default=0, help="of the synthesized token times")
    defaults = PausePunctuator()
    parser.add_argument("--comma-pause-ms", type=int, default=defaults.comma_pause_ms)
    parser.add_argument("--stop-pause-ms", type=int, default=defaults.stop_pause_ms)
    parser.add_argument("--audio", type=Path, help="recordings of the set's lines: token times aligned on them")
    parser.add_argument("--model", type=Path, help="with --audio: the WeNet model that aligns them")
    args = parser.parse_args(argv)
    if (args.audio is None) != (args.model is None):
        parser.error("--audio and --model go together")
    try:
        lines = [line for line in args.set.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        parser.error(f"{args.set}: {exc.strerror or exc}")
    punctuator = PausePunctuator(args.comma_pause_ms, args.stop_pause_ms)
    try:
        times = synthesized(args.seed) if args.audio is None else aligned(args.model, args.audio, lines)
        scores = score(lines, punctuator, times)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    result = {
        "set": str(args.set),
        "lines": len(lines),
        "punctuator": {"rules": "pauses", "comma_pause_ms": args.comma_pause_ms, "stop_pause_ms": args.stop_pause_ms},
        "token_times": f"synthesized, seed {args.seed}"
        if args.audio is None
        else f"aligned on {args.audio} by {args.model}",
        **scores,
    }
    print(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
