"""A telephone channel for synthetic speech: what a 12345 call does to a clean voice.

Order of effects, as on a real call: level (random gain), a random stretch of line before and
after the speech, background noise at a random SNR (over the whole recording), 8 kHz sampling,
the 300-3400 Hz telephone band, G.711 companding (mu-law or A-law round trip), and now and then
a 20 ms packet lost and filled with silence. Everything random comes from one
``numpy.random.Generator`` seeded per utterance, so a seed always gives the same audio.

The stretches before and after matter because the service's utterances do not start where the
speech does: after an endpoint the next utterance starts in the caller's pause. A model that
only ever heard speech begin at its first frame learns where a sentence's words fall in time
and fails when the speech starts 0.1 s later (the fifth demo release does).

The features are computed after the service's own 8 -> 16 kHz path
(``rtp.resample.upsample_recording``, rounded to int16): rounding adds quantization noise across
4-8 kHz, where band-limited upsampling leaves nothing, and a model trained without it hears every
call as unlike its training audio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import soxr

from asr_common.audio import TELEPHONE_RATE
from rtp import g711

PACKET_SAMPLES = 160  # 20 ms at 8 kHz


@dataclass(frozen=True)
class ChannelConfig:
    """Ranges the channel draws from; levels in dBFS (RMS), SNR in dB, band edges in Hz."""

    level_db: tuple[float, float] = (-32.0, -14.0)
    snr_db: tuple[float, float] = (8.0, 35.0)
    clean_probability: float = 0.1
    band_hz: tuple[float, float] = (300.0, 3400.0)
    packet_loss: tuple[float, float] = (0.0, 0.03)
    loss_probability: float = 0.3
    pad_s: tuple[float, float] = (0.0, 0.8)  # line before and after the speech, each drawn apart


def band_pass(samples: np.ndarray, sample_rate: int, low_hz: float, high_hz: float) -> np.ndarray:
    """Zero-phase FFT band-pass with 100 Hz raised-cosine edges; float (N,) -> float (N,)."""
    n = len(samples)
    if n == 0:
        return samples.astype(np.float64)
    size = 1 << (n - 1).bit_length()
    spectrum = np.fft.rfft(samples, size)
    freqs = np.fft.rfftfreq(size, 1.0 / sample_rate)
    edge = 100.0
    gain = np.clip((freqs - (low_hz - edge)) / edge, 0.0, 1.0) * np.clip(((high_hz + edge) - freqs) / edge, 0.0, 1.0)
    gain = 0.5 - 0.5 * np.cos(np.pi * gain)
    return np.fft.irfft(spectrum * gain, size)[:n]


def _noise(rng: np.random.Generator, n: int, sample_rate: int) -> np.ndarray:
    """White, pink-ish or low rumble noise with a slowly varying level (babble/traffic stand-in)."""
    white = rng.standard_normal(n)
    kind = rng.integers(3)
    if kind == 0:
        noise = white
    else:
        spectrum = np.fft.rfft(white)
        freqs = np.maximum(np.fft.rfftfreq(n, 1.0 / sample_rate), 20.0)
        spectrum /= np.sqrt(freqs) if kind == 1 else freqs / 50.0
        noise = np.fft.irfft(spectrum, n)
    envelope = 1.0 + 0.5 * np.sin(2 * np.pi * rng.uniform(0.1, 1.0) * np.arange(n) / sample_rate + rng.uniform(0, 6.3))
    return noise * envelope


def telephone(samples: np.ndarray, sample_rate: int, seed: int, config: ChannelConfig | None = None) -> np.ndarray:
    """Clean speech (int16 or float in [-1, 1], (N,), any rate) -> 8 kHz int16 telephone audio (M,)."""
    config = config or ChannelConfig()
    rng = np.random.default_rng(seed)
    audio = samples.astype(np.float64)
    if samples.dtype == np.int16:
        audio /= 32768.0
    audio = soxr.resample(audio, sample_rate, TELEPHONE_RATE)
    rms = float(np.sqrt(np.mean(audio**2))) + 1e-9
    speech_rms = 10 ** (rng.uniform(*config.level_db) / 20)
    audio *= speech_rms / rms
    lead, trail = (round(rng.uniform(*config.pad_s) * TELEPHONE_RATE) for _ in range(2))
    audio = np.concatenate([np.zeros(lead), audio, np.zeros(trail)])
    if rng.random() >= config.clean_probability:
        noise = _noise(rng, len(audio), TELEPHONE_RATE)
        noise_rms = float(np.sqrt(np.mean(noise**2))) + 1e-12
        audio += noise * speech_rms / noise_rms * 10 ** (-rng.uniform(*config.snr_db) / 20)
    audio = band_pass(audio, TELEPHONE_RATE, *config.band_hz)
    pcm = np.clip(np.round(audio * 32768.0), -32768, 32767).astype(np.int16)
    codec = "PCMU" if rng.random() < 0.5 else "PCMA"
    pcm = g711.decode(codec, g711.encode(codec, pcm)).copy()
    if rng.random() < config.loss_probability:
        packets = len(pcm) // PACKET_SAMPLES
        lost = rng.random(packets) < rng.uniform(*config.packet_loss)
        for index in np.flatnonzero(lost):
            pcm[index * PACKET_SAMPLES : (index + 1) * PACKET_SAMPLES] = 0
    return pcm
