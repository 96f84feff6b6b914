"""How well the bundled demo model reads the seed recording, and the CER the tests allow.

The end-to-end tests (``test_gateway_e2e``, ``test_gateway_demo``, ``test_gateway_faults``)
check transcripts, KB suggestions and tags with the bundled model unconditionally, within
``GOOD_ENOUGH_CER``; ``tests/test_demo_model.py`` checks the model's own decoding of the seed
sentence (``seed_transcript``) and the serving engine's (``service_seed_transcript``: the
service's defaults, endpointing included, and the end-to-end tests' route profile, 320 ms
chunks and 4 left chunks).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from asr_core.audio_io import read_wav
from asr_core.ctc_search import ctc_topk
from asr_core.engine import Engine
from asr_core.events import Final
from asr_core.finals import FinalRequest, FinalSearch, FinalSettings
from asr_core.frontend import compute_fbank
from asr_core.model.loader import load_wenet_model
from asr_core.offline import encode_streaming
from asr_core.stream import StreamConfig
from asr_core.tokens import tokens_to_text
from asr_gateway.config import EngineSettings, load_config
from asr_gateway.service import engine_options

REPO = Path(__file__).resolve().parents[1]
DEMO_MODEL = REPO / "asr_core" / "demo_model"
SEED_WAV = REPO / "tests" / "data" / "hotline_8k" / "hotline_seed.wav"
SEED_TEXT = "我今天发现新华路十二号井盖发生了破损有安全隐患"
GOOD_ENOUGH_CER = 0.25  # the bundled recordings are training text; the model reads them exactly today
E2E_CHUNK_MS, E2E_LEFT_CHUNKS = 320, 4  # deploy/config/routes.example.yaml, profile "default"


@functools.cache
def seed_transcript() -> str:
    """The demo model's final for the seed sentence as the service computes it: 320 ms chunks,
    the service's default finals search (``engine.attention_beam``: 0, WeNet's attention
    rescoring of the CTC n-best; ``asr_core.finals``). '' without a model."""
    if not (DEMO_MODEL / "final.pt").is_file():
        return ""
    engine = EngineSettings()
    loaded = load_wenet_model(DEMO_MODEL)
    fbank = torch.from_numpy(compute_fbank(read_wav(SEED_WAV).samples))
    with torch.inference_mode():
        encoder_out, _ = encode_streaming(loaded, fbank, 8, 4)
        log_probs = loaded.model.ctc_log_probs(encoder_out.unsqueeze(0))[0]
    settings = FinalSettings.for_model(
        loaded, beam=engine.beam, ctc_weight=engine.ctc_weight, reverse_weight=engine.reverse_weight,
        attention_beam=engine.attention_beam,
    )  # fmt: skip
    request = FinalRequest(*ctc_topk(log_probs, engine.beam), encoder_out)
    (result,) = FinalSearch(loaded.model.decoder, settings).run([request])
    best = result.rescored.tokens if result.rescored is not None else ()
    return tokens_to_text(best, loaded.units)


@functools.cache
def service_seed_transcript() -> str:
    """The finals the serving engine emits for the seed recording, joined ('' without a model)."""
    if not (DEMO_MODEL / "final.pt").is_file():
        return ""
    options = engine_options(load_config(None, environ={}))
    engine = Engine(load_wenet_model(DEMO_MODEL), replace(options, max_streams=1, trim_interval_s=0))
    finals: list[str] = []
    stream = engine.open_stream(
        StreamConfig(chunk_ms=E2E_CHUNK_MS, left_chunks=E2E_LEFT_CHUNKS, stream_id="seed"),
        lambda event: finals.append(event.text) if isinstance(event, Final) else None,
    )
    stream.accept_waveform(np.clip(np.rint(read_wav(SEED_WAV).samples), -32768, 32767).astype(np.int16))
    stream.input_finished()
    while not stream.done.is_set():
        engine.run_once()
    return "".join(finals)
