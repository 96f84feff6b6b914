"""Speech synthesis and the telephone channel."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from recipes import channel, synth
from recipes.textgen import SEED_SENTENCE
from rtp import g711
from rtp.resample import Upsampler, upsample_recording

needs_espeak = pytest.mark.skipif(
    not synth.espeak_available(), reason="espeak-ng not installed (apt-get install espeak-ng)"
)


def test_pinyin_has_tone_numbers_and_neutral_five() -> None:
    assert synth.to_pinyin("我们好，你") == "wo3 men5 hao3 , ni3"


@needs_espeak
def test_espeak_speaks_pinyin_with_voice_settings() -> None:
    slow, rate = synth.synthesize(SEED_SENTENCE, synth.Voice("m3", 175, 50, 2))
    fast, _ = synth.synthesize(SEED_SENTENCE, synth.Voice("f2", 255, 70, 0))
    assert rate == 22050 and slow.dtype == np.int16
    assert 2.0 < len(fast) / rate < len(slow) / rate < 12.0
    assert np.abs(slow.astype(np.float64)).max() > 1000


def test_held_out_voices_never_use_training_variants() -> None:
    import random

    rng = random.Random(0)
    assert {synth.sample_voice(rng, held_out=True).variant for _ in range(50)} <= set(synth.TEST_VARIANTS)
    assert not set(synth.TEST_VARIANTS) & set(synth.TRAIN_VARIANTS)


def _tone_mix(rate: int, seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.2 * (np.sin(2 * np.pi * 100 * t) + np.sin(2 * np.pi * 1000 * t) + np.sin(2 * np.pi * 3900 * t))).astype(
        np.float32
    )


def _power_at(pcm: np.ndarray, rate: int, hz: float) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64))) ** 2
    freqs = np.fft.rfftfreq(len(pcm), 1 / rate)
    return float(spectrum[np.abs(freqs - hz) < 20].sum())


def test_channel_is_8khz_int16_band_limited_and_deterministic() -> None:
    quiet = channel.ChannelConfig(clean_probability=1.0, loss_probability=0.0, pad_s=(0.0, 0.0))
    pcm = channel.telephone(_tone_mix(22050), 22050, seed=1, config=quiet)
    assert pcm.dtype == np.int16 and len(pcm) == 16000
    in_band = _power_at(pcm, 8000, 1000)
    assert _power_at(pcm, 8000, 100) < 1e-3 * in_band  # below 300 Hz removed
    assert _power_at(pcm, 8000, 3900) < 1e-3 * in_band  # above 3400 Hz removed
    noisy_a = channel.telephone(_tone_mix(22050), 22050, seed=7)
    assert np.array_equal(noisy_a, channel.telephone(_tone_mix(22050), 22050, seed=7))
    assert not np.array_equal(noisy_a, channel.telephone(_tone_mix(22050), 22050, seed=8))


def test_channel_output_survives_another_g711_round_trip_unchanged() -> None:
    pcm = channel.telephone(_tone_mix(16000), 16000, seed=3, config=channel.ChannelConfig(loss_probability=0.0))
    codecs = [c for c in ("PCMU", "PCMA") if np.array_equal(g711.decode(c, g711.encode(c, pcm)), pcm)]
    assert len(codecs) == 1  # already quantised by exactly one of the two laws


def test_packet_loss_zeroes_whole_20ms_packets() -> None:
    lossy = channel.ChannelConfig(clean_probability=1.0, loss_probability=1.0, packet_loss=(0.3, 0.3))
    pcm = channel.telephone(_tone_mix(8000, 4.0), 8000, seed=2, config=lossy)
    packets = pcm[: len(pcm) // 160 * 160].reshape(-1, 160)
    silent = np.all(packets == 0, axis=1)
    assert 0.15 < silent.mean() < 0.45


def test_upsampling_to_model_rate_is_the_services() -> None:
    """Training features see the audio the service's RTP path hands the engine, rounding included."""
    pcm = channel.telephone(_tone_mix(8000), 8000, seed=4)
    out = upsample_recording(pcm)
    assert out.dtype == np.float32 and len(out) == 2 * len(pcm)
    assert np.array_equal(out, np.rint(out))  # int16 values, as the service's
    service = Upsampler()
    pieces = [service.process(pcm[i : i + 160]) for i in range(0, len(pcm), 160)] + [service.flush()]
    assert np.array_equal(out, np.concatenate(pieces).astype(np.float32))


def test_speech_starts_and_ends_at_random_points_of_a_noisy_line() -> None:
    tone = _tone_mix(8000, 1.0)
    noisy = channel.ChannelConfig(clean_probability=0.0, loss_probability=0.0, snr_db=(20.0, 20.0))
    lengths = {len(channel.telephone(tone, 8000, seed=seed, config=noisy)) for seed in range(8)}
    assert len(lengths) > 4 and min(lengths) >= 8000 and max(lengths) <= 8000 + 2 * 0.8 * 8000
    pcm = channel.telephone(tone, 8000, seed=3, config=replace(noisy, pad_s=(0.5, 0.5)))
    assert len(pcm) == 16000
    lead, speech = pcm[:3600].astype(np.float64), pcm[4400:11600].astype(np.float64)
    assert np.any(lead != 0)  # the line's noise, not digital silence
    assert 10 * np.log10(np.mean(speech**2) / np.mean(lead**2)) > 15  # and 20 dB below the speech
