"""Load a WeNet released-model directory: ``train.yaml``, ``final.pt``, ``units.txt``,
``global_cmvn``."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from asr_core.frontend import FrontendConfig
from asr_core.model.asr_model import ASRModel
from asr_core.model.cmvn import GlobalCMVN, load_cmvn
from asr_core.model.config import ModelConfig, load_model_config
from asr_core.model.errors import ModelLoadError
from kv_ring import CacheGeometry

SINUSOID_BUFFERS = (
    "encoder.embed.pos_enc.pe",
    "decoder.left_decoder.embed.1.pe",
    "decoder.right_decoder.embed.1.pe",
    "decoder.embed.1.pe",
)
"""Fixed sinusoid tables that newer WeNet checkpoints contain; recomputed here, so ignored."""

CMVN_FILE = "global_cmvn"
CMVN_BUFFERS = ("encoder.global_cmvn.mean", "encoder.global_cmvn.istd")
"""Optional in final.pt: when absent, the statistics read from ``global_cmvn`` are used."""


@dataclass
class LoadedModel:
    """A ready model (eval mode) and the facts callers need without digging into modules."""

    model: ASRModel
    units: list[str]
    config: ModelConfig
    vocab_size: int
    blank_id: int
    sos_id: int
    eos_id: int
    num_blocks: int
    heads: int
    d_k: int
    d_model: int
    cnn_cache_frames: int
    subsampling: int
    right_context: int
    frontend: FrontendConfig  # the model's sample rate and fbank options (train.yaml's dataset_conf)

    @property
    def sample_rate(self) -> int:
        """Hz of the audio the model takes (its fbank's rate): 16000, or 8000 for telephony."""
        return self.frontend.sample_rate

    def cache_geometry(self, window: int, dtype: torch.dtype = torch.float32) -> CacheGeometry:
        """A cache slot of this model's encoder that keeps ``window`` encoder frames."""
        return CacheGeometry(self.num_blocks, self.heads, self.d_k, window, self.d_model, self.cnn_cache_frames, dtype)


def load_units(path: Path) -> list[str]:
    """``units.txt`` (``<sym> <id>`` per line) -> symbols indexed by id."""
    table: dict[int, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise ModelLoadError(f"{path}:{lineno}: expected '<symbol> <id>', got {line!r}")
        table[int(parts[1])] = parts[0]
    ids = sorted(table)
    if ids != list(range(len(ids))):
        missing = sorted(set(range(max(ids, default=-1) + 1)) - set(ids))
        raise ModelLoadError(f"{path}: ids must be 0..N-1 without gaps; missing {missing[:10]}")
    return [table[i] for i in ids]


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        raise ModelLoadError(
            f"{path}: not a loadable torch state dict (only plain tensors are accepted): {exc}"
        ) from None
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    if not isinstance(state, dict):
        raise ModelLoadError(f"{path}: expected a state dict (mapping of name -> tensor)")
    return state


def _apply_state_dict(model: ASRModel, state: dict[str, torch.Tensor], path: Path) -> None:
    """Strict load, tolerating only absent/extra sinusoid buffers and absent CMVN buffers;
    every problem is listed."""
    state = {k: v for k, v in state.items() if k not in SINUSOID_BUFFERS}
    expected = model.state_dict()
    for key in CMVN_BUFFERS:
        if key in expected and key not in state:
            state[key] = expected[key]  # statistics from global_cmvn, as WeNet
    problems: list[str] = []
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        problems.append("missing keys: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected))
    for key, value in state.items():
        if key in expected and tuple(value.shape) != tuple(expected[key].shape):
            problems.append(
                f"shape mismatch for {key}: checkpoint {tuple(value.shape)}, "
                f"train.yaml implies {tuple(expected[key].shape)}"
            )
    if problems:
        raise ModelLoadError(
            f"{path} does not match train.yaml (is it the checkpoint of this config?):\n  " + "\n  ".join(problems)
        )
    model.load_state_dict(state, strict=True)


MODEL_FILES = ("train.yaml", "final.pt", "units.txt")
"""The files every WeNet released-model directory holds (``global_cmvn`` too when train.yaml names CMVN)."""


def load_wenet_model(model_dir: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Build the model from ``model_dir`` and load its weights; returns it in eval mode.

    CMVN comes from ``<model_dir>/global_cmvn`` (the path in train.yaml is where it was on the
    training machine) and is overridden by ``encoder.global_cmvn.*`` in final.pt when present,
    as WeNet does.
    """
    model_dir = Path(model_dir)
    missing = [name for name in MODEL_FILES if not (model_dir / name).is_file()]
    config = load_model_config(model_dir / "train.yaml") if "train.yaml" not in missing else None
    if config is not None and config.cmvn is not None and not (model_dir / CMVN_FILE).is_file():
        missing.append(CMVN_FILE)
    if missing:
        raise ModelLoadError(
            f"model dir {model_dir}: missing {', '.join(missing)} "
            "(a WeNet model dir holds train.yaml, final.pt, units.txt and global_cmvn)"
        )
    assert config is not None
    cmvn = None
    if config.cmvn is not None:
        mean, istd = load_cmvn(model_dir / CMVN_FILE, config.cmvn.is_json_cmvn)
        if mean.numel() != config.input_dim:
            raise ModelLoadError(
                f"{model_dir / CMVN_FILE}: {mean.numel()} dims but train.yaml input_dim is {config.input_dim} "
                f"(and dataset_conf.fbank_conf.num_mel_bins {config.frontend.num_mel_bins}): "
                "the CMVN statistics are not this model's"
            )
        cmvn = GlobalCMVN(mean, istd)
    units = load_units(model_dir / "units.txt")
    if len(units) != config.output_dim:
        raise ModelLoadError(
            f"{model_dir / 'units.txt'}: {len(units)} units but train.yaml output_dim is {config.output_dim}"
        )
    model = ASRModel(config, cmvn)
    state = _load_state_dict(model_dir / "final.pt")
    if cmvn is None:
        state = {k: v for k, v in state.items() if not k.startswith("encoder.global_cmvn.")}
    _apply_state_dict(model, state, model_dir / "final.pt")
    model.to(device).eval()
    enc = model.encoder
    return LoadedModel(
        model=model,
        units=units,
        config=config,
        vocab_size=model.vocab_size,
        blank_id=model.blank_id,
        sos_id=model.sos,
        eos_id=model.eos,
        num_blocks=enc.num_blocks,
        heads=enc.heads,
        d_k=enc.d_k,
        d_model=enc.output_size,
        cnn_cache_frames=enc.cnn_cache_frames,
        subsampling=enc.subsampling_rate,
        right_context=enc.right_context,
        frontend=config.frontend,
    )
