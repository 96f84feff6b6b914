"""WeNet model directories: the skeleton a training run starts from, and the exported result.

A model directory holds ``train.yaml`` (newer WeNet layout: ``cmvn: global_cmvn`` +
``cmvn_conf``, ``tokenizer_conf``), ``units.txt`` (``<blank> 0``, ``<unk> 1``, characters,
``<sos/eos>`` last), ``global_cmvn`` (WeNet JSON statistics of the training fbank) and, once
exported, ``final.pt`` (a state dict). The exported directory loads with
``asr_core.model.loader.load_wenet_model`` and with WeNet's own tools.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from asr_core.frontend import FrontendConfig
from asr_core.model.asr_model import ASRModel
from asr_core.model.cmvn import GlobalCMVN, load_cmvn
from asr_core.model.config import DatasetConf, load_model_config
from recipes.data import FeatureSet

MAX_MODEL_BYTES = 20 * 1024 * 1024
SPECIAL_UNITS = ("<blank>", "<unk>")
SOS_EOS = "<sos/eos>"


def config_frontend(raw: dict[str, Any]) -> FrontendConfig:
    """The front end a training config's ``dataset_conf`` defines (WeNet's 16 kHz, 80 bins when absent)."""
    return DatasetConf.model_validate(raw.get("dataset_conf") or {}).frontend


def build_units(transcripts: list[str]) -> list[str]:
    """``<blank>``, ``<unk>``, the characters of ``transcripts`` (sorted), ``<sos/eos>``."""
    chars = sorted({ch for text in transcripts for ch in text})
    return [*SPECIAL_UNITS, *chars, SOS_EOS]


def read_units(path: Path) -> dict[str, int]:
    units = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        symbol, index = line.rsplit(" ", 1)
        units[symbol] = int(index)
    return units


def cmvn_stats(data: FeatureSet, max_frames: int = 2_000_000) -> dict[str, Any]:
    """WeNet JSON CMVN statistics (sums and sums of squares per bin) over up to ``max_frames`` frames."""
    mean_stat = np.zeros(data.num_mel_bins, dtype=np.float64)
    var_stat = np.zeros(data.num_mel_bins, dtype=np.float64)
    frames = 0
    for i in range(len(data)):
        feats = data.feats(i).astype(np.float64)  # (T, mel bins)
        mean_stat += feats.sum(axis=0)
        var_stat += (feats**2).sum(axis=0)
        frames += len(feats)
        if frames >= max_frames:
            break
    return {"mean_stat": mean_stat.tolist(), "var_stat": var_stat.tolist(), "frame_num": frames}


def model_yaml(raw: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The training config completed for a model dir: sizes (``input_dim``: the mel bins of its
    ``dataset_conf``), CMVN file and char tokenizer."""
    conf = copy.deepcopy(raw)
    conf.update(
        input_dim=config_frontend(raw).num_mel_bins,
        output_dim=vocab_size,
        vocab_size=vocab_size,
        cmvn="global_cmvn",
        cmvn_conf={"cmvn_file": "global_cmvn", "is_json_cmvn": True},
        tokenizer="char",
        tokenizer_conf={
            "symbol_table_path": "units.txt",
            "split_with_space": False,
            "bpe_path": None,
            "non_lang_syms_path": None,
            "is_multilingual": False,
            "num_languages": 1,
            "special_tokens": {"<blank>": 0, "<unk>": 1, "<sos>": vocab_size - 1, "<eos>": vocab_size - 1},
        },
    )
    conf.setdefault("model", "asr_model")
    conf.setdefault("ctc", "ctc")
    conf.setdefault("ctc_conf", {"ctc_blank_id": 0})
    return conf


def write_model_dir_skeleton(
    model_dir: Path, raw: dict[str, Any], data: FeatureSet, init_from: Path | None = None
) -> None:
    """train.yaml, units.txt and global_cmvn for a new training run on ``data``.

    With ``init_from`` (a model dir whose weights start the run), its units and CMVN are kept, so
    the weights mean the same thing; characters of ``data`` outside those units train as ``<unk>``.
    """
    bins = config_frontend(raw).num_mel_bins
    if len(data) and data.num_mel_bins != bins:
        raise ValueError(
            f"the data's fbank has {data.num_mel_bins} bins, the config's dataset_conf.fbank_conf.num_mel_bins is "
            f"{bins}: prepare the data with the config's front end"
        )
    model_dir.mkdir(parents=True, exist_ok=True)
    if init_from is not None:
        for name in ("units.txt", "global_cmvn"):
            shutil.copyfile(init_from / name, model_dir / name)
        table = read_units(model_dir / "units.txt")
        units = sorted(table, key=table.__getitem__)
        unknown = {ch for e in data for ch in e.transcript} - set(units)
        if unknown:
            print(f"{len(unknown)} characters of the data are not units of {init_from}: trained as <unk>", flush=True)
    else:
        units = build_units([e.transcript for e in data])
        (model_dir / "units.txt").write_text("".join(f"{u} {i}\n" for i, u in enumerate(units)), encoding="utf-8")
        (model_dir / "global_cmvn").write_text(json.dumps(cmvn_stats(data)))
    text = yaml.safe_dump(model_yaml(raw, len(units)), allow_unicode=True, sort_keys=True)
    (model_dir / "train.yaml").write_text(text, encoding="utf-8")


def build_model(model_dir: Path) -> ASRModel:
    """A freshly initialised network for ``model_dir``'s train.yaml and global_cmvn."""
    config = load_model_config(model_dir / "train.yaml")
    return ASRModel(config, GlobalCMVN(*load_cmvn(model_dir / "global_cmvn", is_json=True)))


def export_model_dir(model_dir: Path, state_path: Path, out: Path) -> None:
    """Copy the skeleton and write ``final.pt``; float16 weights if float32 would exceed 20 MB."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("train.yaml", "units.txt", "global_cmvn"):
        shutil.copyfile(model_dir / name, out / name)
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    state = {k: v for k, v in state.items() if not k.endswith(".pe")}
    if sum(v.numel() * v.element_size() for v in state.values()) > MAX_MODEL_BYTES:
        state = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    torch.save(state, out / "final.pt")
