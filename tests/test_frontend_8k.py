"""A model's own front end: an 8 kHz telephony model (WeNet config with an 8 kHz, 40-bin fbank,
random weights) gets its fbank from train.yaml, matches kaldi-native-fbank at 8 kHz, and is
served from G.711 audio at 8 kHz, without resampling, by asr-transcribe and the engine alike."""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr
import torch
import yaml

from asr_core.audio_io import read_pcm16
from asr_core.ctc_search import ctc_greedy_batch
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.events import Event, Final, Partial
from asr_core.frontend import FrontendConfig, compute_fbank, num_fbank_frames
from asr_core.model.asr_model import ASRModel
from asr_core.model.cmvn import GlobalCMVN, load_cmvn
from asr_core.model.config import parse_model_config
from asr_core.model.errors import ModelConfigError, ModelLoadError
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.offline import encode_streaming
from asr_core.stream import StreamConfig
from deploy.bench.make_random_model import cmvn_stats, train_yaml, units
from rtp import g711
from tests.knf_reference import knf_options

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
MEL_BINS = 40
RATE = 8000  # Hz
NO_ENDPOINTS = EndpointRules(trailing_silence_ms=10**9, leading_silence_ms=10**9, max_utterance_ms=10**9)


def telephony_yaml() -> dict[str, Any]:
    """The golden fixture's architecture with a WeNet 8 kHz, 40-bin dataset_conf."""
    data = train_yaml("small")
    data["input_dim"] = MEL_BINS
    data["dataset_conf"] = {
        "fbank_conf": {"num_mel_bins": MEL_BINS, "frame_length": 25, "frame_shift": 10, "dither": 1.0},
        "resample_conf": {"resample_rate": RATE},
        "speed_perturb": True,
    }
    return data


