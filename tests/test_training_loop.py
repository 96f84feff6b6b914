"""Our U2++ training loop on the bundled telephone WAVs with a tiny model: the loss goes down,
training resumes from its checkpoint, and the exported directory loads as a WeNet model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from asr_core.model.loader import load_units, load_wenet_model
from deploy.bench import accuracy
from recipes import data, export, train
from tests.demo_quality import DEMO_MODEL

BUNDLE = Path(__file__).resolve().parent / "data" / "hotline_8k"

TINY = {
    "encoder": "conformer",
    "encoder_conf": {
        "output_size": 32,
        "attention_heads": 2,
        "linear_units": 64,
        "num_blocks": 2,
        "dropout_rate": 0.0,
        "positional_dropout_rate": 0.0,
        "input_layer": "conv2d",
        "use_dynamic_chunk": True,
        "causal": True,
        "cnn_module_kernel": 7,
        "cnn_module_norm": "layer_norm",
    },
    "decoder": "bitransformer",
    "decoder_conf": {
        "attention_heads": 2,
        "linear_units": 64,
        "num_blocks": 1,
        "r_num_blocks": 1,
        "dropout_rate": 0.0,
        "positional_dropout_rate": 0.0,
    },
    "model_conf": {"ctc_weight": 0.3, "reverse_weight": 0.3, "lsm_weight": 0.1},
    "dataset_conf": {"spec_aug_conf": {"num_t_mask": 1, "num_f_mask": 1, "max_t": 5, "max_f": 5}},
    "optim_conf": {"lr": 0.004},
    "scheduler_conf": {"warmup_steps": 5},
    "recipe_conf": {"max_frames_in_batch": 4000, "checkpoint_minutes": 60, "dev_utterances": 0, "log_every": 100},
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("train")
    data.prepare_from_testset(BUNDLE, root / "data")
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    return root / "data", config


def test_loss_goes_down_resumes_and_exports(prepared: tuple[Path, Path], tmp_path: Path) -> None:
    data_dir, config = prepared
    torch.manual_seed(0)
    trainer = train.Trainer(config, data_dir, tmp_path / "exp", bf16=False)
    assert len(trainer.batches) == 1  # four utterances, one batch
    trainer.run(max_steps=12)
    losses = [h["loss"] for h in trainer.history]
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])
    assert (tmp_path / "exp" / "checkpoint.pt").exists() and (tmp_path / "exp" / "best.pt").exists()

    resumed = train.Trainer(config, data_dir, tmp_path / "exp", bf16=False)
    assert resumed.step == 12 and len(resumed.history) == 12
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name
    resumed.run(max_steps=14)
    assert resumed.step == 14

    out = tmp_path / "model"
    export.export_model_dir(tmp_path / "exp" / "model", tmp_path / "exp" / "best.pt", out)
    assert sorted(p.name for p in out.iterdir()) == ["final.pt", "global_cmvn", "train.yaml", "units.txt"]
    loaded = load_wenet_model(out)
    units = (out / "units.txt").read_text(encoding="utf-8").splitlines()
    assert units[0] == "<blank> 0" and units[1] == "<unk> 1" and units[-1] == f"<sos/eos> {loaded.vocab_size - 1}"
    assert "井 " in "\n".join(units)
    feats = torch.from_numpy(data.FeatureSet(data_dir).feats(0)).unsqueeze(0)
    enc, _ = loaded.model.encoder(feats, torch.tensor([feats.size(1)]), decoding_chunk_size=4)
    assert enc.shape[-1] == 32 and torch.isfinite(enc).all()

    report = accuracy.evaluate(out, BUNDLE, beam=2)
    assert report["utterances"] == 4
    assert set(report["cer"]) == {"160ms", "320ms", "640ms", "full"}
    assert all(v["greedy"] >= 0.0 for v in report["cer"].values())


def test_export_averages_the_lowest_dev_loss_checkpoints(prepared: tuple[Path, Path], tmp_path: Path) -> None:
    """``average_best``: the weights of the N lowest-dev-loss checkpoints are kept, and their mean is
    exported exactly when it scores a lower dev loss than the best single checkpoint."""
    data_dir, config = prepared
    raw = yaml.safe_load(config.read_text())
    raw["recipe_conf"]["average_best"] = 2
    config = tmp_path / "average.yaml"
    config.write_text(yaml.safe_dump(raw))
    torch.manual_seed(0)
    trainer = train.Trainer(config, data_dir, tmp_path / "exp", bf16=False)
    trainer.dev_ids = trainer.train_ids[:2]  # four utterances are too few for a held-out dev split
    rng = np.random.default_rng(0)
    devs = {}
    for _ in range(4):
        for _ in range(3):
            trainer.train_step(trainer._batch(trainer.train_ids, True, rng))
        devs[f"step{trainer.step}.pt"] = trainer.save_checkpoint()
    snapshots = tmp_path / "exp" / "snapshots"
    kept = sorted(devs, key=devs.__getitem__)[:2]
    assert sorted(p.name for p in snapshots.glob("*.pt")) == sorted(kept)
    assert json.loads((snapshots / "index.json").read_text()) == {name: devs[name] for name in kept}

    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    chosen = trainer.export_state()
    assert all(torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
    states = [torch.load(snapshots / name, weights_only=True) for name in kept]
    mean = {k: (states[0][k] + states[1][k]) / 2 for k in states[0]}
    trainer.model.load_state_dict(mean)
    averaged_dev = trainer.dev_loss()
    assert chosen.name == ("average.pt" if averaged_dev < min(devs.values()) else "best.pt")
    if chosen.name == "average.pt":
        exported = torch.load(chosen, weights_only=True)
        assert all(torch.allclose(exported[k], mean[k]) for k in mean if not k.endswith(".pe"))


def test_helpers() -> None:
    assert train.make_batches([5, 1, 3, 2], max_frames=6) == [[1, 3], [2], [0]]
    assert train.warmup_lr(10, 1e-3, 10) == pytest.approx(1e-3)
    assert train.warmup_lr(5, 1e-3, 10) == pytest.approx(5e-4)
    assert train.warmup_lr(40, 1e-3, 10) == pytest.approx(5e-4)
    rng = np.random.default_rng(0)
    masked = train.spec_augment(np.ones((100, 80), np.float32), train.SpecAugConfig(), rng)
    assert 0 < (masked == 0).mean() < 1
    assert export.build_units(["井盖", "盖子"]) == ["<blank>", "<unk>", "井", "子", "盖", "<sos/eos>"]


def test_tied_fine_tuning_from_a_model(prepared: tuple[Path, Path], tmp_path: Path) -> None:
    """--init-from keeps the start model's units, CMVN and function; tying by pinyin and the cosine
    schedule train; best.pt and the export are plain WeNet weights that compute what the tied model does."""
    data_dir, config = prepared
    torch.manual_seed(0)
    train.Trainer(config, data_dir, tmp_path / "base", bf16=False).run(max_steps=2)
    start = tmp_path / "start"
    export.export_model_dir(tmp_path / "base" / "model", tmp_path / "base" / "best.pt", start)
    raw = yaml.safe_load(config.read_text())
    raw["recipe_conf"].update(
        tie_by_pronunciation=True, lr_schedule="cosine", final_lr_fraction=0.1, syllable_ctc_weight=0.5,
        serving_chunk_probability=1.0, serving_chunk_frames=[2, 4], serving_left_chunks=3,
    )  # fmt: skip
    tied_config = tmp_path / "tied.yaml"
    tied_config.write_text(yaml.safe_dump(raw))

    trainer = train.Trainer(tied_config, [data_dir, data_dir], tmp_path / "exp", bf16=False, init_from=start)
    assert len(trainer.data) == 8  # the same directory twice reads as one set of 8
    for name in ("units.txt", "global_cmvn"):
        assert (tmp_path / "exp" / "model" / name).read_bytes() == (start / name).read_bytes()
    start_state = torch.load(start / "final.pt", weights_only=True)
    assert torch.allclose(trainer.model.ctc.ctc_lo.weight, start_state["ctc.ctc_lo.weight"], atol=1e-6)
    assert "ctc.ctc_lo.parametrizations.weight.original" in trainer.model.state_dict()
    assert trainer.learning_rate(0.0) == pytest.approx(0.004 / 5)  # first of 5 warm-up steps
    encoder = trainer.model.encoder
    encoder.train()
    _, kwargs = trainer._serving_chunk(encoder, (), {})
    assert kwargs["decoding_chunk_size"] in (2, 4) and kwargs["num_decoding_left_chunks"] == 3
    assert trainer._serving_chunk(encoder, (), {"decoding_chunk_size": -1}) is None  # an explicit choice stays
    encoder.eval()
    assert trainer._serving_chunk(encoder, (), {}) is None  # dev loss and decoding: untouched
    trainer.run(max_steps=10)
    assert trainer.learning_rate(0.5) == pytest.approx(0.004 * (0.1 + 0.9 * 0.5))
    assert trainer.learning_rate(1.0) == pytest.approx(0.004 * 0.1)
    losses = [h["loss"] for h in trainer.history]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    assert all(h["loss"] > h["loss_ctc"] * 0.3 + h["loss_att"] * 0.7 for h in trainer.history)  # + syllable CTC
    assert all(h["loss_syllable"] > 0 for h in trainer.history)

    resumed = train.Trainer(tied_config, [data_dir, data_dir], tmp_path / "exp", bf16=False, init_from=start)
    assert resumed.step == 10
    assert torch.equal(resumed.model.ctc.ctc_lo.weight, trainer.model.ctc.ctc_lo.weight)

    best = torch.load(tmp_path / "exp" / "best.pt", weights_only=True)
    assert set(best) == set(start_state) | {k for k in best if k.endswith(".pe")}
    out = tmp_path / "tuned"
    export.export_model_dir(tmp_path / "exp" / "model", tmp_path / "exp" / "best.pt", out)
    loaded = load_wenet_model(out)
    feats = torch.from_numpy(data.FeatureSet(data_dir).feats(0)).unsqueeze(0)
    trainer.model.eval()
    with torch.no_grad():
        enc, _ = trainer.model.encoder(feats, torch.tensor([feats.size(1)]))
        ours = trainer.model.ctc_log_probs(enc)
        enc2, _ = loaded.model.encoder(feats, torch.tensor([feats.size(1)]))
        theirs = loaded.model.ctc_log_probs(enc2)
    assert torch.allclose(ours, theirs, atol=1e-4)


def test_recipe_trains_then_fine_tunes(prepared: tuple[Path, Path], tmp_path: Path) -> None:
    """`--finetune-minutes` / `--serving-minutes`: each stage starts from the one before's export."""
    from recipes import recipe

    data_dir, config = prepared
    work = tmp_path / "work"
    (work / "train").mkdir(parents=True)
    for name in ("index.tsv", "feats.npy"):
        (work / "train" / name).symlink_to(data_dir / name)
    raw = yaml.safe_load(config.read_text())
    raw["recipe_conf"].update(tie_by_pronunciation=True, lr_schedule="cosine")
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(yaml.safe_dump(raw))
    out = tmp_path / "model"
    budgets = ["--minutes-budget", "0.01", "--finetune-minutes", "0.01", "--serving-minutes", "0.01"]
    recipe.main(["--out", str(out), "--work", str(work), "--stage", "train", "--config", str(config), *budgets,
                 "--finetune-config", str(tuned), "--serving-config", str(tuned)])  # fmt: skip
    assert (work / "base" / "final.pt").exists() and (work / "exp_finetune" / "checkpoint.pt").exists()
    assert (work / "finetuned" / "final.pt").exists() and (work / "exp_serving" / "checkpoint.pt").exists()
    assert (out / "units.txt").read_bytes() == (work / "base" / "units.txt").read_bytes()
    assert load_wenet_model(out).vocab_size == load_wenet_model(work / "base").vocab_size


