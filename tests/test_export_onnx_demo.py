"""ONNX export of the bundled demo model (the fixture model's twin test is test_export_onnx.py):
ONNX Runtime's chunk step equals torch on random batches and on real telephone audio."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr_core.backends.onnxruntime import OrtChunkRunner, OrtDecoderRunner
from asr_core.model.loader import load_wenet_model
from deploy.export import onnx_export
from tests.demo_quality import DEMO_MODEL, SEED_WAV

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "final.pt").is_file(), reason="no bundled demo model")

# As for the fixture model. Measured on the demo model: encoder output 6e-6, log-probs 1.6e-5
# (real audio), decoder log-probs 8e-6: float32 ONNX Runtime and torch differ only in summation order.
ENCODER_TOLERANCE = 1e-4
LOG_PROB_TOLERANCE = 1e-3


def test_demo_model_onnx_equals_torch(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    onnx_export.export_all(DEMO_MODEL, tmp_path, int8=False)
    loaded = load_wenet_model(DEMO_MODEL)
    runner = OrtChunkRunner(tmp_path / onnx_export.ENCODER_FILE)

    random_errors = onnx_export.check_random(loaded, runner)
    assert random_errors["ys"] <= ENCODER_TOLERANCE, random_errors
    assert random_errors["log_probs"] <= LOG_PROB_TOLERANCE, random_errors

    wavs = sorted(SEED_WAV.parent.glob("*.wav"))
    assert len(wavs) >= 2
    audio = onnx_export.check_audio(loaded, {"fp32": runner}, wavs, chunk=8, left_chunks=4)["fp32"]
    assert audio["ys"] <= ENCODER_TOLERANCE, audio
    assert audio["log_probs"] <= LOG_PROB_TOLERANCE, audio
    assert audio["argmax_agreement"] == 1.0

    decoder = onnx_export.check_decoder(loaded, OrtDecoderRunner(tmp_path / onnx_export.DECODER_FILE))
    assert max(decoder.values()) <= LOG_PROB_TOLERANCE, decoder
