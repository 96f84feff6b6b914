"""Validated model configuration read from a WeNet ``train.yaml``.

Two layouts exist in the wild and both load:

* newer (2024+): ``cmvn: global_cmvn`` + ``cmvn_conf: {cmvn_file, is_json_cmvn}`` and a
  ``tokenizer_conf`` block;
* older released models (2021-2023): ``cmvn_file`` and ``is_json_cmvn`` at the top level and no
  ``tokenizer_conf``.

Only what defines the network (and its losses) and its front end is modelled: from
``dataset_conf`` the fbank options (``fbank_conf``) and the sample rate
(``resample_conf``); training-only keys (the rest of ``dataset_conf``, ``optim``,
``scheduler``, ...) are ignored. Inside ``encoder_conf`` and
``decoder_conf`` an unknown key is an error: silently ignoring an option that changes the
network would produce wrong outputs with no warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from asr_core.frontend import FrontendConfig
from asr_core.model.errors import ModelConfigError

Activation = Literal["swish", "relu", "gelu", "tanh"]


TRANSFORMER_ENCODER_DEFAULTS = {
    "pos_enc_layer_type": "abs_pos",
    "selfattention_layer_type": "selfattn",
    "activation_type": "relu",
}
"""WeNet's TransformerEncoder defaults that differ from its ConformerEncoder's."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EncoderConfig(_Strict):
    """``encoder_conf`` of a conformer or transformer encoder (WeNet's conformer defaults;
    a transformer's differing defaults are filled in by ``ModelConfig``)."""

    output_size: int = Field(256, gt=0)
    attention_heads: int = Field(4, gt=0)
    linear_units: int = Field(2048, gt=0)
    num_blocks: int = Field(6, gt=0)
    dropout_rate: float = 0.1
    positional_dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    input_layer: Literal["conv2d", "conv2d6", "conv2d8"] = "conv2d"
    pos_enc_layer_type: Literal["rel_pos", "abs_pos"] = "rel_pos"
    selfattention_layer_type: Literal["rel_selfattn", "selfattn"] = "rel_selfattn"
    normalize_before: bool = True
    static_chunk_size: int = Field(0, ge=0)
    use_dynamic_chunk: bool = False
    use_dynamic_left_chunk: bool = False
    activation_type: Activation = "swish"
    macaron_style: bool = True
    use_cnn_module: bool = True
    cnn_module_kernel: int = Field(15, gt=0)
    causal: bool = False
    cnn_module_norm: Literal["layer_norm", "batch_norm"] = "batch_norm"
    query_bias: bool = True
    key_bias: bool = True
    value_bias: bool = True
    conv_bias: bool = True
    norm_eps: float = 1e-5
    conv_norm_eps: float = 1e-5
    concat_after: Literal[False] = False
    layer_norm_type: Literal["layer_norm"] = "layer_norm"
    final_norm: Literal[True] = True
    gradient_checkpointing: bool = False
    use_sdpa: bool = False

    @property
    def streaming(self) -> bool:
        return self.use_dynamic_chunk or self.static_chunk_size > 0


class DecoderConfig(_Strict):
    """``decoder_conf`` of a transformer or bitransformer decoder (WeNet defaults)."""

    attention_heads: int = Field(4, gt=0)
    linear_units: int = Field(2048, gt=0)
    num_blocks: int = Field(6, gt=0)
    r_num_blocks: int = Field(0, ge=0)
    dropout_rate: float = 0.1
    positional_dropout_rate: float = 0.1
    self_attention_dropout_rate: float = 0.0
    src_attention_dropout_rate: float = 0.0
    input_layer: Literal["embed"] = "embed"
    use_output_layer: Literal[True] = True
    normalize_before: bool = True
    src_attention: Literal[True] = True
    concat_after: Literal[False] = False
    activation_type: Activation = "relu"
    query_bias: bool = True
    key_bias: bool = True
    value_bias: bool = True
    tie_word_embedding: Literal[False] = False
    gradient_checkpointing: bool = False
    use_sdpa: bool = False


