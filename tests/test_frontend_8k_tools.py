"""The tools take the model's own front end too: with the 8 kHz, 40-bin fixture model (random
weights, tests/test_frontend_8k.py), ``asr-bench accuracy``, ``asr-bench engine`` and the ONNX
export's checks read 8 kHz audio as it is and compute 40-bin fbank, and agree with the engine."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest

from asr_core.frontend import num_fbank_frames
from asr_core.model.loader import LoadedModel
from asr_core.tokens import tokens_to_text
from deploy.bench import accuracy
from deploy.bench.accuracy_streaming import ChunkPlan, decode_streaming
from tests.bench_json import run_bench_module
from tests.test_frontend_8k import MEL_BINS, RATE, greedy_reference, loaded, model_dir, telephony_yaml

__all__ = ["loaded", "model_dir"]  # the module-scoped fixtures of test_frontend_8k, used by name

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def testset(tmp_path_factory: pytest.TempPathFactory, loaded: LoadedModel) -> Path:
    """Two 8 kHz WAVs (a chirp with noise) and their ``text``."""
    out = tmp_path_factory.mktemp("testset8k")
    rng = np.random.default_rng(3)
    lines = []
    for i, seconds in enumerate((2.0, 3.0)):
        t = np.arange(int(seconds * RATE)) / RATE
        audio = 8000 * np.sin(2 * np.pi * (200 + 500 * t) * t) + rng.normal(0, 400, t.shape)
        with wave.open(str(out / f"u{i}.wav"), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(RATE)
            wav.writeframes(np.clip(np.round(audio), -32768, 32767).astype("<i2").tobytes())
        lines.append(f"u{i} {''.join(loaded.units[2:6])}\n")
    (out / "text").write_text("".join(lines), encoding="utf-8")
    return out


def test_accuracy_reads_8k_audio_as_is_and_matches_the_engine(
    model_dir: Path, loaded: LoadedModel, testset: Path
) -> None:
    items = accuracy.read_audio(testset, loaded.frontend.sample_rate)
    feats = accuracy.read_testset(testset, loaded.frontend)
    for (_, _, audio), (_, _, fbank) in zip(items, feats, strict=True):
        assert fbank.shape == (num_fbank_frames(len(audio), loaded.frontend), MEL_BINS)
    assert len(items[0][2]) == 2 * RATE  # not resampled to 16 kHz

    result = accuracy.evaluate(model_dir, testset, backend="torch", attention_beam=0, chunk_ms=(320,), left_chunks=4)
    assert set(result["cer"]) == {"320ms"}
    hyps = decode_streaming(loaded, [a for _, _, a in items], ChunkPlan(chunk_ms=320, left_chunks=4), "torch", 4).texts
    expected = [tokens_to_text(greedy_reference(loaded, a, 320, 4), loaded.units) for _, _, a in items]
    assert any(expected), "the random model emits no tokens here: the comparison would prove nothing"
    assert hyps["greedy"] == expected
    offline = accuracy.evaluate(model_dir, testset, beam=0, chunk_ms=(320,))
    assert offline["utterances"] == 2 and "greedy" in offline["cer"]["320ms"]


def test_engine_bench_feeds_audio_at_the_models_rate(model_dir: Path) -> None:
    seconds, chunk_ms, streams = 2.0, 320, 2
    report = run_bench_module(
        "deploy.bench.engine_bench", "--model", str(model_dir), "--streams", str(streams), "--seconds", str(seconds),
        "--chunk-ms", str(chunk_ms), "--fast", "--finalizer", "thread", "--threads", "1", "--no-rescore", timeout=200,
    )  # fmt: skip
    # 2 s of 8 kHz audio per stream: about 6 chunks each; 16 kHz-sized pieces would give twice that.
    per_stream = seconds * 1000 / chunk_ms
    assert streams * (per_stream - 1) <= report["chunks"] <= streams * (per_stream + 2), report["chunks"]


def test_onnx_export_checks_use_the_models_front_end(model_dir: Path, testset: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from deploy.export.onnx_export import check_all, export_all

    export_all(model_dir, tmp_path / "onnx", int8=False)
    report = check_all(model_dir, tmp_path / "onnx", [testset / "u0.wav"], 8, 4, 1, testset)
    audio = report["audio"]
    assert isinstance(audio, dict) and audio["fp32"]["argmax_agreement"] > 0.99, audio
    tested = report["testset"]
    assert isinstance(tested, dict) and tested["utterances"] == 2, tested
    assert abs(tested["cer_change_points"]["fp32"]) < 5, tested


BUNDLE = Path(__file__).resolve().parent / "data" / "hotline_8k"


def test_recipe_features_and_model_dir_follow_the_configs_front_end(tmp_path: Path) -> None:
    """An 8 kHz, 40-bin training config: the recipe computes 40-bin fbank of the 8 kHz audio as
    it is (no upsampling), writes input_dim 40 and 40-dim CMVN, and refuses 80-bin data for it."""
    from asr_core.audio_io import read_pcm16
    from asr_core.frontend import compute_fbank
    from asr_core.model.config import load_model_config
    from recipes import data, export

    raw = telephony_yaml()
    frontend = export.config_frontend(raw)
    assert (frontend.sample_rate, frontend.num_mel_bins) == (RATE, MEL_BINS)
    frames = data.prepare_from_testset(BUNDLE, tmp_path / "d8k", frontend)
    feats = data.FeatureSet(tmp_path / "d8k")
    assert feats.num_mel_bins == MEL_BINS
    first = feats.entries[0]
    pcm, rate = read_pcm16(BUNDLE / f"{first.utt_id}.wav")
    assert rate == RATE and first.frames == num_fbank_frames(len(pcm), frontend)
    np.testing.assert_allclose(feats.feats(0), compute_fbank(pcm, frontend), atol=0.02)  # float16 storage
    assert sum(e.frames for e in feats) == frames

    model = tmp_path / "model"
    export.write_model_dir_skeleton(model, raw, feats)
    assert load_model_config(model / "train.yaml").frontend == frontend
    assert len(json.loads((model / "global_cmvn").read_text(encoding="utf-8"))["mean_stat"]) == MEL_BINS

    data.prepare_from_testset(BUNDLE, tmp_path / "d16k")  # the default front end: 80 bins
    with pytest.raises(ValueError, match=r"80 bins, the config's dataset_conf\.fbank_conf\.num_mel_bins is 40"):
        export.write_model_dir_skeleton(tmp_path / "bad", raw, data.FeatureSet(tmp_path / "d16k"))
