"""What the capacity benchmarks feed the engine: audio and a model.

The audio is a WAV file (``--audio``) or synthetic speech-like audio (``synthetic_speech``); the
model a WeNet directory (``--model``) or a random-weight one of a released architecture's shape
(``--arch``, ``make_random_model``) whose CTC head is calibrated to decode like a trained model's
(``calibrate_ctc``), so that the finals' work (prefix search, rescoring) is that of real speech.
``load_model`` gives all three to ``asr-bench engine``, ``peer-ratio``, ``sizing`` and
``sherpa-peer``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asr_common.audio import SAMPLE_RATE
from asr_core.audio_io import read_wav
from asr_core.ctc_search import ctc_greedy_batch
from asr_core.model.loader import LoadedModel, load_wenet_model
from deploy.bench.make_random_model import make_random_model


def synthetic_speech(seconds: float, seed: int, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Speech-like int16 audio at ``rate`` Hz: voiced bursts with formant-ish harmonics, pauses between."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / float(rate)
    f0 = 110 + 60 * rng.random() + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / float(rate)
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    syllables = (np.sin(2 * np.pi * 4.0 * t + rng.random() * 6) > -0.2).astype(np.float64)
    pauses = (np.sin(2 * np.pi * 0.15 * t + rng.random() * 6) > -0.6).astype(np.float64)
    noise = rng.normal(0, 0.05, n)
    wave = (voiced * 0.25 * syllables * pauses + noise) * 8000
    return np.clip(wave, -32768, 32767).astype(np.int16)


BLANK_RATE = 0.85
"""Default share of frames the calibrated random model decodes as blank: 0.80-0.86 for the
bundled trained model on the hotline recordings."""
PEAK_POSTERIOR = 0.98
"""Default mean top CTC posterior of the calibrated model: 0.98-1.0 for the trained model."""


@dataclass(frozen=True)
class CtcCalibration:
    scale: float  # the CTC head's weight and bias are multiplied by this
    blank_shift: float  # then added to the blank's bias
    tokens_per_second: float  # greedy tokens of the calibration audio
    peak: float  # mean top posterior of the calibration audio


def calibrate_ctc(
    loaded: LoadedModel,
    audio: np.ndarray,
    blank_rate: float = BLANK_RATE,
    peak: float = PEAK_POSTERIOR,
    chunk_ms: int = 160,
    left_chunks: int = 8,
) -> CtcCalibration:
    """Make a random-weight model's CTC head decode like a trained one (changes it in place).

    A random head decodes far from a trained model, in ways that change the finals' work (the
    encoder's work does not depend on the head):

    - its encoder output is dominated by one direction common to all frames, so every frame's
      best token is the same one: the head's bias is shifted to cancel the mean encoder output
      of the first 10 s of ``audio`` (encoded chunk by chunk as the engine will, ``chunk_ms``
      and ``left_chunks``), and the best token then changes from frame to frame;
    - it emits a token on nearly every frame: the blank's logit is raised until ``blank_rate``
      of those frames decode greedily as blank;
    - its posteriors are nearly flat over the whole vocabulary (mean top posterior ~0.002 on
      the AISHELL shape), and prefix beam search on flat posteriors collects hypotheses
      several times longer than the greedy path: the logits are scaled (a temperature) until
      the mean top posterior reaches ``peak``.

    Calibrated so, the AISHELL-shape model decodes 6 s of the synthetic speech as a trained
    model does real speech (docs/BENCHMARKS.md): ~3-4 tokens per second, an n-best as long as
    the greedy path whose prefix trees hold about 4-5 nodes per token in each direction.
    Returns what was applied and reached.
    """
    from asr_core.frontend import compute_fbank, encoder_frame_ms
    from asr_core.offline import encode_streaming

    rate = loaded.frontend.sample_rate
    seconds = min(len(audio), rate * 10) / rate
    with torch.inference_mode():
        fbank = torch.from_numpy(compute_fbank(audio[: rate * 10], loaded.frontend))
        chunk_frames = max(1, chunk_ms // encoder_frame_ms(loaded.frontend, loaded.subsampling))
        encoder_out, _ = encode_streaming(loaded, fbank, chunk_frames, left_chunks)
        head = loaded.model.ctc.ctc_lo
        with torch.no_grad():
            head.bias.sub_(head.weight @ encoder_out.mean(dim=0))
        logits = head(encoder_out).double()  # (T, V)
    blank = loaded.blank_id
    others = logits.clone()
    others[:, blank] = -math.inf
    margin = (others.max(dim=-1).values - logits[:, blank]).numpy()  # a frame is blank when shift/scale > margin

    threshold = float(np.quantile(margin, blank_rate)) + 1e-3

    def mean_peak(scale: float) -> float:
        scaled = logits * scale
        scaled[:, blank] += scale * threshold
        return float(torch.softmax(scaled, dim=-1).max(dim=-1).values.mean())

    low, high = 1.0, 1.0
    while mean_peak(high) < peak and high < 1e6:
        low, high = high, high * 2.0
    for _ in range(40):
        if high / low < 1.001:
            break
        mid = math.sqrt(low * high)
        low, high = (mid, high) if mean_peak(mid) < peak else (low, mid)
    scale = high
    with torch.no_grad():
        head.weight.mul_(scale)
        head.bias.mul_(scale)
        head.bias[blank] += scale * threshold
    with torch.inference_mode():
        tokens = ctc_greedy_batch(head(encoder_out)[None], torch.tensor([len(encoder_out)]), blank)[0]
    return CtcCalibration(scale, scale * threshold, len(tokens) / seconds, mean_peak(scale))


def load_model(args: argparse.Namespace, workdir: Path) -> tuple[LoadedModel, np.ndarray, dict | None]:
    """The model, the audio to feed at the model's own rate (``--audio``, resampled where it
    differs, or synthetic speech), and for a random model its CTC calibration (for the report).
    A random model is written to ``workdir`` once and read from there by later calls (the
    calibration, which depends on ``--chunk-ms``, is made afresh on each load)."""
    if args.model:
        loaded = load_wenet_model(args.model)
    else:
        model_dir = workdir / f"random_{args.arch}"
        if not (model_dir / "final.pt").is_file():
            make_random_model(args.arch, model_dir, seed=0)
        loaded = load_wenet_model(model_dir)
    rate = loaded.frontend.sample_rate
    audio = read_wav(args.audio, rate).samples if args.audio else synthetic_speech(30.0, seed=1, rate=rate)
    if args.model:
        return loaded, audio, None
    calibration = calibrate_ctc(loaded, audio, args.blank_rate, args.peak_posterior, args.chunk_ms, args.left_chunks)
    return (
        loaded,
        audio,
        {
            "blank_rate": args.blank_rate,
            "peak": round(calibration.peak, 3),
            "greedy_tokens_per_s": round(calibration.tokens_per_second, 2),
        },
    )
