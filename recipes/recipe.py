"""The whole demo-model recipe: text -> speech -> telephone channel -> fbank -> train -> export.

    python -m recipes.recipe --out asr_core/demo_model --hours 8 --minutes-budget 60 \
        --finetune-minutes 60 --serving-minutes 60     # what `make demo-model` runs

Data: ``train`` (``--hours`` of hotline and everyday sentences), ``train_rare`` (``--rare-hours``
of sentences built from the words whose characters ``train`` has least) and two held-out test
sets. Training: ``conf/demo.yaml`` from scratch for ``--minutes-budget``, then, with
``--finetune-minutes``, ``conf/demo_finetune.yaml`` from that model (output rows shared by
pinyin syllable, cosine learning rate), then, with ``--serving-minutes``,
``conf/demo_serving.yaml`` (most batches masked with the engine's chunk sizes and left
context); the last stage is exported to ``--out``.

Stages skip work already done in ``--work`` (data directories with an ``index.tsv``, a training
checkpoint), so an interrupted recipe resumes where it stopped. ``--stage data`` only prepares
the data; ``--stage train`` expects it.

The sixth to ninth releases are the fifth fine-tuned further, round by round, on more speech:
``--stage rounds`` renders those sets (``--stage more`` renders them alone) and runs the rounds.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from asr_core.frontend import DEFAULT_FRONTEND, FrontendConfig
from asr_core.model.loader import load_units
from recipes import data, textgen
from recipes.export import config_frontend

AVERAGE_UTTERANCE_SECONDS = 3.7
DEFAULT_CONFIG = Path(__file__).resolve().parent / "conf" / "demo.yaml"
FINETUNE_CONFIG = Path(__file__).resolve().parent / "conf" / "demo_finetune.yaml"
SERVING_CONFIG = Path(__file__).resolve().parent / "conf" / "demo_serving.yaml"


TRAIN_SETS = ("train", "train_rare")


def prepare_data(
    work: Path, hours: float, num_test: int, seed: int, processes: int, rare_hours: float = 0.0,
    frontend: FrontendConfig = DEFAULT_FRONTEND,
) -> dict[str, int]:  # fmt: skip
    """Render the training sets and the two held-out test sets (unseen voices) under ``work``.

    ``train`` draws everyday words by count^0.3; ``train_rare`` (``rare_hours`` of speech by the
    average sentence length, none when 0) draws words whose characters ``train`` has least, so
    that the many characters ``train`` holds only a few times are heard more often."""
    num_train = max(10, round(hours * 3600 / AVERAGE_UTTERANCE_SECONDS))
    splits = textgen.make_splits(num_train, num_test, seed)
    num_rare = round(rare_hours * 3600 / AVERAGE_UTTERANCE_SECONDS)
    sets = {
        "train": (splits.train, False, False),
        "test_sentences": (splits.test_sentences, True, True),
        "test_templates": (splits.test_templates, True, True),
    }
    if num_rare:
        sets["train_rare"] = (textgen.make_rare_set(num_rare, seed + 5, splits), False, False)
    frames = {
        name: _render(work / name, sentences, seed + 100 * offset, f"{name}_", held_out, wavs, processes, frontend)
        for offset, (name, (sentences, held_out, wavs)) in enumerate(sets.items())
    }
    used, common = textgen.char_coverage(splits.train)
    stats = {"train_utterances": len(splits.train), "distinct_chars": used, "common_3500_covered": common, **frames}
    (work / "data_stats.json").write_text(json.dumps(stats, ensure_ascii=False, indent=1))
    return stats


# The sets the sixth to ninth releases were fine-tuned on (``--stage more``): name -> (render
# seed, utterance-id prefix). Their texts avoid both test sets and the tuning set.
MORE_SETS = {
    "train_v6": (777, "t2_"),  # the first 4,500 sentences of train, rendered by the current channel
    "train_v7": (5252, "t3_"),  # new sentences of the training templates
    "train_v7_rare": (6262, "t4_"),  # new sentences of rare-character words
    "train_v8": (8383, "t5_"),  # more new template sentences, none of train_v7's
    "train_v8_rare": (9393, "t6_"),  # rare-character words, rarity counted over every set above
    "train_v9": (8585, "t7_"),  # a third round of new template sentences, none of earlier rounds'
    "train_v9_rare": (9595, "t8_"),  # rare-character words, rarity counted over every set above
}

# Held-out sets ``--stage more`` can render alone (WAVs, held-out voices): name -> (seed, prefix).
# ``test_sentences`` is rendered exactly as the data stage renders it, without its 7.8 h of training speech.
# ``test_templates`` likewise, with the data stage's seed for it.
HELD_OUT_SETS = {
    "tune": (999, "dev_"),
    "test_sentences": (100, "test_sentences_"),
    "test_templates": (200, "test_templates_"),
}
SENTENCE_FILE_SEED = 300
"""Render seed of a hand-written test set (``--sentences FILE``): held-out voices, never a training seed."""


# The fine-tuning rounds after the fifth release (``--stage rounds``), in order, each starting
# from the model the round before exported: (release, sets of MORE_SETS, minutes of
# conf/demo_serving.yaml).
ROUNDS = (
    ("sixth", ("train_v6",), 35.0),
    ("seventh", ("train_v6", "train_v7", "train_v7_rare"), 90.0),
    ("eighth", ("train_v8", "train_v8_rare"), 90.0),
    ("ninth", ("train_v8", "train_v8_rare", "train_v9", "train_v9_rare"), 100.0),
)


def tuning_sentences(splits: textgen.Splits, count: int = 150) -> list[textgen.Sentence]:
    """A dev set for tuning decoding settings (beam sizes, weights), so that the test set is not
    tuned on: unseen sentences of the training templates, none in ``train`` or ``test_sentences``."""
    known = {s.transcript for s in splits.train} | {s.transcript for s in splits.test_sentences}
    train_templates = frozenset(textgen.TEMPLATES) - textgen.TEST_TEMPLATES
    fresh = textgen.generate(4 * count, 4242, 0.6, train_templates)
    return [s for s in fresh if s.transcript not in known][:count]


def more_sentences(
    splits: textgen.Splits, units: set[str], count: int = 6000, rare_count: int = 3000
) -> dict[str, list[textgen.Sentence]]:
    """The texts of :data:`MORE_SETS`. New sentences keep to ``units`` (a released model's output
    characters, so that fine-tuning it needs no new rows) and are never a sentence of either test
    set or of the tuning set; the new template sentences are not in ``train`` either."""
    held_out = [*splits.test_sentences, *splits.test_templates, *tuning_sentences(splits)]
    banned = frozenset(textgen.strip_punctuation(s.transcript) for s in held_out)
    seen = {s.transcript for s in [*splits.train, *splits.test_sentences, *splits.test_templates]}

    def usable(sentence: textgen.Sentence) -> bool:
        text = textgen.strip_punctuation(sentence.transcript)
        return text not in banned and set(text) <= units

    train_templates = frozenset(textgen.TEMPLATES) - textgen.TEST_TEMPLATES
    sets = {"train_v6": splits.train[:4500]}
    for version, text_seed, rare_seed in ((7, 5151, 6161), (8, 5353, 6363), (9, 5757, 6767)):
        # Rounds after the seventh avoid the texts of earlier rounds and count rarity over them too.
        heard = [s for name, sentences in sets.items() if name != "train_v6" for s in sentences]
        earlier = {s.transcript for s in heard}
        # The seventh round dropped train's texts after drawing (5,772 of 6,000 were left); later
        # rounds leave out train's and earlier rounds' texts while drawing, and get their full count.
        exclude = banned | {textgen.strip_punctuation(text) for text in seen | earlier} if heard else banned
        fresh = textgen.generate(count + count // 6, text_seed, 0.6, train_templates, exclude=exclude)
        new = [s for s in fresh if usable(s) and s.transcript not in seen]
        rare = textgen.make_rare_set(rare_count + rare_count // 15, rare_seed, splits, heard=heard)
        sets[f"train_v{version}"] = new[:count]
        sets[f"train_v{version}_rare"] = [s for s in rare if usable(s) and s.transcript not in earlier][:rare_count]
    return sets


def prepare_more(
    work: Path, model: Path, processes: int, names: Sequence[str] = (), frontend: FrontendConfig = DEFAULT_FRONTEND
) -> dict[str, int]:
    """Render :data:`MORE_SETS` and :data:`HELD_OUT_SETS` (or only ``names``) under ``work``,
    skipping those already there; returns fbank frames per set."""
    unknown = set(names) - set(MORE_SETS) - set(HELD_OUT_SETS)
    if unknown:
        raise ValueError(f"unknown set(s) {sorted(unknown)}; --stage more renders {[*MORE_SETS, *HELD_OUT_SETS]}")
    units = set(load_units(model / "units.txt"))
    splits = textgen.make_splits(7784, 250, 0)
    texts = {
        **more_sentences(splits, units),
        "tune": tuning_sentences(splits),
        "test_sentences": splits.test_sentences,
        "test_templates": splits.test_templates,
    }
    held_out = {name: name in HELD_OUT_SETS for name in texts}
    return {
        name: _render(work / name, texts[name], seed, prefix, held_out[name], held_out[name], processes, frontend)
        for name, (seed, prefix) in {**MORE_SETS, **HELD_OUT_SETS}.items()
        if not names or name in names
    }


def render_sentence_file(work: Path, path: Path, processes: int, frontend: FrontendConfig = DEFAULT_FRONTEND) -> int:
    """Render a test set written by hand (one sentence per line, numbers in characters) into
    ``work/<file stem>`` the way the held-out sets are: held-out voices, the current channel,
    WAVs + ``text``; returns its fbank frames."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    sentences = [textgen.Sentence(line, f"file.{path.stem}") for line in lines]
    return _render(work / path.stem, sentences, SENTENCE_FILE_SEED, f"{path.stem}_", True, True, processes, frontend)