def write_model(out: Path, data: dict[str, Any], cmvn_dim: int = MEL_BINS) -> Path:
    """A loadable model directory with random weights (seed 0)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.yaml").write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    vocab = data["output_dim"]
    (out / "units.txt").write_text("".join(f"{u} {i}\n" for i, u in enumerate(units(vocab))), encoding="utf-8")
    (out / "global_cmvn").write_text(json.dumps(cmvn_stats(dim=MEL_BINS)), encoding="utf-8")
    config = parse_model_config(data, out / "train.yaml")
    torch.manual_seed(0)
    model = ASRModel(config, GlobalCMVN(*load_cmvn(out / "global_cmvn")))
    torch.save(model.state_dict(), out / "final.pt")
    if cmvn_dim != MEL_BINS:
        (out / "global_cmvn").write_text(json.dumps(cmvn_stats(dim=cmvn_dim)), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tel8k") / "model", telephony_yaml())


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(model_dir)


@pytest.fixture(scope="module")
def g711_audio() -> np.ndarray:
    """Speech as a telephone line carries it: 8 kHz, through mu-law and back, int16."""
    if FIXTURE.is_dir():
        pcm, rate = read_pcm16(FIXTURE / "wav" / "utt1.wav")
        speech = soxr.resample(pcm.astype(np.float32), rate, RATE) if rate != RATE else pcm.astype(np.float32)
    else:  # a chirp with noise stands in for speech
        rng = np.random.default_rng(0)
        t = np.arange(3 * RATE) / RATE
        speech = 8000 * np.sin(2 * np.pi * (200 + 600 * t) * t) + rng.normal(0, 300, t.shape)
    pcm8k = np.clip(np.round(speech), -32768, 32767).astype(np.int16)
    return g711.decode("PCMU", g711.encode("PCMU", pcm8k))


def test_front_end_comes_from_train_yaml(loaded: LoadedModel) -> None:
    assert loaded.frontend == FrontendConfig(sample_rate=8000, num_mel_bins=40, frame_length_ms=25, frame_shift_ms=10)
    assert loaded.sample_rate == RATE
    assert loaded.frontend.frame_length_samples == 200 and loaded.frontend.frame_shift_samples == 80
    assert loaded.frontend.fft_size == 256


def test_default_front_end_is_wenet_16k_80_bins() -> None:
    config = parse_model_config(train_yaml("small"), Path("train.yaml"))
    assert config.frontend == FrontendConfig()
    assert (config.frontend.sample_rate, config.frontend.num_mel_bins) == (16000, 80)


def test_fbank_at_8k_matches_kaldi_native_fbank(loaded: LoadedModel, g711_audio: np.ndarray) -> None:
    knf = pytest.importorskip("kaldi_native_fbank")
    opts = knf_options()
    opts.frame_opts.samp_freq = RATE
    opts.mel_opts.num_bins = MEL_BINS
    online = knf.OnlineFbank(opts)
    online.accept_waveform(RATE, g711_audio.astype(np.float32).tolist())
    online.input_finished()
    expected = np.stack([online.get_frame(i) for i in range(online.num_frames_ready)]).astype(np.float32)
    ours = compute_fbank(g711_audio, loaded.frontend)
    assert ours.shape == expected.shape == (num_fbank_frames(len(g711_audio), loaded.frontend), MEL_BINS)
    diff = np.abs(ours - expected)
    assert float(diff.mean()) < 1e-4, f"mean |diff| {diff.mean():.2e}"
    assert float(diff.max()) < 2e-2, f"max |diff| {diff.max():.2e}"


def test_mismatched_dimensions_are_refused_naming_the_file(tmp_path: Path) -> None:
    bad = telephony_yaml()
    bad["input_dim"] = 80
    with pytest.raises(ModelConfigError, match=r"num_mel_bins \(40\) must equal input_dim \(80\)"):
        parse_model_config(bad, tmp_path / "train.yaml")
    model = write_model(tmp_path / "m", telephony_yaml(), cmvn_dim=80)
    with pytest.raises(ModelLoadError, match=r"global_cmvn: 80 dims but train.yaml input_dim is 40"):
        load_wenet_model(model)


def greedy_reference(loaded: LoadedModel, samples: np.ndarray, chunk_ms: int, left_chunks: int) -> list[int]:
    fbank = torch.from_numpy(compute_fbank(samples, loaded.frontend))
    encoder_out, _ = encode_streaming(loaded, fbank, chunk_ms // 40, left_chunks)
    log_probs = loaded.model.ctc_log_probs(encoder_out.unsqueeze(0))
    return ctc_greedy_batch(log_probs, torch.tensor([encoder_out.shape[0]]))[0]


def test_engine_serves_g711_at_8k_without_resampling(loaded: LoadedModel, g711_audio: np.ndarray) -> None:
    engine = Engine(loaded, EngineOptions(max_streams=1, endpoint=NO_ENDPOINTS))
    assert engine.sample_rate == RATE
    events: list[Event] = []
    stream = engine.open_stream(StreamConfig(chunk_ms=320, left_chunks=4, stream_id="pstn"), events.append)
    for k in range(0, len(g711_audio), 160):  # 20 ms RTP packets
        stream.accept_waveform(g711_audio[k : k + 160])
        engine.run_once()
    stream.input_finished()
    for _ in range(10_000):
        if stream.done.is_set():
            break
        engine.run_once()
    assert stream.done.is_set()
    # 8 kHz frames: a stream fed upsampled audio would count twice the fbank frames
    assert stream.fbank.num_frames_ready == num_fbank_frames(len(g711_audio), loaded.frontend)
    partials = [e for e in events if isinstance(e, Partial)]
    (final,) = [e for e in events if isinstance(e, Final)]
    assert final.reason == "input_finished"
    expected = greedy_reference(loaded, g711_audio, 320, 4)
    assert expected, "the random model emits no tokens on this audio: the test would prove nothing"
    assert list(partials[-1].tokens) == expected


def test_asr_transcribe_takes_8k_wav_as_is(
    model_dir: Path, loaded: LoadedModel, g711_audio: np.ndarray, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from asr_core.cli_transcribe import main

    wav_path = tmp_path / "call.wav"
    with wave.open(str(wav_path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(g711_audio.astype("<i2").tobytes())
    args = ["--json", "--chunk-ms", "320", "--left-chunks", "4", "--mode", "greedy"]
    code = main([str(wav_path), "--model", str(model_dir), *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "resampled" not in err
    (result,) = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert result["tokens"] == greedy_reference(loaded, g711_audio, 320, 4)


@pytest.mark.parametrize("fast_path", [False, True])
def test_rtp_leg_hands_g711_at_8k_as_is(g711_audio: np.ndarray, fast_path: bool) -> None:
    """resampler "none" (what the gateway picks for an 8 kHz model): the sink gets the decoded
    G.711 samples one for one, neither upsampled nor delayed."""
    import asyncio

    from rtp.leg import RtpLeg
    from rtp.packet import RtpPacket
    from rtp.sink import CountingSink

    pcm = g711_audio[: 160 * (len(g711_audio) // 160)]
    packets = [
        bytes(RtpPacket(payload_type=0, sequence_number=n, timestamp=160 * n, ssrc=7, marker=n == 0,
                        payload=g711.encode("PCMU", pcm[160 * n : 160 * (n + 1)])))
        for n in range(len(pcm) // 160)
    ]  # fmt: skip

    async def scenario() -> CountingSink:
        sink = CountingSink(keep=True)
        leg = RtpLeg(sink=sink, payload_types={0: "PCMU"}, resampler="none", fast_path=fast_path)
        for data in packets:
            leg.handle_rtp(data, ("192.0.2.1", 4000))
        await leg.close()
        return sink

    sink = asyncio.run(scenario())
    np.testing.assert_array_equal(sink.pcm, pcm)
