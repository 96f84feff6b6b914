"""Fbank front end: fidelity to the golden fixture's fbank, and streaming == whole file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asr_core import frontend
from asr_core.audio_io import read_wav
from asr_core.frontend import NUM_MEL_BINS, FbankStream, compute_fbank, fbank_windows, num_fbank_frames, window_samples
from tests.knf_reference import knf_fbank

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
needs_fixture = pytest.mark.skipif(
    not (FIXTURE / "expected.npz").exists(), reason=f"golden fixture not found at {FIXTURE}"
)


@needs_fixture
@pytest.mark.parametrize("utt", ["utt1", "utt2"])
def test_fbank_matches_fixture(utt: str) -> None:
    audio = read_wav(FIXTURE / "wav" / f"{utt}.wav")
    expected = np.load(FIXTURE / "expected.npz")[f"{utt}__fbank"]
    got = compute_fbank(audio.samples)
    assert got.shape == expected.shape == (num_fbank_frames(audio.samples.shape[0]), NUM_MEL_BINS)
    diff = np.abs(got - expected)
    assert diff.max() <= 2e-2
    assert diff.mean() <= 1e-4


@pytest.mark.parametrize("seed", range(3))
def test_matches_kaldi_native_fbank(seed: int) -> None:
    """Speech-like level, silence (the log floor), a loud tone and clipping-level noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(16000) / 16000.0
    audio = rng.normal(0, [300, 3000, 12000][seed], t.shape[0]) + 8000 * np.sin(2 * np.pi * 1234 * t)
    audio[4000:6000] = 0.0
    samples = np.clip(np.round(audio), -32768, 32767).astype(np.int16)
    ours, reference = compute_fbank(samples), knf_fbank(samples)
    assert ours.shape == reference.shape
    diff = np.abs(ours - reference)
    # float32 FFTs of different libraries: ~1e-5 typical; the largest differences are in bins
    # with little energy, where the log magnifies them (measured up to 6.3e-4).
    assert diff.max() <= 2e-3
    assert diff.mean() <= 2e-5


def test_a_frame_does_not_depend_on_its_batch() -> None:
    """The engine computes a batch of streams' chunks in one call; each row must be what the
    stream alone gives, bit for bit (the engine's tokens are compared with the single stream's)."""
    rng = np.random.default_rng(3)
    frames = 19
    audio = torch.from_numpy((rng.normal(0, 3000, (23, window_samples(frames)))).astype(np.float32))
    together = fbank_windows(audio, frames)
    for row in range(audio.shape[0]):
        alone = fbank_windows(audio[row : row + 1], frames)[0]
        assert torch.equal(alone, together[row])
        stream = FbankStream()
        stream.accept_waveform(audio[row].numpy())
        assert np.array_equal(stream.get_frames(0, frames), together[row].numpy())


def test_int16_and_float_input_agree() -> None:
    samples = np.random.default_rng(0).integers(-3000, 3000, size=4000).astype(np.int16)
    assert np.array_equal(compute_fbank(samples), compute_fbank(samples.astype(np.float32)))


def test_short_input_gives_no_frames() -> None:
    assert compute_fbank(np.zeros(399, dtype=np.int16)).shape == (0, NUM_MEL_BINS)
    assert compute_fbank(np.zeros(400, dtype=np.int16)).shape == (1, NUM_MEL_BINS)


def _waveform() -> np.ndarray:
    rng = np.random.default_rng(7)
    t = np.arange(9000) / 16000.0
    tone = 4000 * np.sin(2 * np.pi * 440 * t) + rng.normal(0, 300, t.shape[0])
    tone[3000:3800] = 0.0  # digital silence hits the log floor
    return np.round(tone).astype(np.int16)


WAVE = _waveform()
WHOLE = compute_fbank(WAVE)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.one_of(st.integers(0, 2), st.integers(0, 3000)), max_size=60),
    pop_every=st.integers(1, 7),
)
def test_streaming_equals_whole_file(sizes: list[int], pop_every: int) -> None:
    """Random piece sizes, 0- and 1-sample pieces included, with pops interleaved."""
    pieces = []
    pos = 0
    for n in sizes:
        pieces.append(WAVE[pos : pos + n])
        pos += n
    pieces.append(WAVE[pos:])
    stream = FbankStream()
    frames = []
    for i, piece in enumerate(pieces):
        stream.accept_waveform(piece)
        if i % pop_every == 0:
            frames.append(stream.pop_frames(stream.num_frames_available))
    stream.input_finished()
    frames.append(stream.pop_frames(stream.num_frames_available))
    assert np.array_equal(np.concatenate(frames), WHOLE)
    assert stream.num_frames_ready == WHOLE.shape[0]


def test_one_sample_at_a_time() -> None:
    stream = FbankStream()
    for x in WAVE[:2000]:
        stream.accept_waveform(np.array([x]))
        stream.accept_waveform(np.array([], dtype=np.int16))
    stream.input_finished()
    assert np.array_equal(stream.get_frames(0, stream.num_frames_ready), compute_fbank(WAVE[:2000]))


def test_popped_frames_are_freed_and_indices_stay_absolute() -> None:
    stream = FbankStream()
    stream.accept_waveform(WAVE)
    stream.drop_frames(10)
    assert stream.first_available == 10
    assert np.array_equal(stream.get_frames(10, 5), WHOLE[10:15])
    with pytest.raises(IndexError):
        stream.get_frames(9, 1)
    with pytest.raises(IndexError):
        stream.get_frames(10, stream.num_frames_ready)
    stream.input_finished()
    with pytest.raises(RuntimeError):
        stream.accept_waveform(WAVE[:10])


@pytest.mark.parametrize("initial", [1, 400, 5000])
def test_samples_move_to_the_buffer_front_or_a_larger_buffer_and_stay_bounded(
    initial: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small starting buffer forces both ways to make room (moving the held samples to the
    front, growing the buffer), often, as a long call would; the frames stay exact, and a
    stream whose frames are taken as they come keeps a buffer bounded by what it holds."""
    monkeypatch.setattr(frontend, "INITIAL_BUFFER_SAMPLES", initial)
    stream = FbankStream()
    rng = np.random.default_rng(initial)
    frames, pos, sizes = [], 0, []
    while pos < WAVE.shape[0]:
        n = int(rng.integers(0, 700))
        stream.accept_waveform(WAVE[pos : pos + n])
        pos += n
        sizes.append(stream._buffer.shape[0])
        frames.append(stream.pop_frames(stream.num_frames_available))
    stream.input_finished()
    frames.append(stream.pop_frames(stream.num_frames_available))
    assert np.array_equal(np.concatenate(frames), WHOLE)
    assert max(sizes) <= max(initial, 4 * (700 + 400)), "the buffer grew with the stream, not with what it holds"
