"""Our own U2++ training loop: CTC + left-to-right and right-to-left attention losses.

    python -m recipes.train --config recipes/conf/demo.yaml \\
        --data exp/demo/train --exp exp/demo/exp --out asr_core/demo_model --minutes-budget 60

The config is a WeNet ``train.yaml`` (``encoder_conf``, ``decoder_conf``, ``model_conf`` with
``ctc_weight``/``reverse_weight``, ``optim_conf``, ``scheduler_conf``, ``dataset_conf``) plus a
``recipe_conf`` block for this loop. ``output_dim`` comes from the data: units are the
characters of the training transcripts. The network is ``asr_core.model`` (use_dynamic_chunk:
the encoder draws a random chunk size per batch, so one model serves 160-640 ms chunks and
full context). Batches are sorted by length; the first epoch runs them shortest first
(curriculum), later epochs in random order. SpecAugment masks time and frequency bands.

Every ``checkpoint_minutes`` the loop saves ``<exp>/checkpoint.pt`` (model, optimizer,
position in the epoch) and measures the loss on a held-back dev split; the best model by dev
loss is ``<exp>/best.pt``; with ``average_best`` > 1 the weights of that many lowest-dev-loss
checkpoints are kept too (``<exp>/snapshots``) and their average is exported when it scores a
lower dev loss than the best one. Starting again with the same ``--exp`` resumes; ``--init-from DIR``
starts a new run from an exported model's weights (and keeps that model's units and CMVN). At
the end (step or time budget, SIGTERM, Ctrl-C) the loop saves a checkpoint and exports the best
model as a WeNet model directory (see :mod:`recipes.export`).

``recipe_conf`` options beyond WeNet: ``tie_by_pronunciation`` and ``syllable_ctc_weight``
(:mod:`recipes.tying`: output rows shared by pinyin syllable, an auxiliary syllable
CTC), ``lr_schedule: cosine`` (decay over this run's budget; a resumed run counts its budget
from the resume). ``--data`` takes several prepared directories, read as one set.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field

from asr_core.backends import native_bf16_cpu
from recipes import export, tying
from recipes.data import FeatureSet

IGNORE_ID = -1


class SpecAugConfig(BaseModel):
    """WeNet's ``spec_aug_conf``: masks of up to ``max_t`` frames / ``max_f`` bins, set to 0 (raw fbank)."""

    model_config = ConfigDict(extra="ignore")
    num_t_mask: int = 2
    num_f_mask: int = 2
    max_t: int = 40
    max_f: int = 10


class RecipeConfig(BaseModel):
    """Knobs of this loop that WeNet's train.yaml has no place for."""

    model_config = ConfigDict(extra="forbid")
    max_frames_in_batch: int = Field(8000, gt=0, description="padded fbank frames per batch")
    checkpoint_minutes: float = Field(5.0, gt=0)
    dev_utterances: int = Field(100, ge=0, description="held back from training to pick the best checkpoint")
    max_epochs: int = Field(100, gt=0)
    log_every: int = Field(20, gt=0, description="steps between log lines")
    tie_by_pronunciation: bool = Field(
        False, description="share output/embedding rows between characters of one syllable (recipes.tying)"
    )
    lr_schedule: Literal["warmup", "cosine"] = Field(
        "warmup",
        description="warmup: WeNet's WarmupLR; cosine: warm-up, then a cosine decay over the run's time "
        "(--minutes-budget) or step budget (--max-steps) down to final_lr_fraction of the peak",
    )
    final_lr_fraction: float = Field(0.05, ge=0, le=1)
    syllable_ctc_weight: float = Field(
        0.0, ge=0, description="with tie_by_pronunciation: weight of the auxiliary tonal-syllable CTC loss "
        "(recipes.tying.SyllableCTC), added to the WeNet loss",
    )  # fmt: skip
    serving_chunk_probability: float = Field(
        0.0, ge=0, le=1, description="share of training batches masked with a chunk size from serving_chunk_frames "
        "(the rest: WeNet's dynamic chunk, half of it full context)",
    )  # fmt: skip
    serving_chunk_frames: list[int] = Field([4, 8, 16], min_length=1, description="encoder frames (40 ms each)")
    serving_left_chunks: int = Field(-1, description="left chunks visible in those batches; -1 all")
    average_best: int = Field(
        1, ge=1, description="keep the weights of this many checkpoints with the lowest dev loss and export their "
        "average when its dev loss is lower than the best single one's (WeNet's average_model.py --val_best)",
    )  # fmt: skip


