"""`asr-export sherpa-onnx`: sherpa-onnx loads our export and decodes like our single-stream path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from asr_core.audio_io import read_wav
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.offline import encode_streaming
from deploy.export import sherpa
from tests.knf_reference import knf_fbank, knf_options

torch.set_num_threads(1)

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")
WAVS = [FIXTURE / "wav" / "utt1.wav", FIXTURE / "wav" / "utt2.wav"]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_wenet_model(FIXTURE / "model")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sherpa")
    assert (
        sherpa.main(
            ["--model", str(FIXTURE / "model"), "--out", str(out), "--chunk-size", "4", "--left-chunks", "2", "--int8"]
        )
        == 0
    )
    return out


def sherpa_fbank(samples: np.ndarray) -> np.ndarray:
    """sherpa-onnx's front end: our fbank options with snip_edges off and high_freq -400."""
    opts = knf_options()
    opts.frame_opts.snip_edges = False
    opts.mel_opts.high_freq = -400.0
    return knf_fbank(samples, opts)


def our_greedy(loaded: LoadedModel, samples: np.ndarray, chunk: int, left_chunks: int) -> list[str]:
    """Our single-stream streaming path + CTC greedy over the full chunks sherpa-onnx decodes."""
    feats = sherpa_fbank(samples)
    length = (chunk - 1) * loaded.subsampling + loaded.right_context + 1
    shift = chunk * loaded.subsampling
    chunks = (len(feats) - length) // shift + 1
    encoder_out, _ = encode_streaming(
        loaded, torch.from_numpy(feats[: (chunks - 1) * shift + length]), chunk, left_chunks
    )
    best = loaded.model.ctc_log_probs(encoder_out).argmax(-1).tolist()
    tokens = [t for i, t in enumerate(best) if t != loaded.blank_id and (i == 0 or t != best[i - 1])]
    return [loaded.units[t] for t in tokens]


def test_metadata_and_tokens(exported: Path, loaded: LoadedModel) -> None:
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(exported / sherpa.MODEL_FILE)).metadata_props}
    assert meta["model_type"] == "wenet_ctc"
    assert int(meta["num_blocks"]) == loaded.num_blocks and int(meta["head"]) == loaded.heads
    assert int(meta["output_size"]) == loaded.d_model
    assert int(meta["cnn_module_kernel"]) == loaded.cnn_cache_frames + 1
    assert int(meta["vocab_size"]) == loaded.vocab_size and int(meta["chunk_size"]) == 4
    lines = (exported / sherpa.TOKENS_FILE).read_text(encoding="utf-8").splitlines()
    assert lines[0] == f"{loaded.units[0]} 0" and len(lines) == loaded.vocab_size


@pytest.mark.parametrize(
    ("chunk", "left_chunks", "model_file"),
    [
        (4, 2, sherpa.MODEL_FILE),
        (8, 3, sherpa.MODEL_FILE),
        (4, 2, sherpa.MODEL_INT8_FILE),
    ],
)
def test_sherpa_onnx_decodes_like_our_single_stream_path(
    exported: Path, loaded: LoadedModel, chunk: int, left_chunks: int, model_file: str
) -> None:
    sherpa_onnx = pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    recognizer = sherpa_onnx.OnlineRecognizer.from_wenet_ctc(
        tokens=str(exported / sherpa.TOKENS_FILE),
        model=str(exported / model_file),
        chunk_size=chunk,
        num_left_chunks=left_chunks,
        num_threads=1,
    )
    for wav in WAVS:
        samples = read_wav(wav).samples
        stream = recognizer.create_stream()
        stream.accept_waveform(16000, samples.astype(np.float32) / 32768)
        stream.input_finished()
        while recognizer.is_ready(stream):
            recognizer.decode_stream(stream)
        got = list(recognizer.get_result_all(stream).tokens)
        want = our_greedy(loaded, samples, chunk, left_chunks)
        if model_file == sherpa.MODEL_INT8_FILE:
            assert got, "the INT8 model decoded nothing"
        else:
            assert got == want and len(want) > 10, wav.name


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        sherpa.export_for_sherpa(FIXTURE / "model", tmp_path, chunk_size=0)
