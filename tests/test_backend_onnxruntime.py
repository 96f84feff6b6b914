"""ONNX Runtime backend: the engine gives the torch backend's tokens; graphs are cached by weights."""

from __future__ import annotations

import sys
from difflib import SequenceMatcher
from pathlib import Path

import numpy as np
import pytest
import torch

from asr_core import cpu_isa
from asr_core.audio_io import read_wav
from asr_core.backends import BACKENDS, ChunkStepInputs, make_runner
from asr_core.backends.onnx_graph import ENCODER_FILE, int8_file, int8_mode_for, model_fingerprint
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.events import Event, Final, Partial
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.stream import StreamConfig

torch.set_num_threads(1)

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")
pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")

from asr_core.backends.onnxruntime import OrtChunkRunner  # noqa: E402

NO_ENDPOINTS = EndpointRules(trailing_silence_ms=10**9, leading_silence_ms=10**9, max_utterance_ms=10**9)
PLANS = [("utt1.wav", 160, 2), ("utt2.wav", 160, 4), ("utt1.wav", 320, 4), ("utt2.wav", 640, 2)]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_wenet_model(FIXTURE / "model")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


def decode(loaded: LoadedModel, backend: str, cache_dir: Path) -> dict[str, tuple[list[int], tuple[int, ...]]]:
    """Each plan's (last partial tokens, final tokens) from one engine with ``backend``."""
    runner = make_runner(backend, loaded, cache_dir=cache_dir)
    engine = Engine(loaded, EngineOptions(max_streams=len(PLANS), max_batch=4, endpoint=NO_ENDPOINTS), runner)
    events: dict[str, list[Event]] = {}
    streams = []
    for i, (wav, chunk_ms, left_chunks) in enumerate(PLANS):
        config = StreamConfig(chunk_ms=chunk_ms, left_chunks=left_chunks, stream_id=f"s{i}")
        stream = engine.open_stream(config, lambda e: events.setdefault(e.stream_id, []).append(e))
        samples = read_wav(FIXTURE / "wav" / wav).samples
        for start in range(0, len(samples), 3200):
            stream.accept_waveform(samples[start : start + 3200])
        stream.input_finished()
        streams.append(stream)
    for _ in range(10_000):
        if all(s.done.is_set() for s in streams):
            break
        engine.run_once()
    result = {}
    for sid, stream_events in events.items():
        partial = [e for e in stream_events if isinstance(e, Partial)][-1]
        (final,) = [e for e in stream_events if isinstance(e, Final)]
        result[sid] = (list(partial.tokens), final.tokens)
    assert len(result) == len(PLANS)
    return result


def test_engine_on_onnxruntime_gives_the_torch_tokens(loaded: LoadedModel, cache_dir: Path) -> None:
    want = decode(loaded, "torch", cache_dir)
    assert decode(loaded, "onnxruntime", cache_dir) == want
    assert any(len(partial) > 5 for partial, _ in want.values())


# The INT8 mode the cached export picks on this machine, named in the test's id.
AUTO_INT8_MODE = int8_mode_for(cpu_isa.detect())


@pytest.mark.parametrize("int8_mode", [AUTO_INT8_MODE])
def test_engine_on_onnxruntime_int8_runs_and_mostly_agrees(
    loaded: LoadedModel, cache_dir: Path, int8_mode: str
) -> None:
    want = decode(loaded, "torch", cache_dir)
    got = decode(loaded, "onnxruntime-int8", cache_dir)
    assert (cache_dir / model_fingerprint(loaded) / int8_file(int8_mode)).is_file()
    for sid, (partial, _) in want.items():
        matched = SequenceMatcher(a=partial, b=got[sid][0], autojunk=False).ratio()
        # INT8 weights move a random model's outputs visibly; most greedy tokens survive.
        assert matched >= 0.7, (sid, matched, int8_mode)