class ModelConf(BaseModel):
    """``model_conf``: loss weights (training) and the default reverse weight."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ctc_weight: float = Field(0.5, ge=0.0, le=1.0)
    reverse_weight: float = Field(0.0, ge=0.0, le=1.0)
    lsm_weight: float = Field(0.0, ge=0.0, lt=1.0)
    length_normalized_loss: bool = False
    ignore_id: int = -1


class CmvnConfig(BaseModel):
    """Where the global CMVN statistics live (a path relative to the model directory)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    cmvn_file: str | None = None
    is_json_cmvn: bool = True


class TokenizerConfig(BaseModel):
    """The parts of ``tokenizer_conf`` that matter for decoding."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    symbol_table_path: str | None = None
    special_tokens: dict[str, int] | None = None


class CtcConfig(BaseModel):
    """``ctc_conf``: which id is the CTC blank."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ctc_blank_id: int = Field(0, ge=0)


class FbankConf(BaseModel):
    """``dataset_conf.fbank_conf``: the model's fbank (WeNet's defaults when absent)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    num_mel_bins: int = Field(80, gt=0)
    frame_length: float = Field(25.0, gt=0.0)  # ms
    frame_shift: float = Field(10.0, gt=0.0)  # ms
    dither: float = Field(0.0, ge=0.0)  # training only: inference never dithers


class ResampleConf(BaseModel):
    """``dataset_conf.resample_conf``: the rate every training utterance was brought to."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    resample_rate: int = Field(16000, gt=0)  # Hz


class DatasetConf(BaseModel):
    """The parts of ``dataset_conf`` that define the features the model was trained on."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    fbank_conf: FbankConf = FbankConf()
    resample_conf: ResampleConf = ResampleConf()

    @property
    def frontend(self) -> FrontendConfig:
        """The front end these options define: sample rate and fbank, always without dither."""
        fbank = self.fbank_conf
        return FrontendConfig(
            sample_rate=self.resample_conf.resample_rate,
            num_mel_bins=fbank.num_mel_bins,
            frame_length_ms=fbank.frame_length,
            frame_shift_ms=fbank.frame_shift,
        )

    @model_validator(mode="before")
    @classmethod
    def _none_is_default(cls, data: Any) -> Any:
        """``fbank_conf:`` or ``resample_conf:`` left empty in YAML means WeNet's defaults."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if not (k in ("fbank_conf", "resample_conf") and v is None)}
        return data


