"""Turn sentences into training data: speech -> telephone channel -> fbank, cached on disk.

A prepared data directory holds

* ``feats.npy``: all utterances' fbank frames stacked, float16 (sum of T, mel bins), computed
  with the model's front end (``FrontendConfig``: the training config's ``dataset_conf``; the
  demo model's is WeNet's 16 kHz, 80 bins);
* ``index.tsv``: ``utt_id <TAB> first frame <TAB> frames <TAB> transcript`` per utterance;
* with ``write_wavs``: ``<utt_id>.wav`` (8 kHz mono 16-bit, what a call delivers) and ``text``
  (``<utt_id> <transcript>``), the test-set layout that ``asr-bench accuracy`` reads.

Rendering (synthesis, channel, fbank) runs in a pool of worker processes; each utterance's
voice and channel come from its own seed, so the data is the same for the same seed.
"""

from __future__ import annotations

import random
import wave
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from asr_common.audio import SAMPLE_RATE, TELEPHONE_RATE
from asr_core.frontend import DEFAULT_FRONTEND, FrontendConfig, compute_fbank
from deploy.bench.accuracy import read_audio
from recipes import channel, synth
from recipes.textgen import Sentence
from rtp.resample import upsample_recording


@dataclass(frozen=True)
class Job:
    utt_id: str
    text: str
    voice: synth.Voice
    channel_seed: int
    frontend: FrontendConfig = DEFAULT_FRONTEND


def features(pcm8k: np.ndarray, frontend: FrontendConfig = DEFAULT_FRONTEND) -> np.ndarray:
    """Fbank (T, mel bins) of 8 kHz telephone audio as the service computes it for a model with
    this front end: as it arrives for an 8 kHz model, through the service's upsampler for a
    16 kHz one (the gateway serves no other rate)."""
    if frontend.sample_rate == TELEPHONE_RATE:
        return compute_fbank(pcm8k, frontend)
    if frontend.sample_rate == SAMPLE_RATE:
        return compute_fbank(upsample_recording(pcm8k), frontend)
    raise ValueError(f"front end at {frontend.sample_rate} Hz: the recipe renders for 8 or 16 kHz models")


def render(job: Job) -> tuple[np.ndarray, np.ndarray]:
    """One utterance: (8 kHz int16 telephone audio (N,), its fbank float32 (T, mel bins))."""
    clean, rate = synth.synthesize(job.text, job.voice)
    pcm8k = channel.telephone(clean, rate, job.channel_seed)
    return pcm8k, features(pcm8k, job.frontend)


def make_jobs(
    sentences: list[Sentence], seed: int, prefix: str, held_out_voices: bool,
    frontend: FrontendConfig = DEFAULT_FRONTEND,
) -> list[Job]:  # fmt: skip
    rng = random.Random(seed)
    return [
        Job(f"{prefix}{i:06d}", s.text, synth.sample_voice(rng, held_out_voices), rng.randrange(2**31), frontend)
        for i, s in enumerate(sentences)
    ]


def write_wav(path: Path, pcm: np.ndarray, sample_rate: int = TELEPHONE_RATE) -> None:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm.astype("<i2").tobytes())


def prepare(
    out_dir: Path,
    sentences: list[Sentence],
    seed: int,
    prefix: str = "utt",
    held_out_voices: bool = False,
    write_wavs: bool = False,
    processes: int = 2,
    frontend: FrontendConfig = DEFAULT_FRONTEND,
) -> int:
    """Render ``sentences`` into ``out_dir`` (see module doc); returns the number of fbank frames."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = make_jobs(sentences, seed, prefix, held_out_voices, frontend)
    transcripts = [s.transcript for s in sentences]
    chunks: list[np.ndarray] = []
    offset = 0
    with open(out_dir / "index.tsv", "w", encoding="utf-8") as index, Pool(processes) as pool:
        for job, transcript, (pcm, feats) in zip(jobs, transcripts, pool.imap(render, jobs, chunksize=8), strict=True):
            index.write(f"{job.utt_id}\t{offset}\t{len(feats)}\t{transcript}\n")
            chunks.append(feats.astype(np.float16))
            offset += len(feats)
            if write_wavs:
                write_wav(out_dir / f"{job.utt_id}.wav", pcm)
    np.save(
        out_dir / "feats.npy", np.concatenate(chunks) if chunks else np.zeros((0, frontend.num_mel_bins), np.float16)
    )
    if write_wavs:
        (out_dir / "text").write_text("".join(f"{j.utt_id} {t}\n" for j, t in zip(jobs, transcripts, strict=True)))
    return offset


def prepare_from_testset(testset: Path, out_dir: Path, frontend: FrontendConfig = DEFAULT_FRONTEND) -> int:
    """Build a prepared data dir from a test-set dir (WAVs + ``text``); returns fbank frames.
    The audio is read as ``asr-bench accuracy`` reads it for a model with this front end (8 kHz
    recordings through the service's upsampler for a 16 kHz model, as they are for an 8 kHz one)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    chunks = []
    offset = 0
    with open(out_dir / "index.tsv", "w", encoding="utf-8") as index:
        for utt_id, transcript, audio in read_audio(testset, frontend.sample_rate):
            feats = compute_fbank(audio, frontend)
            index.write(f"{utt_id}\t{offset}\t{len(feats)}\t{transcript}\n")
            chunks.append(feats.astype(np.float16))
            offset += len(feats)
    np.save(out_dir / "feats.npy", np.concatenate(chunks))
    return offset


@dataclass(frozen=True)
class Entry:
    utt_id: str
    offset: int
    frames: int
    transcript: str
    part: int = 0
    """Which of the set's data directories holds the frames."""


class FeatureSet:
    """One or more prepared data directories read as one set, lazily: ``feats(i)`` is float32 (T, mel bins)."""

    def __init__(self, data_dirs: Path | Sequence[Path]) -> None:
        dirs = [data_dirs] if isinstance(data_dirs, Path) else list(data_dirs)
        self.entries: list[Entry] = []
        self._feats = []
        for part, data_dir in enumerate(dirs):
            index = data_dir / "index.tsv"
            if not index.exists():
                raise FileNotFoundError(f"{index} not found: prepare the data first (python -m recipes.recipe)")
            rows = (line.split("\t") for line in index.read_text(encoding="utf-8").splitlines())
            self.entries += [Entry(u, int(o), int(n), t, part) for u, o, n, t in rows]
            self._feats.append(np.load(data_dir / "feats.npy", mmap_mode="r"))

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def num_mel_bins(self) -> int:
        """The feature dimension (all parts must agree)."""
        dims = {feats.shape[1] for feats in self._feats}
        if len(dims) != 1:
            raise ValueError(f"prepared data directories with different fbank dimensions: {sorted(dims)}")
        return int(dims.pop())

    def feats(self, i: int) -> np.ndarray:
        e = self.entries[i]
        return np.asarray(self._feats[e.part][e.offset : e.offset + e.frames], dtype=np.float32)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)