def test_graph_is_exported_once_per_weights(loaded: LoadedModel, tmp_path: Path) -> None:
    make_runner("onnxruntime-int8", loaded, cache_dir=tmp_path)
    (folder,) = tmp_path.iterdir()
    assert folder.name == model_fingerprint(loaded)
    assert sorted(p.name for p in folder.iterdir()) == sorted([ENCODER_FILE, int8_file(AUTO_INT8_MODE)])
    stamp = (folder / ENCODER_FILE).stat().st_mtime_ns
    make_runner("onnxruntime", loaded, cache_dir=tmp_path)
    assert (folder / ENCODER_FILE).stat().st_mtime_ns == stamp
    original = model_fingerprint(loaded)
    with torch.no_grad():
        loaded.model.ctc.ctc_lo.bias[0] += 1.0
    try:
        assert model_fingerprint(loaded) != original
    finally:
        with torch.no_grad():
            loaded.model.ctc.ctc_lo.bias[0] -= 1.0


def test_configured_path_and_cache_env(
    loaded: LoadedModel, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = cache_dir / model_fingerprint(loaded) / ENCODER_FILE
    if not graph.is_file():
        make_runner("onnxruntime", loaded, cache_dir=cache_dir)
    runner = make_runner("onnxruntime", loaded, onnx_path=graph)
    assert isinstance(runner, OrtChunkRunner) and runner.path == graph
    monkeypatch.setenv("ASR_ONNX_CACHE", str(tmp_path))
    make_runner("onnxruntime", loaded)
    assert (tmp_path / model_fingerprint(loaded) / ENCODER_FILE).is_file()
    with pytest.raises(FileNotFoundError, match="no such ONNX model"):
        make_runner("onnxruntime", loaded, onnx_path=tmp_path / "missing.onnx")


def test_unknown_backend_and_missing_package_errors(loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"choose one of: torch, .*onnxruntime-int8, .*tensorrt-int8"):
        make_runner("tflite", loaded)
    assert {"onnxruntime", "onnxruntime-int8", "tensorrt-fp16", "tensorrt-int8", "torch-cudagraph"} <= set(BACKENDS)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.delitem(sys.modules, "asr_core.backends.onnxruntime", raising=False)
    with pytest.raises(RuntimeError, match=r"pip install 'hotline-asr\[onnx\]'"):
        make_runner("onnxruntime", loaded)


def test_log_probs_dtype_and_device_follow_the_inputs(loaded: LoadedModel, cache_dir: Path) -> None:
    runner = make_runner("onnxruntime", loaded, cache_dir=cache_dir)
    from asr_core.backends.onnx_graph import chunk_example

    step = runner.step(ChunkStepInputs(*chunk_example(loaded, batch=2, chunk=4, window=8, seed=3)))
    assert step.ys.dtype == torch.float32 and step.log_probs.shape[-1] == loaded.vocab_size
    assert np.allclose(step.log_probs.exp().sum(-1).numpy(), 1.0, atol=1e-4)


def test_a_step_given_rows_of_a_pool_gathers_them_first(loaded: LoadedModel, cache_dir: Path) -> None:
    """ONNX Runtime takes the batch's caches as graph inputs (``reads_pool`` False: the engine
    gathers them); given a pool and rows anyway, it gathers them itself, with the same outputs."""
    runner = make_runner("onnxruntime", loaded, cache_dir=cache_dir)
    assert not runner.reads_pool
    from asr_core.backends.onnx_graph import chunk_example

    xs, offsets, att, pos, mask, cnn = chunk_example(loaded, batch=2, chunk=4, window=8, seed=4)
    rows = torch.tensor([3, 0])
    att_pool = torch.randn((att.size(0), 5, *att.shape[2:]))
    cnn_pool = torch.randn((cnn.size(0), 5, *cnn.shape[2:]))
    att_pool[:, rows], cnn_pool[:, rows] = att, cnn
    pooled = runner.step(ChunkStepInputs(xs, offsets, att_pool, pos, mask, cnn_pool, rows))
    gathered = runner.step(ChunkStepInputs(xs, offsets, att, pos, mask, cnn))
    for name in ("ys", "log_probs", "new_kv", "new_cnn"):
        assert torch.equal(getattr(pooled, name), getattr(gathered, name)), name
