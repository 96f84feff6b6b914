"""WAV reading: accepted formats, 8 kHz resampling, and one-line errors for bad files."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from asr_core.audio_io import AudioError, read_wav


def write_wav(path: Path, samples: np.ndarray, rate: int = 16000, channels: int = 1, width: int = 2) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return path


def test_reads_16k_mono(tmp_path: Path) -> None:
    samples = np.arange(-800, 800, dtype=np.int16)
    audio = read_wav(write_wav(tmp_path / "a.wav", samples))
    assert audio.samples.dtype == np.float32
    assert np.array_equal(audio.samples, samples.astype(np.float32))
    assert (audio.source_rate, audio.resampled) == (16000, False)
    assert audio.duration_s == pytest.approx(0.1)


def test_resamples_8k(tmp_path: Path) -> None:
    t = np.arange(8000) / 8000.0
    samples = (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    audio = read_wav(write_wav(tmp_path / "a.wav", samples, rate=8000))
    assert audio.resampled and audio.source_rate == 8000
    assert audio.samples.shape[0] == 16000
    ref = 8000 * np.sin(2 * np.pi * 300 * np.arange(16000) / 16000.0)
    assert np.abs(audio.samples[200:-200] - ref[200:-200]).max() < 100


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    tone = (1000 * np.sin(np.arange(1600) / 5)).astype(np.int16)
    good = write_wav(tmp_path / "good.wav", tone)
    truncated = tmp_path / "truncated.wav"
    truncated.write_bytes(good.read_bytes()[:-1000])
    header_only = tmp_path / "header.wav"
    header_only.write_bytes(good.read_bytes()[:20])
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"this is not a wav file at all" * 10)
    return {
        "missing": (tmp_path / "nope.wav", "no such file"),
        "empty": (write_wav(tmp_path / "empty.wav", np.zeros(0, dtype=np.int16)), "empty"),
        "zero_bytes": (write_bytes(tmp_path / "zero.wav", b""), "not a readable"),
        "truncated": (truncated, "truncated"),
        "header_only": (header_only, "not a readable"),
        "garbage": (garbage, "not a readable"),
        "stereo": (write_wav(tmp_path / "stereo.wav", np.zeros(3200, dtype=np.int16), channels=2), "mono"),
        "rate": (write_wav(tmp_path / "rate.wav", tone, rate=44100), "44100 Hz"),
        "8bit": (write_wav(tmp_path / "8bit.wav", np.zeros(1600, dtype=np.uint8), width=1), "16-bit"),
        "directory": (tmp_path, "not a regular file"),
    }


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "case",
    ["missing", "empty", "zero_bytes", "truncated", "header_only", "garbage", "stereo", "rate", "8bit", "directory"],
)
def test_bad_files_raise_one_line_errors(tmp_path: Path, case: str) -> None:
    path, words = _bad_files(tmp_path)[case]
    with pytest.raises(AudioError) as info:
        read_wav(path)
    message = str(info.value)
    assert words in message
    assert str(path) in message
    assert "\n" not in message