class ModelConfig(BaseModel):
    """A whole ``train.yaml`` (network part)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: Literal["asr_model"] = "asr_model"
    encoder: Literal["conformer", "transformer"]
    encoder_conf: EncoderConfig = EncoderConfig()
    decoder: Literal["bitransformer", "transformer"]
    decoder_conf: DecoderConfig = DecoderConfig()
    ctc: Literal["ctc"] = "ctc"
    ctc_conf: CtcConfig = CtcConfig()
    model_conf: ModelConf = ModelConf()
    input_dim: int = Field(gt=0)
    output_dim: int = Field(gt=1)
    cmvn: CmvnConfig | None = None
    tokenizer_conf: TokenizerConfig | None = None
    dataset_conf: DatasetConf = DatasetConf()

    @property
    def frontend(self) -> FrontendConfig:
        """The model's front end: its sample rate and fbank options, always without dither."""
        return self.dataset_conf.frontend

    @model_validator(mode="before")
    @classmethod
    def _normalise_layouts(cls, data: Any) -> Any:
        """Map both train.yaml layouts onto one: ``cmvn`` becomes a CmvnConfig (or None)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("encoder") == "transformer" and isinstance(data.get("encoder_conf", {}), dict):
            conf = dict(data.get("encoder_conf") or {})
            for key, default in TRANSFORMER_ENCODER_DEFAULTS.items():
                conf.setdefault(key, default)
            data["encoder_conf"] = conf
        if data.get("dataset_conf") is None:
            data.pop("dataset_conf", None)
        if "output_dim" not in data and "vocab_size" in data:
            data["output_dim"] = data["vocab_size"]
        if "cmvn_conf" in data or isinstance(data.get("cmvn"), str):
            enabled = data.get("cmvn", "global_cmvn") is not None
            conf = data.get("cmvn_conf") or {}
            data["cmvn"] = dict(conf) if enabled and conf.get("cmvn_file") else None
        elif "cmvn_file" in data:
            data["cmvn"] = (
                {"cmvn_file": data["cmvn_file"], "is_json_cmvn": data.get("is_json_cmvn", True)}
                if data["cmvn_file"]
                else None
            )
        else:
            data["cmvn"] = None
        return data

    @model_validator(mode="after")
    def _check_combination(self) -> ModelConfig:
        enc = self.encoder_conf
        if enc.output_size % enc.attention_heads:
            raise ValueError(
                f"encoder_conf.output_size ({enc.output_size}) must be a multiple of "
                f"encoder_conf.attention_heads ({enc.attention_heads})"
            )
        if self.encoder == "conformer" and enc.use_cnn_module and enc.streaming and not enc.causal:
            raise ValueError(
                "encoder_conf.causal: false is not supported for a streaming model "
                "(use_dynamic_chunk or static_chunk_size > 0 with use_cnn_module); allowed: true"
            )
        if self.decoder == "bitransformer" and self.decoder_conf.r_num_blocks <= 0:
            raise ValueError("decoder_conf.r_num_blocks must be > 0 for decoder: bitransformer")
        try:
            frontend = self.frontend
        except ValueError as exc:
            raise ValueError(f"dataset_conf: unusable front end: {exc}") from None
        if frontend.num_mel_bins != self.input_dim:
            raise ValueError(
                f"dataset_conf.fbank_conf.num_mel_bins ({frontend.num_mel_bins}) must equal input_dim "
                f"({self.input_dim}): the encoder takes one input per mel bin"
            )
        if enc.output_size % self.decoder_conf.attention_heads:
            raise ValueError(
                f"encoder_conf.output_size ({enc.output_size}) must be a multiple of "
                f"decoder_conf.attention_heads ({self.decoder_conf.attention_heads})"
            )
        return self


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at ``loc`` (the deepest one that exists)."""
    line = None if node is None else node.start_mark.line + 1
    for key in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        match = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key]
        if not match:
            break
        node = match[0]
        line = node.start_mark.line + 1
    return line


def _describe(error: dict[str, Any], path: Path, root: yaml.Node | None) -> str:
    loc = tuple(error["loc"])
    name = ".".join(str(p) for p in loc) or "(top level)"
    line = _line_of(root, loc) if loc else None
    where = f"{path}:{line}" if line else str(path)
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{where}: unsupported option {name} (not known to this implementation; remove it)"
    if kind == "literal_error":
        allowed = error.get("ctx", {}).get("expected", "")
        return f"{where}: unsupported value {error['input']!r} for {name}; allowed: {allowed}"
    if kind == "missing":
        return f"{where}: missing required option {name}"
    if kind == "value_error":
        return f"{where}: {error['msg'].removeprefix('Value error, ')}"
    return f"{where}: {name}: {error['msg']} (got {error.get('input')!r})"


def parse_model_config(data: dict[str, Any], path: Path, root: yaml.Node | None = None) -> ModelConfig:
    """Validate an already-parsed train.yaml mapping; errors name ``path`` (and lines via ``root``)."""
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(dict(e), path, root) for e in exc.errors()]
        raise ModelConfigError("invalid model config:\n  " + "\n  ".join(lines)) from None


def load_model_config(path: str | Path) -> ModelConfig:
    """Read and validate ``train.yaml``."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ModelConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: expected a mapping at the top level")
    return parse_model_config(data, path, root)
