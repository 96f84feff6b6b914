"""GPU backends: torch-cudagraph and TensorRT. Their numerics run only where a CUDA device is;
here (CPU) the errors a user meets are checked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from asr_core.backends import ChunkStepInputs, make_runner
from asr_core.backends.onnx_graph import chunk_example
from asr_core.model.loader import LoadedModel, load_wenet_model

torch.set_num_threads(1)

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")
HAS_CUDA = torch.cuda.is_available()
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine")


@pytest.fixture()
def loaded() -> LoadedModel:
    return load_wenet_model(FIXTURE / "model")


def test_cudagraph_refuses_a_cpu_model(loaded: LoadedModel) -> None:
    with pytest.raises(ValueError, match="needs a CUDA device"):
        make_runner("torch-cudagraph", loaded)


@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is installed here")
def test_tensorrt_without_the_package_names_the_extra(loaded: LoadedModel) -> None:
    with pytest.raises(RuntimeError, match=r"pip install 'hotline-asr\[gpu\]'"):
        make_runner("tensorrt-fp16", loaded)


def _cuda_example(loaded: LoadedModel, batch: int) -> ChunkStepInputs:
    example = chunk_example(loaded, batch=batch, chunk=4, window=16, seed=batch)
    return ChunkStepInputs(*(t.cuda().half() if t.is_floating_point() else t.cuda() for t in example))


@pytest.mark.gpu
@needs_cuda
def test_cudagraph_replay_equals_eager(loaded: LoadedModel) -> None:
    model = loaded.model.cuda().half()
    runner = make_runner("torch-cudagraph", loaded)
    for batch in (3, 5, 3, 16):  # 3 and 5 share nothing; 3 twice replays the captured graph
        example = _cuda_example(loaded, batch)
        with torch.inference_mode():
            ys, new_kv, new_cnn = model.encoder.forward_chunk_batch(*example.graph_inputs())
        got = runner.step(example)
        assert got.ys.shape == ys.shape
        torch.testing.assert_close(got.ys.float(), ys.float(), atol=2e-2, rtol=0)
        torch.testing.assert_close(got.new_kv.float(), new_kv.float(), atol=2e-2, rtol=0)
        torch.testing.assert_close(got.new_cnn.float(), new_cnn.float(), atol=2e-2, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(not HAS_TENSORRT, reason="tensorrt is not installed (extra: hotline-asr[gpu])")
def test_tensorrt_fp16_close_to_torch(loaded: LoadedModel, tmp_path: Path) -> None:
    runner = make_runner("tensorrt-fp16", loaded, cache_dir=tmp_path)
    example = _cuda_example(loaded, 5)
    model = loaded.model.cuda().float()
    with torch.inference_mode():
        ys, _, _ = model.encoder.forward_chunk_batch(
            *(t.float() if t.is_floating_point() else t for t in example.graph_inputs())
        )
    got = runner.step(example)
    torch.testing.assert_close(got.ys.float(), ys, atol=5e-2, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(not HAS_TENSORRT, reason="tensorrt is not installed (extra: hotline-asr[gpu])")
def test_tensorrt_int8_calibrates_from_wavs(loaded: LoadedModel, tmp_path: Path) -> None:
    runner = make_runner("tensorrt-int8", loaded, cache_dir=tmp_path, calibration_dir=FIXTURE / "wav")
    got = runner.step(_cuda_example(loaded, 2))
    assert torch.isfinite(got.log_probs).all()
