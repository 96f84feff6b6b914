"""INT8 against float32 on the fixture's real audio, per backend, with the INT8 mode in the
test's id: ONNX Runtime's mode is chosen per CPU at export (`onnx_graph.int8_mode_for`);
torch's dynamic int8 Linears quantize activations to 7 bits (``reduce_range=True`` in
``torch.ao.nn.quantized.dynamic.Linear``) on every x86 CPU, so its u8 x s8 pair sums cannot
saturate on AVX2 either and it needs no per-ISA choice for accuracy (its engine, oneDNN with
AMX and fbgemm elsewhere, is chosen for speed: `backends.int8_engine`; both quantize to 7 bits).
Holds on every x86-64 ISA; under ``ONEDNN_MAX_CPU_ISA=AVX2`` the ONNX case exercises the AVX2
mode and torch's the fbgemm engine."""

from pathlib import Path

import pytest
import torch

from asr_core import cpu_isa
from asr_core.backends import int8_engine, make_runner
from asr_core.model.loader import LoadedModel, load_wenet_model

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
if not (FIXTURE / "expected.npz").exists():
    pytest.skip(f"WeNet fixture not found at {FIXTURE}", allow_module_level=True)
pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")

from asr_core.backends.onnx_graph import int8_mode_for  # noqa: E402
from deploy.export import onnx_export  # noqa: E402

torch.set_num_threads(1)
WAVS = [FIXTURE / "wav" / "utt1.wav", FIXTURE / "wav" / "utt2.wav"]
TORCH_INT8_MODE = f"{int8_engine()}-u7s8"
"""torch's quantized engine for this CPU, with 7-bit activations times int8 weights."""


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_wenet_model(FIXTURE / "model")


@pytest.mark.filterwarnings("ignore:torch.ao.quantization is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@pytest.mark.parametrize(
    ("backend", "mode"),
    [("torch-int8", TORCH_INT8_MODE), ("onnxruntime-int8", int8_mode_for(cpu_isa.detect()))],
)
def test_int8_greedy_tokens_agree_with_float(loaded: LoadedModel, tmp_path: Path, backend: str, mode: str) -> None:
    runner = make_runner(backend, loaded, cache_dir=tmp_path)
    if backend.startswith("onnxruntime"):
        assert runner.int8_mode == mode  # type: ignore[attr-defined]
    audio = onnx_export.check_audio(loaded, {"int8": runner}, WAVS, 8, 2)  # type: ignore[dict-item]
    assert audio["int8"]["argmax_agreement"] >= 0.9, (backend, mode, cpu_isa.detect().level)
