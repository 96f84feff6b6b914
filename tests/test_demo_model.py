"""The bundled demo model: it loads with the WeNet loader and (issue 7) should transcribe the
held-out telephone recording of the seed sentence exactly."""

from __future__ import annotations

import numpy as np
import pytest

from asr_common.scoring import cer
from asr_core.audio_io import read_wav
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.events import Final
from asr_core.model.loader import load_wenet_model
from asr_core.stream import StreamConfig
from tests.demo_quality import (
    DEMO_MODEL,
    GOOD_ENOUGH_CER,
    SEED_TEXT,
    SEED_WAV,
    seed_transcript,
    service_seed_transcript,
)  # fmt: skip

BUNDLE = SEED_WAV.parent

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "final.pt").is_file(), reason="no bundled demo model")


def test_demo_model_loads_like_any_wenet_model() -> None:
    loaded = load_wenet_model(DEMO_MODEL)
    assert loaded.vocab_size == len(loaded.units) > 2000
    assert sum(f.stat().st_size for f in DEMO_MODEL.iterdir()) <= 20 * 2**20


def test_demo_model_transcribes_the_seed_sentence() -> None:
    """Issue 7: the held-out telephone recording of the seed sentence, exactly, as the
    service's finals see it (320 ms chunks, default finals search)."""
    text = seed_transcript()
    assert text == SEED_TEXT, f"CER {cer(text, SEED_TEXT):.0%}, got {text!r}"


def test_the_service_transcribes_the_seed_recording() -> None:
    """The serving engine with the service's defaults, endpointing included (tests/demo_quality.py),
    within the CER the end-to-end transcript checks allow."""
    text = service_seed_transcript()
    assert cer(text, SEED_TEXT) <= GOOD_ENOUGH_CER, f"CER {cer(text, SEED_TEXT):.0%}, got {text!r}"


def test_asr_transcribe_prints_the_seed_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 7's command: ``asr-transcribe`` on the 8 kHz telephone WAV with the bundled model
    (its default) and its default decoding, in 320 ms streaming chunks."""
    from asr_core.cli_transcribe import main

    assert main([str(SEED_WAV), "--chunk-ms", "320"]) == 0
    assert capsys.readouterr().out.strip().split("\t")[-1] == SEED_TEXT


def test_streaming_engine_evaluation_equals_chunk_masked_decoding() -> None:
    """``asr-bench accuracy --backend torch`` decodes through the serving engine; with a cache window
    longer than every utterance it must give the texts of the chunk-masked whole-utterance
    decoding (which equals chunk-by-chunk streaming with an unlimited cache)."""
    from deploy.bench import accuracy as evaluate
    from deploy.bench.accuracy_streaming import ChunkPlan, decode_streaming

    loaded = load_wenet_model(DEMO_MODEL)
    items = evaluate.read_audio(BUNDLE)
    audio = [np.clip(np.rint(a), -32768, 32767) for _, _, a in items]  # the engine takes int16 PCM
    assert max(len(a) for a in audio) / 16000 < 64 * 0.16  # every utterance fits the window below
    masked = evaluate.decode(loaded, [evaluate.compute_fbank(a) for a in audio], chunk=4, beam=10)
    streamed = decode_streaming(loaded, audio, ChunkPlan(chunk_ms=160, left_chunks=64), "torch", 64).texts
    assert streamed["greedy"] == masked["greedy"]
    assert streamed["rescore"] == masked["rescore"]


@pytest.mark.parametrize("energy_gate_db", [0.0, 10.0])
def test_the_energy_gate_keeps_loud_audio_from_counting_as_silence(energy_gate_db: float) -> None:
    """A sentence, then 2 s of loud noise the model hears nothing in (CTC blanks): by WeNet's rule
    alone (gate 0) the utterance ends in the noise; with the service's gate the noise is not
    silence, and the utterance lasts until the input ends. The sentence is read either way."""
    loaded = load_wenet_model(DEMO_MODEL)
    rules = EndpointRules(energy_gate_db=energy_gate_db)
    engine = Engine(loaded, EngineOptions(max_streams=1, attention_beam=4, endpoint=rules, trim_interval_s=0))
    finals: list[Final] = []
    stream = engine.open_stream(
        StreamConfig(chunk_ms=320, left_chunks=4, stream_id="s"),
        lambda event: finals.append(event) if isinstance(event, Final) else None,
    )
    noise = np.random.default_rng(0).normal(0.0, 3000.0, 32000)  # -21 dBFS
    audio = np.concatenate([read_wav(BUNDLE / "hotline_1.wav").samples, noise])
    stream.accept_waveform(np.clip(np.rint(audio), -32768, 32767).astype(np.int16))
    stream.input_finished()
    while not stream.done.is_set():
        engine.run_once()
    reference = dict(line.split(maxsplit=1) for line in (BUNDLE / "text").read_text(encoding="utf-8").splitlines())
    assert [f.text for f in finals] == [reference["hotline_1"]]
    assert finals[0].reason == ("silence" if energy_gate_db == 0.0 else "input_finished")