def train_rounds(
    work: Path,
    out: Path,
    init_from: Path,
    releases: Sequence[str] = (),
    *,
    config: Path,
    processes: int = 2,
    minutes_scale: float = 1.0,
    seed: int = 0,
) -> None:
    """Run :data:`ROUNDS` (or only ``releases``, in their order there) from ``init_from``: render
    the sets they need that ``work`` lacks, then fine-tune each round from the export of the one
    before. Intermediate releases go to ``work/release_<name>``, the last to ``out``."""
    unknown = set(releases) - {name for name, _, _ in ROUNDS}
    if unknown:
        raise ValueError(f"unknown round(s) {sorted(unknown)}; --stage rounds runs {[name for name, _, _ in ROUNDS]}")
    if minutes_scale <= 0:
        raise ValueError(f"minutes_scale must be positive, got {minutes_scale}")
    chosen = [round_ for round_ in ROUNDS if not releases or round_[0] in releases]
    needed = dict.fromkeys(name for _, sets, _ in chosen for name in sets)
    missing = [name for name in needed if not (work / name / "feats.npy").exists()]
    if missing:
        prepare_more(work, init_from, processes, missing, config_frontend(_read_yaml(config)))
    init = init_from
    for index, (release, sets, minutes) in enumerate(chosen):
        export = out if index == len(chosen) - 1 else work / f"release_{release}"
        minutes *= minutes_scale
        print(f"round {release}: {minutes:g} min on {', '.join(sets)} from {init}", flush=True)
        _train(config, [work / name for name in sets], work / f"exp_{release}", export, minutes, seed, init)
        init = export


