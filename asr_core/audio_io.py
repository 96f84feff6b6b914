"""Reading WAV files: 16-bit PCM mono; for offline transcription 16 kHz (8 kHz is resampled).

The one WAV reader of the project: ``read_pcm16`` gives a file's samples at its own rate (test
sets, training data), ``read_wav`` the 16 kHz audio the engine takes. Every problem with a file
is an :class:`AudioError` whose message is one line naming the file and saying what to do.
"""

from __future__ import annotations

import struct
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

from asr_common.audio import SAMPLE_RATE, TELEPHONE_RATE

RESAMPLED_RATES = (TELEPHONE_RATE,)


class AudioError(ValueError):
    """A WAV file that cannot be transcribed; the message is one line meant for the user."""


@dataclass(frozen=True)
class Audio:
    """Decoded audio at ``rate`` Hz (16 kHz unless the model's front end runs at 8 kHz).

    ``samples`` is (N,) float32 in int16 range (what the fbank expects); ``source_rate`` is
    the file's rate (differs from ``rate`` when it was resampled).
    """

    samples: np.ndarray
    source_rate: int
    rate: int = SAMPLE_RATE

    @property
    def sample_rate(self) -> int:
        return self.rate

    @property
    def resampled(self) -> bool:
        return self.source_rate != self.rate

    @property
    def duration_s(self) -> float:
        return self.samples.shape[0] / self.rate


def read_pcm16(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a 16-bit PCM mono WAV at any rate: (int16 samples (N,), sample rate in Hz).

    Raises:
        AudioError: missing, unreadable, empty, truncated, not PCM WAV, not 16-bit or not mono.
    """
    p = Path(path)
    if not p.exists():
        raise AudioError(f"{p}: no such file")
    if not p.is_file():
        raise AudioError(f"{p}: not a regular file")
    try:
        with wave.open(str(p), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            declared = wav.getnframes()
            data = wav.readframes(declared)
    except (wave.Error, EOFError, struct.error) as exc:
        raise AudioError(f"{p}: not a readable PCM WAV file ({exc}); convert it to 16-bit PCM mono WAV") from exc
    except OSError as exc:
        raise AudioError(f"{p}: cannot read ({exc.strerror or exc})") from exc
    if channels != 1:
        raise AudioError(f"{p}: {channels} channels; only mono is supported (e.g. sox IN -c 1 OUT.wav)")
    if width != 2:
        raise AudioError(f"{p}: {8 * width}-bit samples; only 16-bit PCM is supported (sox IN -b 16 OUT.wav)")
    got = len(data) // width
    if got < declared:
        raise AudioError(f"{p}: truncated: header declares {declared} samples, file holds {got}")
    if got == 0:
        raise AudioError(f"{p}: empty: no audio samples")
    return np.frombuffer(data, dtype="<i2").astype(np.int16), rate


def read_wav(path: str | Path, rate: int = SAMPLE_RATE) -> Audio:
    """Read a 16-bit PCM mono WAV at 16 kHz or 8 kHz, resampled with soxr to ``rate`` (the
    model's rate: 16000, or 8000 for a telephony model) when it differs.

    Raises:
        AudioError: missing, unreadable, empty, truncated, not PCM WAV, not 16-bit,
            not mono, or an unsupported sample rate.
    """
    pcm, source = read_pcm16(path)
    if source != rate and source != SAMPLE_RATE and source not in RESAMPLED_RATES:
        raise AudioError(f"{path}: sample rate {source} Hz; use 16000 Hz or 8000 Hz (sox IN -r {rate} OUT.wav)")
    samples = pcm.astype(np.float32)
    if source != rate:
        samples = soxr.resample(samples, source, rate).astype(np.float32)
    return Audio(samples=samples, source_rate=source, rate=rate)