class TrainConfig(BaseModel):
    """The training-only parts of the config file."""

    model_config = ConfigDict(extra="ignore")
    lr: float = 0.002
    warmup_steps: int = 500
    grad_clip: float = 5.0
    spec_aug: SpecAugConfig = SpecAugConfig()
    recipe: RecipeConfig = RecipeConfig()

    @classmethod
    def from_yaml(cls, raw: dict[str, Any]) -> TrainConfig:
        dataset = raw.get("dataset_conf") or {}
        return cls(
            lr=(raw.get("optim_conf") or {}).get("lr", 0.002),
            warmup_steps=(raw.get("scheduler_conf") or {}).get("warmup_steps", 500),
            grad_clip=raw.get("grad_clip", 5.0),
            spec_aug=SpecAugConfig(**(dataset.get("spec_aug_conf") or {})),
            recipe=RecipeConfig(**(raw.get("recipe_conf") or {})),
        )


def warmup_lr(step: int, base_lr: float, warmup_steps: int) -> float:
    """WeNet's WarmupLR: linear rise to ``base_lr`` at ``warmup_steps``, then ~ step^-0.5."""
    step = max(step, 1)
    return base_lr * warmup_steps**0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def cosine_lr(step: int, progress: float, base_lr: float, warmup_steps: int, final_fraction: float) -> float:
    """Linear warm-up to ``base_lr``, then a cosine from ``base_lr`` down to ``final_fraction`` of it as
    ``progress`` (the share of the run's budget used, 0..1) goes to 1."""
    rise = min(1.0, max(step, 1) / max(warmup_steps, 1))
    cosine = 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return base_lr * rise * (final_fraction + (1 - final_fraction) * cosine)


def spec_augment(feats: np.ndarray, conf: SpecAugConfig, rng: np.random.Generator) -> np.ndarray:
    """Zero ``num_t_mask`` time bands and ``num_f_mask`` frequency bands of (T, F) fbank (a copy)."""
    out = feats.copy()
    frames, bins = out.shape
    for _ in range(conf.num_t_mask):
        width = int(rng.integers(1, conf.max_t + 1))
        if frames > width:
            start = int(rng.integers(0, frames - width))
            out[start : start + width] = 0
    for _ in range(conf.num_f_mask):
        width = int(rng.integers(1, conf.max_f + 1))
        start = int(rng.integers(0, bins - width))
        out[:, start : start + width] = 0
    return out