def _read_yaml(path: Path) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    return raw


def _render(
    out: Path, sentences: list[textgen.Sentence], seed: int, prefix: str, held_out: bool, wavs: bool, processes: int,
    frontend: FrontendConfig = DEFAULT_FRONTEND,
) -> int:  # fmt: skip
    """``data.prepare`` unless ``out`` already holds the set (an interrupted recipe resumes);
    returns its fbank frames."""
    if (out / "feats.npy").exists():
        return sum(e.frames for e in data.FeatureSet(out))
    started = time.monotonic()
    frames = data.prepare(out, sentences, seed, prefix, held_out, wavs, processes, frontend)
    print(f"{out.name}: {len(sentences)} utterances, {frames / 360000:.2f} h, {time.monotonic() - started:.0f} s")
    return frames


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
    parser.add_argument(
        "--rare-hours", type=float, default=7.0, help="extra speech made of words with the rarest characters"
    )
    parser.add_argument("--minutes-budget", type=float, default=60.0, help="wall-clock minutes of training")
    parser.add_argument(
        "--finetune-minutes", type=float, default=0.0,
        help="then fine-tune the result this long with conf/demo_finetune.yaml (pinyin-tied outputs, cosine lr)",
    )  # fmt: skip
    parser.add_argument("--finetune-config", type=Path, default=FINETUNE_CONFIG, help="same network as --config")
    parser.add_argument(
        "--serving-minutes", type=float, default=0.0,
        help="then fine-tune this long with conf/demo_serving.yaml (the engine's chunk sizes and left context)",
    )  # fmt: skip
    parser.add_argument("--serving-config", type=Path, default=SERVING_CONFIG, help="same network as --config")
    parser.add_argument("--num-test", type=int, default=250, help="utterances in each held-out test set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=2, help="worker processes for synthesis")
    parser.add_argument("--init-from", type=Path, help="start training from this model dir's weights")
    parser.add_argument(
        "--stage", choices=("all", "data", "train", "bundle", "more", "rounds"), default="all",
        help="more: render the sixth to ninth releases' fine-tuning sets, the tuning set and the two test sets "
        "into --work (units of --init-from, default --out); rounds: the fine-tuning rounds that made the "
        "sixth to ninth releases, from --init-from (default --out), rendering the sets they need",
    )  # fmt: skip
    parser.add_argument(
        "--sets", nargs="+", default=(), metavar="NAME",
        help=f"--stage more renders only these ({', '.join([*MORE_SETS, *HELD_OUT_SETS])}); default all",
    )  # fmt: skip
    parser.add_argument(
        "--sentences", nargs="+", type=Path, default=(), metavar="FILE",
        help="--stage more renders these hand-written test sets (one sentence per line) into --work/<stem>, "
        "and only them unless --sets is given",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", nargs="+", default=(), metavar="RELEASE",
        help=f"--stage rounds runs only these ({', '.join(name for name, _, _ in ROUNDS)}); default all",
    )  # fmt: skip
    parser.add_argument(
        "--minutes-scale", type=float, default=1.0, help="--stage rounds: multiply each round's minutes by this"
    )
    parser.add_argument("--bundle", type=Path, default=Path("tests/data/hotline_8k"), help="--stage bundle output")
    args = parser.parse_args(argv)
    # Features are computed with the front end of the training config (its dataset_conf).
    frontend = config_frontend(_read_yaml(args.serving_config if args.stage == "rounds" else args.config))
    if args.stage == "bundle":
        make_test_bundle(args.bundle)
        return
    if args.stage == "more":
        frames = {path.stem: render_sentence_file(args.work, path, args.processes, frontend) for path in args.sentences}
        if args.sets or not args.sentences:
            frames.update(prepare_more(args.work, args.init_from or args.out, args.processes, args.sets, frontend))
        print(json.dumps(frames))
        return
    if args.stage == "rounds":
        init = args.init_from or args.out
        train_rounds(args.work, args.out, init, args.rounds, config=args.serving_config, processes=args.processes,
                     minutes_scale=args.minutes_scale, seed=args.seed)  # fmt: skip
        return
    if args.stage in ("all", "data"):
        stats = prepare_data(args.work, args.hours, args.num_test, args.seed, args.processes, args.rare_hours, frontend)
        print(json.dumps(stats))
    if args.stage in ("all", "train"):
        train_dirs = [args.work / name for name in TRAIN_SETS if (args.work / name / "index.tsv").exists()]
        # (config, minutes, checkpoint dir, export dir unless last); each stage starts from the one before.
        stages = [(args.config, args.minutes_budget, "exp", "base")]
        if args.finetune_minutes > 0:
            stages.append((args.finetune_config, args.finetune_minutes, "exp_finetune", "finetuned"))
        if args.serving_minutes > 0:
            stages.append((args.serving_config, args.serving_minutes, "exp_serving", "serving"))
        init = args.init_from
        for index, (config, minutes, exp, export) in enumerate(stages):
            out = args.out if index == len(stages) - 1 else args.work / export
            _train(config, train_dirs, args.work / exp, out, minutes, args.seed, init)
            init = out


def _train(
    config: Path, data_dirs: list[Path], exp: Path, out: Path, minutes: float, seed: int, init_from: Path | None
) -> None:
    from recipes import train

    train.main(
        [
            "--config", str(config), "--data", *(str(d) for d in data_dirs), "--exp", str(exp), "--out", str(out),
            "--minutes-budget", str(minutes), "--seed", str(seed),
            *(["--init-from", str(init_from)] if init_from else []),
        ]
    )  # fmt: skip


if __name__ == "__main__":
    main()
