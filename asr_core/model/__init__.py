"""WeNet U2++ compatible model: config, modules, loader and the batched streaming encoder."""

from asr_core.model.asr_model import ASRModel
from asr_core.model.config import ModelConfig, load_model_config
from asr_core.model.encoder import U2Encoder
from asr_core.model.errors import ModelConfigError, ModelLoadError
from asr_core.model.loader import LoadedModel, load_wenet_model

__all__ = [
    "ASRModel",
    "LoadedModel",
    "ModelConfig",
    "ModelConfigError",
    "ModelLoadError",
    "U2Encoder",
    "load_model_config",
    "load_wenet_model",
]