def make_batches(lengths: list[int], max_frames: int) -> list[list[int]]:
    """Indices grouped by length so that (batch size x longest) <= max_frames; shortest batches first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > max_frames:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


@dataclass
class Batch:
    feats: torch.Tensor  # (B, T, 80) float32, zero padded
    feat_lens: torch.Tensor  # (B,) int64
    tokens: torch.Tensor  # (B, L) int64, IGNORE_ID padded
    token_lens: torch.Tensor  # (B,) int64


def collate(
    feats: list[np.ndarray], token_ids: list[list[int]], spec_aug: SpecAugConfig | None, rng: np.random.Generator
) -> Batch:
    if spec_aug is not None:
        feats = [spec_augment(f, spec_aug, rng) for f in feats]
    longest = max(len(f) for f in feats)
    padded = np.zeros((len(feats), longest, feats[0].shape[1]), dtype=np.float32)
    for i, f in enumerate(feats):
        padded[i, : len(f)] = f
    max_tokens = max(len(t) for t in token_ids)
    tokens = torch.full((len(token_ids), max_tokens), IGNORE_ID, dtype=torch.long)
    for i, t in enumerate(token_ids):
        tokens[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    return Batch(
        torch.from_numpy(padded),
        torch.tensor([len(f) for f in feats], dtype=torch.long),
        tokens,
        torch.tensor([len(t) for t in token_ids], dtype=torch.long),
    )


class Trainer:
    """State of one training run in ``exp_dir``; ``run()`` trains until the step or time budget ends."""

    def __init__(
        self, config_path: Path, data_dir: Path | list[Path], exp_dir: Path, seed: int = 0, device: str = "cpu",
        bf16: bool = True, init_from: Path | None = None,
    ) -> None:  # fmt: skip
        self.exp_dir = exp_dir
        self.device = torch.device(device)
        self.bf16 = bf16
        self.raw = yaml.safe_load(config_path.read_text(encoding="utf-8"))
        self.conf = TrainConfig.from_yaml(self.raw)
        self.data = FeatureSet(data_dir)
        self.seed = seed
        exp_dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = exp_dir / "model"
        resuming = (exp_dir / "checkpoint.pt").exists()
        if not (self.model_dir / "units.txt").exists():
            export.write_model_dir_skeleton(self.model_dir, self.raw, self.data, None if resuming else init_from)
        self.units = export.read_units(self.model_dir / "units.txt")
        self.model = export.build_model(self.model_dir).to(self.device)
        if init_from is not None and not resuming:
            self.init_from(init_from)
        self.syllable_ctc: tying.SyllableCTC | None = None
        if self.conf.recipe.tie_by_pronunciation:
            tying.tie_by_pronunciation(self.model, sorted(self.units, key=self.units.__getitem__))
            if self.conf.recipe.syllable_ctc_weight > 0:
                self.syllable_ctc = tying.SyllableCTC(self.model.ctc.ctc_lo, self.units["<blank>"])
                self.model.encoder.register_forward_hook(self._keep_encoder_output)
        self._encoder_output: tuple[torch.Tensor, torch.Tensor] | None = None
        self._chunk_rng = random.Random(seed)
        if self.conf.recipe.serving_chunk_probability > 0:
            self.model.encoder.register_forward_pre_hook(self._serving_chunk, with_kwargs=True)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.conf.lr)
        num_dev = min(self.conf.recipe.dev_utterances, len(self.data) // 10)
        shuffled = random.Random(seed).sample(range(len(self.data)), len(self.data))
        self.dev_ids = sorted(shuffled[:num_dev])
        self.train_ids = sorted(shuffled[num_dev:])
        lengths = [self.data.entries[i].frames for i in self.train_ids]
        self.batches = make_batches(lengths, self.conf.recipe.max_frames_in_batch)
        self.step = 0
        self.epoch = 0
        self.position = 0
        self.best_dev_loss = math.inf
        self.history: list[dict[str, float]] = []
        self.stop_requested = False
        if resuming:
            self._load_checkpoint(exp_dir / "checkpoint.pt")

    def init_from(self, model_dir: Path) -> None:
        """Start from an exported model's weights (same units and network), e.g. to train the demo model further."""
        if read_units_list(model_dir / "units.txt") != read_units_list(self.model_dir / "units.txt"):
            raise SystemExit(f"{model_dir}/units.txt differs from this run's units: prepare data with the same seed")
        state = torch.load(model_dir / "final.pt", map_location=self.device, weights_only=True)
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or any(not k.endswith(".pe") for k in missing):
            raise SystemExit(f"{model_dir}/final.pt does not match the config: missing {missing}, extra {unexpected}")
        print(f"initialised from {model_dir}", flush=True)

    def token_ids(self, text: str) -> list[int]:
        unk = self.units["<unk>"]
        return [self.units.get(ch, unk) for ch in text]

    def _epoch_order(self) -> list[int]:
        if self.epoch == 0:
            return list(range(len(self.batches)))
        return random.Random(self.seed * 1000 + self.epoch).sample(range(len(self.batches)), len(self.batches))

    def _batch(self, ids: list[int], augment: bool, rng: np.random.Generator) -> Batch:
        feats = [self.data.feats(i) for i in ids]
        tokens = [self.token_ids(self.data.entries[i].transcript) for i in ids]
        return collate(feats, tokens, self.conf.spec_aug if augment else None, rng)

    def _serving_chunk(self, module: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
        """In training, mask some batches with a serving chunk size (and window) instead of a random one."""
        recipe = self.conf.recipe
        if not module.training or kwargs.get("decoding_chunk_size", 0) != 0:
            return None
        if self._chunk_rng.random() >= recipe.serving_chunk_probability:
            return None
        chunk = self._chunk_rng.choice(recipe.serving_chunk_frames)
        return args, {**kwargs, "decoding_chunk_size": chunk, "num_decoding_left_chunks": recipe.serving_left_chunks}

    def _keep_encoder_output(self, _module: Any, _inputs: Any, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._encoder_output = output

    def _forward(self, batch: Batch) -> dict[str, torch.Tensor | None]:
        """The model's loss dict; bfloat16 autocast when enabled (about 1.8x faster on CPUs with AVX512-BF16).
        With the syllable CTC, ``loss`` includes it (weighted) and ``loss_syllable`` reports it."""
        tokens, token_lens = batch.tokens.to(self.device), batch.token_lens.to(self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out: dict[str, torch.Tensor | None] = self.model(
                batch.feats.to(self.device), batch.feat_lens.to(self.device), tokens, token_lens
            )
        if self.syllable_ctc is not None and self._encoder_output is not None:
            encoder_out, encoder_mask = self._encoder_output
            self._encoder_output = None
            syllable = self.syllable_ctc(encoder_out, encoder_mask.squeeze(1).sum(1), tokens, token_lens)
            loss = out["loss"]
            assert loss is not None
            out["loss"] = loss + self.conf.recipe.syllable_ctc_weight * syllable
            out["loss_syllable"] = syllable
        return out

    def learning_rate(self, progress: float) -> float:
        """The rate of the next step; ``progress`` is the share of this run's budget used (cosine only)."""
        if self.conf.recipe.lr_schedule == "cosine":
            fraction = self.conf.recipe.final_lr_fraction
            return cosine_lr(self.step + 1, progress, self.conf.lr, self.conf.warmup_steps, fraction)
        return warmup_lr(self.step + 1, self.conf.lr, self.conf.warmup_steps)

    def train_step(self, batch: Batch, progress: float = 0.0) -> dict[str, float]:
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(progress)
        out = self._forward(batch)
        loss = out["loss"]
        assert loss is not None
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.conf.grad_clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.step += 1
        return {k: float(v.detach()) for k, v in out.items() if v is not None}

    @torch.no_grad()
    def dev_loss(self) -> float:
        """Mean loss per utterance on the dev split (full context, no augmentation)."""
        if not self.dev_ids:
            return math.nan
        self.model.eval()
        total = 0.0
        rng = np.random.default_rng(0)
        lengths = [self.data.entries[i].frames for i in self.dev_ids]
        for ids in make_batches(lengths, self.conf.recipe.max_frames_in_batch):
            batch = self._batch([self.dev_ids[i] for i in ids], False, rng)
            loss = self._forward(batch)["loss"]
            assert loss is not None
            total += float(loss) * len(ids)
        return total / len(self.dev_ids)

    def save_checkpoint(self) -> float:
        """Write checkpoint.pt (and best.pt when the dev loss improved); returns the dev loss."""
        dev = self.dev_loss()
        if (not math.isnan(dev) and dev < self.best_dev_loss) or not (self.exp_dir / "best.pt").exists():
            self.best_dev_loss = dev if not math.isnan(dev) else self.best_dev_loss
            torch.save(tying.plain_state_dict(self.model), self.exp_dir / "best.pt.tmp")
            (self.exp_dir / "best.pt.tmp").replace(self.exp_dir / "best.pt")
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "position": self.position,
            "best_dev_loss": self.best_dev_loss,
            "history": self.history,
        }
        torch.save(state, self.exp_dir / "checkpoint.pt.tmp")
        (self.exp_dir / "checkpoint.pt.tmp").replace(self.exp_dir / "checkpoint.pt")
        self._keep_snapshot(dev)
        print(
            f"checkpoint step {self.step} epoch {self.epoch} dev_loss {dev:.3f} best {self.best_dev_loss:.3f}",
            flush=True,
        )
        return dev

    def _snapshot_index(self) -> dict[str, float]:
        """File name -> dev loss of the kept snapshots (``<exp>/snapshots``)."""
        path = self.exp_dir / "snapshots" / "index.json"
        index: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
        return index

    def _keep_snapshot(self, dev: float) -> None:
        """Keep this checkpoint's weights if they are among the ``average_best`` lowest dev losses."""
        keep = self.conf.recipe.average_best
        if keep <= 1 or math.isnan(dev):
            return
        folder = self.exp_dir / "snapshots"
        folder.mkdir(exist_ok=True)
        index = self._snapshot_index()
        name = f"step{self.step}.pt"
        index[name] = dev
        ranked = sorted(index, key=index.__getitem__)
        if name in ranked[:keep]:
            torch.save(self.model.state_dict(), folder / f"{name}.tmp")
            (folder / f"{name}.tmp").replace(folder / name)
        for stale in ranked[keep:]:
            (folder / stale).unlink(missing_ok=True)
            del index[stale]
        (folder / "index.json.tmp").write_text(json.dumps(index, indent=1))
        (folder / "index.json.tmp").replace(folder / "index.json")

    def export_state(self) -> Path:
        """The weights to export: ``best.pt``, or ``average.pt`` (the mean of the kept snapshots)
        when that average has the lower dev loss. The model's own weights are left as they were."""
        index = self._snapshot_index()
        if self.conf.recipe.average_best <= 1 or len(index) < 2:
            return self.exp_dir / "best.pt"
        states = [
            torch.load(self.exp_dir / "snapshots" / name, map_location=self.device, weights_only=True) for name in index
        ]
        average = {
            key: torch.stack([s[key].float() for s in states]).mean(0).to(value.dtype)
            if value.is_floating_point() else value
            for key, value in states[0].items()
        }  # fmt: skip
        current = {key: value.clone() for key, value in self.model.state_dict().items()}
        self.model.load_state_dict(average)
        dev = self.dev_loss()
        print(f"average of the {len(states)} best checkpoints: dev_loss {dev:.3f}, best single "
              f"{self.best_dev_loss:.3f}", flush=True)  # fmt: skip
        better = not math.isnan(dev) and dev < self.best_dev_loss
        if better:
            torch.save(tying.plain_state_dict(self.model), self.exp_dir / "average.pt")
        self.model.load_state_dict(current)
        return self.exp_dir / ("average.pt" if better else "best.pt")

    def _load_checkpoint(self, path: Path) -> None:
        state = torch.load(path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
        self.best_dev_loss = state["best_dev_loss"]
        self.history = state["history"]
        print(f"resumed from {path} at step {self.step}, epoch {self.epoch}", flush=True)

    def run(self, max_steps: int | None = None, minutes_budget: float | None = None) -> None:
        started = time.monotonic()
        last_checkpoint = started
        recipe = self.conf.recipe
        first_step = self.step

        def progress() -> float:
            shares = []
            if minutes_budget is not None:
                shares.append((time.monotonic() - started) / (60 * minutes_budget))
            if max_steps is not None:
                shares.append((self.step - first_step) / max(max_steps - first_step, 1))
            return max(shares, default=0.0)

        rng = np.random.default_rng(self.seed + self.step)
        window: list[float] = []
        while self.epoch < recipe.max_epochs:
            order = self._epoch_order()
            while self.position < len(order):
                if max_steps is not None and self.step >= max_steps:
                    self.save_checkpoint()
                    return
                if self.stop_requested or (
                    minutes_budget is not None and time.monotonic() - started > 60 * minutes_budget
                ):
                    self.save_checkpoint()
                    return
                ids = [self.train_ids[i] for i in self.batches[order[self.position]]]
                losses = self.train_step(self._batch(ids, True, rng), progress())
                self.position += 1
                window.append(losses["loss"])
                self.history.append({"step": self.step, **losses})
                if self.step % recipe.log_every == 0:
                    print(
                        f"step {self.step} epoch {self.epoch} loss {np.mean(window):.3f} ctc {losses['loss_ctc']:.3f} "
                        f"att {losses.get('loss_att', math.nan):.3f} syl {losses.get('loss_syllable', math.nan):.3f} "
                        f"lr {self.optimizer.param_groups[0]['lr']:.2e} {time.monotonic() - started:.0f}s",
                        flush=True,
                    )
                    window = []
                if time.monotonic() - last_checkpoint > 60 * recipe.checkpoint_minutes:
                    self.save_checkpoint()
                    last_checkpoint = time.monotonic()
            self.epoch += 1
            self.position = 0
        self.save_checkpoint()


def read_units_list(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="WeNet-style train.yaml with recipe_conf")
    parser.add_argument(
        "--data", type=Path, nargs="+", required=True, help="prepared data dirs (index.tsv + feats.npy), one set"
    )
    parser.add_argument("--exp", type=Path, required=True, help="checkpoints and logs; resumes if present")
    parser.add_argument("--out", type=Path, help="export the best model here as a WeNet model dir")
    parser.add_argument("--minutes-budget", type=float, help="stop training after this many minutes")
    parser.add_argument("--max-steps", type=int, help="stop after this many optimizer steps in total")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--init-from", type=Path, help="model dir whose final.pt starts a new run (not a resume)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None,
        help="bfloat16 autocast; default: on CUDA and on CPUs with native bf16 (AVX512-BF16/AMX), where it is "
        "faster; elsewhere float32 (emulated bf16 took twice as long per step on an AVX512-VNNI Xeon)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    bf16 = args.bf16 if args.bf16 is not None else torch.device(args.device).type == "cuda" or native_bf16_cpu()
    trainer = Trainer(args.config, args.data, args.exp, args.seed, args.device, bf16, args.init_from)

    def request_stop(signum: int, _frame: object) -> None:
        print(f"signal {signum}: saving a checkpoint and stopping", flush=True)
        trainer.stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    params = sum(p.numel() for p in trainer.model.parameters())
    print(
        f"{len(trainer.train_ids)} train / {len(trainer.dev_ids)} dev utterances, {len(trainer.batches)} batches, "
        f"{len(trainer.units)} units, {params / 1e6:.2f}M parameters",
        flush=True,
    )
    trainer.run(args.max_steps, args.minutes_budget)
    if args.out is not None:
        if args.out.exists():
            shutil.rmtree(args.out)
        export.export_model_dir(trainer.model_dir, trainer.export_state(), args.out)
        print(f"exported {args.out}", flush=True)


if __name__ == "__main__":
    main()
