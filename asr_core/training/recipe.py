"""The whole demo-model recipe: text -> speech -> telephone channel -> fbank -> train -> export.

    python -m asr_core.training.recipe --out asr_core/demo_model --hours 8 --minutes-budget 60

Stages skip work already done in ``--work`` (data directories with an ``index.tsv``, a training
checkpoint), so an interrupted recipe resumes where it stopped. ``--stage data`` only prepares
the data; ``--stage train`` expects it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from asr_core.training import data, textgen

AVERAGE_UTTERANCE_SECONDS = 3.7
DEFAULT_CONFIG = Path(__file__).resolve().parent / "conf" / "demo.yaml"


def prepare_data(work: Path, hours: float, num_test: int, seed: int, processes: int) -> dict[str, int]:
    """Render the training set and the two held-out test sets (unseen voices) under ``work``."""
    num_train = max(10, round(hours * 3600 / AVERAGE_UTTERANCE_SECONDS))
    splits = textgen.make_splits(num_train, num_test, seed)
    sets = {
        "train": (splits.train, False, False),
        "test_sentences": (splits.test_sentences, True, True),
        "test_templates": (splits.test_templates, True, True),
    }
    frames = {}
    for offset, (name, (sentences, held_out, wavs)) in enumerate(sets.items()):
        out = work / name
        if (out / "feats.npy").exists():
            frames[name] = sum(e.frames for e in data.FeatureSet(out))
            continue
        started = time.monotonic()
        frames[name] = data.prepare(out, sentences, seed + 100 * offset, f"{name}_", held_out, wavs, processes)
        print(f"{name}: {len(sentences)} utterances, {frames[name] / 360000:.2f} h, {time.monotonic() - started:.0f} s")
    used, common = textgen.char_coverage(splits.train)
    stats = {"train_utterances": len(splits.train), "distinct_chars": used, "common_3500_covered": common, **frames}
    (work / "data_stats.json").write_text(json.dumps(stats, ensure_ascii=False, indent=1))
    return stats


def make_test_bundle(out: Path, seed: int = 7, count: int = 3) -> None:
    """A few held-out telephone WAVs (8 kHz, 16-bit) + ``text`` for other tests: the seed sentence
    (whose text is in training; this voice and channel are not) and ``count`` unseen sentences."""
    splits = textgen.make_splits(2000, 60, seed=0)
    hotline = [s for s in splits.test_sentences if s.template.startswith("hotline.") and len(s.transcript) <= 14]
    daily = [s for s in splits.test_sentences if s.template.startswith("daily.") and len(s.transcript) <= 10]
    short = [*hotline[: count - 1], *daily[:1]]
    sentences = [textgen.Sentence(textgen.SEED_SENTENCE, "hotline.facility_found"), *short]
    jobs = data.make_jobs(sentences, seed, "hotline_", held_out_voices=True)
    out.mkdir(parents=True, exist_ok=True)
    names = ["hotline_seed", *(f"hotline_{i}" for i in range(1, len(jobs)))]
    for name, job in zip(names, jobs, strict=True):
        pcm, _ = data.render(job)
        data.write_wav(out / f"{name}.wav", pcm)
    lines = [f"{n} {s.transcript}\n" for n, s in zip(names, sentences, strict=True)]
    (out / "text").write_text("".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument("--work", type=Path, default=Path("exp/demo"), help="data and checkpoints")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--hours", type=float, default=8.0, help="hours of training speech to synthesize")
    parser.add_argument("--minutes-budget", type=float, default=60.0, help="wall-clock minutes of training")
    parser.add_argument("--num-test", type=int, default=250, help="utterances in each held-out test set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=2, help="worker processes for synthesis")
    parser.add_argument("--init-from", type=Path, help="start training from this model dir's weights")
    parser.add_argument("--stage", choices=("all", "data", "train", "bundle"), default="all")
    parser.add_argument("--bundle", type=Path, default=Path("tests/data/hotline_8k"), help="--stage bundle output")
    args = parser.parse_args(argv)
    if args.stage == "bundle":
        make_test_bundle(args.bundle)
        return
    if args.stage in ("all", "data"):
        print(json.dumps(prepare_data(args.work, args.hours, args.num_test, args.seed, args.processes)))
    if args.stage in ("all", "train"):
        from asr_core.training import train

        train.main(
            [
                "--config", str(args.config), "--data", str(args.work / "train"), "--exp", str(args.work / "exp"),
                "--out", str(args.out), "--minutes-budget", str(args.minutes_budget), "--seed", str(args.seed),
                *(["--init-from", str(args.init_from)] if args.init_from else []),
            ]
        )


if __name__ == "__main__":
    main()
