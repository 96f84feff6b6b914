"""Backends that run the batched chunk step: the encoder forward plus the CTC head.

``runner`` holds the contract (``ChunkRunner``, ``ChunkStepInputs``, ``ChunkStep``), ``registry`` the backend
names and ``make_runner``, ``torch_runner`` the torch backend and ``quantize`` its int8/bf16
copies; ONNX Runtime, TensorRT and CUDA graphs have their own modules, imported when chosen.
"""

from asr_core.backends.quantize import Bf16Convs, int8_engine, native_bf16_cpu, quantize_linears, rescoring_decoder
from asr_core.backends.registry import BACKENDS, EXTRA_FOR_MODULE, make_runner
from asr_core.backends.runner import ChunkRunner, ChunkStep, ChunkStepInputs
from asr_core.backends.torch_runner import SPLIT_MIN_STREAMS, TorchChunkRunner

__all__ = [
    "BACKENDS",
    "EXTRA_FOR_MODULE",
    "SPLIT_MIN_STREAMS",
    "Bf16Convs",
    "ChunkRunner",
    "ChunkStep",
    "ChunkStepInputs",
    "TorchChunkRunner",
    "int8_engine",
    "make_runner",
    "native_bf16_cpu",
    "quantize_linears",
    "rescoring_decoder",
]