def test_stage_rounds_chains_the_release_rounds(
    prepared: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--stage rounds`: each chosen round trains on its sets from the round before's export; sets
    already in --work are not rendered again; the last round exports to --out."""
    from recipes import recipe

    data_dir, config = prepared
    raw = yaml.safe_load(config.read_text())
    raw["recipe_conf"].update(tie_by_pronunciation=True, lr_schedule="cosine")
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(yaml.safe_dump(raw))
    work, start, out = tmp_path / "work", tmp_path / "start", tmp_path / "model"
    recipe._train(tuned, [data_dir], tmp_path / "exp_start", start, 0.01, 0, None)
    for name in ("train_v8", "train_v8_rare", "train_v9", "train_v9_rare"):
        (work / name).mkdir(parents=True)
        for file in ("index.tsv", "feats.npy"):
            (work / name / file).symlink_to(data_dir / file)
    capsys.readouterr()
    recipe.main(["--stage", "rounds", "--rounds", "ninth", "eighth", "--work", str(work), "--out", str(out),
                 "--init-from", str(start), "--serving-config", str(tuned), "--minutes-scale", "0.0001"])  # fmt: skip
    printed = capsys.readouterr().out
    eighth, ninth = printed.index("round eighth: 0.009 min"), printed.index("round ninth: 0.01 min")
    assert eighth < printed.index(f"initialised from {start}") < ninth
    assert printed.index(f"initialised from {work / 'release_eighth'}") > ninth
    assert (work / "exp_eighth" / "checkpoint.pt").exists() and (work / "release_eighth" / "final.pt").exists()
    assert (work / "exp_ninth" / "checkpoint.pt").exists() and (out / "final.pt").exists()
    assert sorted(p.name for p in work.iterdir() if p.name.startswith("train")) == [
        "train_v8", "train_v8_rare", "train_v9", "train_v9_rare"]  # fmt: skip
    assert load_wenet_model(out).vocab_size == load_wenet_model(start).vocab_size
    with pytest.raises(ValueError, match=r"unknown round.*tenth.*runs"):
        recipe.train_rounds(work, out, start, ["tenth"], config=tuned)


def test_more_sentences_avoid_held_out_texts_and_keep_to_the_units() -> None:
    """`--stage more`: the extra fine-tuning texts never repeat a test or tuning sentence, and use
    only characters the model to be fine-tuned has (its output rows stay)."""
    from recipes import recipe, textgen

    splits = textgen.make_splits(400, 40, 0)
    units = set(load_units(DEMO_MODEL / "units.txt"))
    sets = recipe.more_sentences(splits, units, count=60, rare_count=30)
    assert set(sets) == set(recipe.MORE_SETS)
    assert sets["train_v6"] == splits.train[: len(sets["train_v6"])]
    rounds = ("train_v7", "train_v8", "train_v9")
    for name in rounds:
        assert len(sets[name]) == 60 and len(sets[f"{name}_rare"]) == 30
    held_out = [*splits.test_sentences, *splits.test_templates, *recipe.tuning_sentences(splits)]
    banned = {textgen.strip_punctuation(s.transcript) for s in held_out}
    train = {s.transcript for s in splits.train}
    for sentence in [s for name in rounds for s in [*sets[name], *sets[f"{name}_rare"]]]:
        text = textgen.strip_punctuation(sentence.transcript)
        assert text not in banned and set(text) <= units
    assert not train & {s.transcript for name in rounds for s in sets[name]}
    # No round repeats a text of an earlier round (template or rare-character sentence).
    texts = {name: {s.transcript for s in [*sets[name], *sets[f"{name}_rare"]]} for name in rounds}
    for index, name in enumerate(rounds[1:], 1):
        assert not texts[name] & set().union(*(texts[earlier] for earlier in rounds[:index])), name
    tuning = recipe.tuning_sentences(splits)
    tests = {s.transcript for s in splits.test_sentences}
    assert len(tuning) == 150 and not {s.transcript for s in tuning} & (train | tests)


def test_stage_more_rejects_an_unknown_set_name_before_rendering(tmp_path: Path) -> None:
    from recipes import recipe

    with pytest.raises(ValueError, match=r"unknown set.*train_v10.*renders"):
        recipe.prepare_more(tmp_path, DEMO_MODEL, 1, ["train_v9", "train_v10"])
    assert list(tmp_path.iterdir()) == []


FREE_HOTLINE = Path(__file__).resolve().parents[1] / "recipes" / "testsets" / "free_hotline.txt"


def test_the_hand_written_test_set_keeps_to_the_demo_models_units() -> None:
    """Characters the demo model cannot output would count as errors of the recording, not of the model."""
    from recipes import textgen

    lines = [line for line in FREE_HOTLINE.read_text(encoding="utf-8").splitlines() if line.strip()]
    units = set(load_units(DEMO_MODEL / "units.txt"))
    assert len(lines) >= 100 and len(set(lines)) == len(lines)
    assert {ch for line in lines for ch in textgen.strip_punctuation(line)} <= units


def test_stage_more_renders_a_sentence_file_alone(tmp_path: Path) -> None:
    """`--stage more --sentences FILE`: held-out WAVs + text under --work/<stem>, nothing else rendered.

    The recipe runs in its own process, as from the command line: its render pool forks, and a
    fork of this process, where torch's thread pools already ran, can deadlock."""
    from recipes import synth

    if not synth.espeak_available():
        pytest.skip("espeak-ng is not installed")
    sentences = tmp_path / "hand.txt"
    sentences.write_text("楼下的路灯坏了，晚上太黑\n\n我想问一下公交车几点有\n", encoding="utf-8")
    work = tmp_path / "work"
    command = [sys.executable, "-m", "recipes.recipe", "--stage", "more", "--out", str(DEMO_MODEL),
               "--work", str(work), "--sentences", str(sentences), "--processes", "1"]  # fmt: skip
    subprocess.run(command, check=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert [p.name for p in work.iterdir()] == ["hand"]
    text = (work / "hand" / "text").read_text(encoding="utf-8").splitlines()
    assert text == ["hand_000000 楼下的路灯坏了晚上太黑", "hand_000001 我想问一下公交车几点有"]
    assert len(list((work / "hand").glob("hand_*.wav"))) == 2


def test_engine_evaluation_with_the_services_default_backend() -> None:
    """`asr-bench accuracy --backend auto` runs what the service runs on a CPU; --chunk-ms keeps one size."""
    report = accuracy.evaluate(DEMO_MODEL, BUNDLE, limit=1, backend="auto", chunk_ms=(160,))
    assert report["backend"] == "torch-int8"
    assert list(report["cer"]) == ["160ms"] and {"greedy", "rescore"} <= set(report["cer"]["160ms"])
