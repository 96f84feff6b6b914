"""``asr-model check``: what a model directory is, whether it will stream, and how fast.

``describe`` reads the facts from the loaded model and its train.yaml: architecture,
parameters, front end, CMVN, vocabulary, and how it was trained for streaming (WeNet's
``use_dynamic_chunk``: any chunk size; ``static_chunk_size``: that one; neither: full context
only). ``self_test`` runs a recording through the serving engine (``asr_core.engine.Engine``,
one stream, every chunk step, endpoints and finals as a call gets them) once per chunk size
and gives the real-time factor: decoding seconds per second of audio for that one stream,
decoded as fast as it goes, after the engine's warm-up (wall clock, and the process's CPU
seconds, which other load on the machine disturbs less). It is a health check, not a capacity
figure (``asr-bench engine`` measures streams per core).

``real_speech_test`` decodes a data directory of real human recordings (default: the first of
``$ASR_REAL_SPEECH`` and ``shared/fixtures/real_speech`` beside the checkout that exists) through
the same engine and scores the finals: beside the bundled recording's CER (a synthetic voice) it
says at once whether a model hears real voices. Where no such directory exists (a user's
machine) it is skipped, and the report says why and how to give one.

A TorchScript runtime export (``final.zip``) is read for what it exposes (WeNet exports
``subsampling_rate``, ``right_context``, ``sos_symbol``, ``eos_symbol`` and
``is_bidirectional_decoder``) and reported as not servable, with what to fetch instead.
Loading it runs ``torch.jit.load``: check only exports from a source you trust.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from asr_common.scoring import cer, corpus_cer
from asr_core.audio_io import read_wav
from asr_core.engine import Engine, EngineOptions
from asr_core.events import Event, Final
from asr_core.frontend import encoder_frame_ms
from asr_core.model.bundled import DEMO_MODEL_NOTICE, is_demo_model
from asr_core.model.loader import CMVN_FILE, LoadedModel
from asr_core.stream import StreamConfig
from deploy.bench.datasets import DataSetError, load_dataset
from deploy.models.errors import ModelStoreError
from deploy.models.layout import RUNTIME_ADVICE, RUNTIME_EXPORT

CHUNK_SIZES_MS = (160, 240, 320, 640)
SELF_TEST_RECORDING = "hotline_1"
"""A bundled 8 kHz call recording (``asr_gateway/dev/data``, the demo's) and its reference."""
REAL_SPEECH_ENV = "ASR_REAL_SPEECH"
"""Environment variable naming a data directory of real recordings for the check."""
REAL_SPEECH_FIXTURE = Path("shared") / "fixtures" / "real_speech"
"""Where a development checkout's real recordings lie, relative to the checkout's parent: six
AISHELL-1 utterances (Apache 2.0), kept outside the repository."""
TORCHSCRIPT_FACTS = ("subsampling_rate", "right_context", "sos_symbol", "eos_symbol", "is_bidirectional_decoder")


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What ``check`` prints about a checkpoint directory."""

    model_dir: str
    demo: bool  # the bundled synthetic-voices model (its DEMO marker file)
    notice: str | None  # what to say about it (how to install a real model); None for other models
    encoder: str  # "conformer" or "transformer"
    encoder_blocks: int
    d_model: int
    heads: int
    linear_units: int
    conv_kernel: int | None  # the conformer's depthwise conv; None without one
    causal_conv: bool
    decoder: str  # "bitransformer" or "transformer"
    decoder_blocks: int  # left-to-right
    reverse_decoder_blocks: int  # right-to-left; 0 when not bidirectional
    bidirectional_decoder: bool
    parameters: int
    sample_rate: int  # Hz
    fbank_bins: int
    frame_shift_ms: float
    encoder_frame_ms: int  # one encoder output frame (subsampling x frame shift)
    right_context_frames: int  # fbank frames the encoder looks ahead
    cmvn: bool  # global CMVN statistics (global_cmvn) in use
    vocab_size: int
    dynamic_chunk: bool  # train.yaml encoder_conf.use_dynamic_chunk
    dynamic_left_chunk: bool  # encoder_conf.use_dynamic_left_chunk
    static_chunk_frames: int  # encoder_conf.static_chunk_size (0: none)
    can_stream: bool
    streaming: str  # the verdict, one sentence


@dataclass(frozen=True, slots=True)
class RuntimeExportFacts:
    """What can be read from a TorchScript runtime export, and why it cannot be served."""

    model_dir: str
    parameters: int  # float parameters plus int8-packed Linear weights
    exported: dict[str, int | bool]  # WeNet's exported facts that the file has
    servable: bool
    advice: str


@dataclass(frozen=True, slots=True)
class SelfTestResult:
    """One chunk size's run of the recording through the engine."""

    chunk_ms: int
    audio_s: float
    decode_s: float  # wall clock
    rtf: float  # decode_s / audio_s
    cpu_rtf: float  # CPU seconds of this process (all its threads) / audio_s: steadier on a shared machine
    text: str  # the finals, joined
    cer: float | None  # against the recording's reference, when it has one


@dataclass(frozen=True, slots=True)
class SelfTest:
    """The self-test: the recording, how it ran, and one result per chunk size."""

    wav: str
    recording: str  # how to name it: the path, or the bundled recording's name
    reference: str | None
    backend: str
    torch_threads: int
    warm_up_s: float  # tracing the chunk steps, and one untimed second of audio
    runs: tuple[SelfTestResult, ...]


@dataclass(frozen=True, slots=True)
class RealSpeechUtterance:
    utt_id: str
    reference: str
    text: str  # the finals, joined
    cer: float


@dataclass(frozen=True, slots=True)
class RealSpeechTest:
    """Real human recordings through the engine at one chunk size; ``skipped`` says why not."""

    data_dir: str | None
    chunk_ms: int
    skipped: str | None = None
    audio_s: float = 0.0
    cer: float | None = None  # all errors over all reference characters
    utterances: tuple[RealSpeechUtterance, ...] = ()


def describe(loaded: LoadedModel, model_dir: Path) -> ModelFacts:
    config = loaded.config
    enc, dec = config.encoder_conf, config.decoder_conf
    frame_ms = encoder_frame_ms(loaded.frontend, loaded.subsampling)
    can_stream, verdict = _streaming_verdict(enc.use_dynamic_chunk, enc.static_chunk_size, frame_ms)
    reverse_blocks = dec.r_num_blocks if config.decoder == "bitransformer" else 0
    return ModelFacts(
        model_dir=str(model_dir),
        demo=is_demo_model(model_dir),
        notice=DEMO_MODEL_NOTICE if is_demo_model(model_dir) else None,
        encoder=config.encoder,
        encoder_blocks=loaded.num_blocks,
        d_model=loaded.d_model,
        heads=loaded.heads,
        linear_units=enc.linear_units,
        conv_kernel=enc.cnn_module_kernel if config.encoder == "conformer" and enc.use_cnn_module else None,
        causal_conv=enc.causal,
        decoder=config.decoder,
        decoder_blocks=dec.num_blocks,
        reverse_decoder_blocks=reverse_blocks,
        bidirectional_decoder=reverse_blocks > 0,
        parameters=sum(p.numel() for p in loaded.model.parameters()),
        sample_rate=loaded.sample_rate,
        fbank_bins=loaded.frontend.num_mel_bins,
        frame_shift_ms=loaded.frontend.frame_shift_ms,
        encoder_frame_ms=frame_ms,
        right_context_frames=loaded.right_context,
        cmvn=config.cmvn is not None and (model_dir / CMVN_FILE).is_file(),
        vocab_size=loaded.vocab_size,
        dynamic_chunk=enc.use_dynamic_chunk,
        dynamic_left_chunk=enc.use_dynamic_left_chunk,
        static_chunk_frames=enc.static_chunk_size,
        can_stream=can_stream,
        streaming=verdict,
    )


def _streaming_verdict(dynamic_chunk: bool, static_chunk: int, frame_ms: int) -> tuple[bool, str]:
    if dynamic_chunk:
        return True, "yes: trained with dynamic chunks (use_dynamic_chunk), so every chunk size streams"
    if static_chunk > 0:
        return True, (
            f"only at {static_chunk * frame_ms} ms chunks: trained with static_chunk_size {static_chunk}; "
            "other chunk sizes see context it never trained on"
        )
    return False, (
        "no: trained on full context (no use_dynamic_chunk, no static_chunk_size); it runs chunked, but "
        "each chunk sees far less context than in training and accuracy drops: use a U2/U2++ model"
    )


def describe_runtime_export(model_dir: Path) -> RuntimeExportFacts:
    """Facts of ``model_dir/final.zip`` (a WeNet TorchScript export)."""
    path = model_dir / RUNTIME_EXPORT
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except (RuntimeError, ValueError) as exc:
        raise ModelStoreError(f"{path}: not a loadable TorchScript file ({' '.join(str(exc).split())[:200]})") from None
    exported: dict[str, int | bool] = {}
    for name in TORCHSCRIPT_FACTS:
        # A foreign artefact: which of WeNet's exported methods it has depends on its version.
        method = getattr(module, name, None)
        if method is not None:
            exported[name] = method()
    return RuntimeExportFacts(
        model_dir=str(model_dir),
        parameters=_torchscript_parameters(module),
        exported=exported,
        servable=False,
        advice=RUNTIME_ADVICE,
    )


def _torchscript_parameters(module: torch.jit.ScriptModule) -> int:
    """Float parameters, plus the weights and biases inside int8-packed Linears (WeNet's x86
    exports are dynamically quantized: their Linears hold no ordinary parameters)."""
    total = sum(p.numel() for p in module.parameters())
    for sub in module.modules():
        packed = getattr(sub, "_packed_params", None)  # a quantized Linear's packed weights
        if isinstance(packed, torch.ScriptObject):
            try:
                weight, bias = torch.ops.quantized.linear_unpack(packed)
            except RuntimeError:
                continue  # packed params of another kind (a quantized conv): not counted
            total += weight.numel() + (bias.numel() if bias is not None else 0)
    return total


def bundled_recording() -> tuple[Path, str]:
    """The self-test's default recording and its reference text."""
    data = resources.files("asr_gateway.dev") / "data"
    references = dict(
        line.split(maxsplit=1) for line in (data / "text").read_text(encoding="utf-8").splitlines() if line.strip()
    )
    return Path(str(data / f"{SELF_TEST_RECORDING}.wav")), references[SELF_TEST_RECORDING]


def self_test(
    loaded: LoadedModel, chunk_sizes_ms: Sequence[int], wav: Path | None = None, backend: str = "torch"
) -> SelfTest:
    """Run ``wav`` (default: the bundled call, scored against its reference) through the
    engine once per chunk size."""
    reference = None
    if wav is None:
        wav, reference = bundled_recording()
        recording = f"the bundled call recording {wav.name}"
    else:
        recording = str(wav)
    audio = read_wav(wav, loaded.sample_rate)
    samples = np.clip(np.rint(audio.samples), -32768, 32767).astype(np.int16)
    engine = Engine(
        loaded,
        EngineOptions(
            max_streams=1,
            allowed_chunk_ms=tuple(chunk_sizes_ms),
            backend=backend,
            trim_interval_s=0,
            behind_ms=float("inf"),  # the recording arrives at once: its chunks wait by design
        ),
    )
    try:
        started = time.perf_counter()
        engine.warm_up()
        # One untimed second through a stream, so the first timed run does not pay the finals'
        # first-call costs (decoder allocations, the search's first use) for all of them.
        _one_run(engine, samples[: audio.rate], 1.0, chunk_sizes_ms[0], None)
        warm_up_s = time.perf_counter() - started
        runs = tuple(_one_run(engine, samples, audio.duration_s, chunk_ms, reference) for chunk_ms in chunk_sizes_ms)
    finally:
        engine.stop()
    return SelfTest(
        wav=str(wav),
        recording=recording,
        reference=reference,
        backend=backend,
        torch_threads=torch.get_num_threads(),
        warm_up_s=round(warm_up_s, 3),
        runs=runs,
    )


def real_speech_candidates(environ: Mapping[str, str] = os.environ, cwd: Path | None = None) -> list[Path]:
    """Where the check looks for real recordings when no ``--real-speech`` is given, in order:
    ``$ASR_REAL_SPEECH``, then ``shared/fixtures/real_speech`` beside the working directory and
    beside this checkout."""
    candidates = [Path(environ[REAL_SPEECH_ENV])] if environ.get(REAL_SPEECH_ENV) else []
    checkout = Path(__file__).resolve().parents[2]
    for base in ((cwd or Path.cwd()).resolve().parent, checkout.parent):
        if base / REAL_SPEECH_FIXTURE not in candidates:
            candidates.append(base / REAL_SPEECH_FIXTURE)
    return candidates


def find_real_speech(candidates: Sequence[Path]) -> tuple[Path | None, str | None]:
    """The first candidate that is a directory, or None and why none is used."""
    for path in candidates:
        if path.is_dir():
            return path, None
    looked = ", ".join(str(path) for path in candidates)
    return None, (
        f"no real recordings found (looked in {looked}); give --real-speech DIR, a Kaldi data directory "
        "(wav.scp + text) of real human speech, to see whether the model hears real voices"
    )


def real_speech_test(
    loaded: LoadedModel, data_dir: Path | None, chunk_ms: int, backend: str = "torch", skipped: str | None = None
) -> RealSpeechTest:
    """Decode every utterance of ``data_dir`` through the engine at ``chunk_ms`` and score the
    finals; with ``data_dir`` None, a skipped result carrying ``skipped``."""
    if data_dir is None:
        return RealSpeechTest(None, chunk_ms, skipped=skipped or "no real-speech directory given")
    try:
        dataset = load_dataset(data_dir)
    except DataSetError as exc:
        raise ModelStoreError(f"--real-speech: {exc}") from None
    engine = Engine(
        loaded,
        EngineOptions(
            max_streams=1, allowed_chunk_ms=(chunk_ms,), backend=backend, trim_interval_s=0, behind_ms=float("inf")
        ),
    )
    results: list[RealSpeechUtterance] = []
    audio_s = 0.0
    try:
        engine.warm_up()
        for utterance in dataset.utterances:
            audio = read_wav(utterance.wav, loaded.sample_rate)
            begin = round(utterance.begin_s * audio.rate)
            end = None if utterance.end_s is None else round(utterance.end_s * audio.rate)
            samples = np.clip(np.rint(audio.samples[begin:end]), -32768, 32767).astype(np.int16)
            run = _one_run(engine, samples, len(samples) / audio.rate, chunk_ms, utterance.text)
            audio_s += run.audio_s
            results.append(RealSpeechUtterance(utterance.utt_id, utterance.text, run.text, run.cer or 0.0))
    finally:
        engine.stop()
    return RealSpeechTest(
        data_dir=str(data_dir),
        chunk_ms=chunk_ms,
        audio_s=round(audio_s, 3),
        cer=round(corpus_cer([r.text for r in results], [r.reference for r in results]), 4),
        utterances=tuple(results),
    )


def _one_run(
    engine: Engine, samples: np.ndarray, audio_s: float, chunk_ms: int, reference: str | None
) -> SelfTestResult:
    finals: list[str] = []

    def on_event(event: Event) -> None:
        if isinstance(event, Final):
            finals.append(event.text)

    started, cpu_started = time.perf_counter(), time.process_time()
    stream = engine.open_stream(StreamConfig(chunk_ms=chunk_ms), on_event)
    stream.accept_waveform(samples)
    stream.input_finished()
    while not stream.done.is_set():
        engine.run_once()
    decode_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    text = "".join(finals)
    return SelfTestResult(
        chunk_ms=chunk_ms,
        audio_s=round(audio_s, 3),
        decode_s=round(decode_s, 3),
        rtf=round(decode_s / audio_s, 4),
        cpu_rtf=round(cpu_s / audio_s, 4),
        text=text,
        cer=None if reference is None else round(cer(text, reference), 4),
    )
