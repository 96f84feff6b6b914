"""Mandarin speech from text with espeak-ng, read as tone-numbered pinyin.

espeak-ng's plain ``cmn`` voice misreads many characters, so the text goes through pypinyin
first (``Style.TONE3``, neutral tone as 5) and is spoken by the ``cmn-latn-pinyin`` voice.
Voice variant (``+m3``, ``+f2``...), speed, pitch and word gap vary per utterance; the test
set draws from variants never used in training.
"""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing import Pool

import numpy as np
from pypinyin import Style, lazy_pinyin

TRAIN_VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "f1", "f2", "f3", "f4", "klatt", "klatt2", "klatt3", "Andy")
TEST_VARIANTS = ("m7", "f5", "klatt4", "grandma", "Alex")
_PAUSES = set("，。？！、；：,.?!;:")


@dataclass(frozen=True)
class Voice:
    """espeak-ng settings: variant name, speed (-s, words/min), pitch (-p, 0-99), word gap (-g, 10 ms units)."""

    variant: str = "m3"
    speed: int = 210
    pitch: int = 50
    gap: int = 0

    def args(self) -> list[str]:
        voice = f"cmn-latn-pinyin+{self.variant}"
        return ["-v", voice, "-s", str(self.speed), "-p", str(self.pitch), "-g", str(self.gap)]


def sample_voice(rng: random.Random, held_out: bool = False) -> Voice:
    """A random voice; ``held_out`` voices use variants and speeds that training never sees."""
    if held_out:
        speed = rng.choice((185, 205, 225, 245))
        return Voice(rng.choice(TEST_VARIANTS), speed, rng.randint(25, 75), rng.randint(0, 2))
    return Voice(rng.choice(TRAIN_VARIANTS), rng.randint(175, 255), rng.randint(20, 80), rng.randint(0, 3))


def to_pinyin(text: str) -> str:
    """Tone-numbered pinyin for espeak-ng, punctuation kept as a comma pause: "你好，世界" -> "ni3 hao3 , shi4 jie4"."""
    syllables: list[str] = []
    for piece in lazy_pinyin(text, style=Style.TONE3, neutral_tone_with_five=True, errors="default"):
        if piece in _PAUSES:
            syllables.append(",")
        else:
            syllables.extend(p for p in piece.split() if p.isascii() and p.isalnum())
    return " ".join(syllables)


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def _parse_wav(data: bytes) -> tuple[np.ndarray, int]:
    """16-bit mono WAV from espeak-ng's stdout, whose header may carry placeholder sizes."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise RuntimeError("espeak-ng did not return a WAV stream")
    sample_rate = struct.unpack_from("<I", data, 24)[0]
    start = data.index(b"data", 12) + 8
    body = data[start : start + (len(data) - start) // 2 * 2]
    return np.frombuffer(body, dtype="<i2").astype(np.int16), int(sample_rate)


def synthesize(text: str, voice: Voice) -> tuple[np.ndarray, int]:
    """Speak ``text`` (characters); returns (int16 samples (N,), sample rate in Hz, 22050 for espeak-ng)."""
    if not espeak_available():
        raise RuntimeError("espeak-ng is not installed: `apt-get install espeak-ng`")
    result = subprocess.run(
        ["espeak-ng", *voice.args(), "--stdout", to_pinyin(text)], capture_output=True, check=False, timeout=60
    )
    if result.returncode != 0:
        raise RuntimeError(f"espeak-ng failed ({result.returncode}): {result.stderr.decode(errors='replace')}")
    return _parse_wav(result.stdout)


def _synthesize_job(job: tuple[str, Voice]) -> tuple[np.ndarray, int]:
    return synthesize(*job)


def synthesize_many(jobs: Iterable[tuple[str, Voice]], processes: int = 2) -> Iterator[tuple[np.ndarray, int]]:
    """Synthesize (text, voice) jobs in a process pool, yielding results in input order."""
    with Pool(processes) as pool:
        yield from pool.imap(_synthesize_job, jobs, chunksize=8)
