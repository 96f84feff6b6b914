"""80-bin Kaldi fbank, computed exactly as WeNet's front end computes it.

WeNet calls ``torchaudio.compliance.kaldi.fbank(waveform * (1 << 15), num_mel_bins=80,
frame_length=25, frame_shift=10, dither=0.0, energy_floor=0.0, sample_frequency=16000)``;
kaldi-native-fbank with the same options is the implementation of record (see the golden
fixture's manifest). Input samples are int16 values, as int16 or as floats in int16 range.
Frames are 25 ms long (400 samples) every 10 ms (160 samples), snip_edges: a waveform of N
samples gives ``1 + (N - 400) // 160`` frames (0 if N < 400).
"""

from __future__ import annotations

import kaldi_native_fbank as knf
import numpy as np

SAMPLE_RATE = 16000
NUM_MEL_BINS = 80
FRAME_LENGTH_SAMPLES = 400
FRAME_SHIFT_SAMPLES = 160


def fbank_options() -> knf.FbankOptions:
    """kaldi-native-fbank options equal to WeNet's ``kaldi.fbank`` call."""
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.frame_opts.frame_length_ms = 25.0
    opts.frame_opts.frame_shift_ms = 10.0
    opts.frame_opts.dither = 0.0
    opts.frame_opts.preemph_coeff = 0.97
    opts.frame_opts.remove_dc_offset = True
    opts.frame_opts.window_type = "povey"
    opts.frame_opts.round_to_power_of_two = True
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = NUM_MEL_BINS
    opts.mel_opts.low_freq = 20.0
    opts.mel_opts.high_freq = 0.0
    opts.energy_floor = 0.0
    opts.use_energy = False
    opts.raw_energy = True
    opts.htk_compat = False
    opts.use_log_fbank = True
    opts.use_power = True
    return opts


def num_fbank_frames(num_samples: int) -> int:
    """Frames that ``num_samples`` samples (16 kHz) give with snip_edges."""
    if num_samples < FRAME_LENGTH_SAMPLES:
        return 0
    return 1 + (num_samples - FRAME_LENGTH_SAMPLES) // FRAME_SHIFT_SAMPLES


def _as_float_samples(samples: np.ndarray) -> np.ndarray:
    x = np.asarray(samples)
    if x.ndim != 1:
        raise ValueError(f"expected mono samples of shape (N,), got shape {x.shape}")
    return x.astype(np.float32, copy=False)


def compute_fbank(samples: np.ndarray) -> np.ndarray:
    """Fbank of a whole 16 kHz waveform.

    Args:
        samples: (N,) int16 samples, or floats in int16 range.
    Returns:
        (T, 80) float32 log mel energies, T = ``num_fbank_frames(N)``.
    """
    stream = FbankStream()
    stream.accept_waveform(samples)
    stream.input_finished()
    return stream.pop_frames(stream.num_frames_ready)


class FbankStream:
    """Incremental fbank of one audio stream, identical to :func:`compute_fbank` on the whole.

    Waveform pieces of any size (0 and 1 samples included) go in; frames come out as soon
    as their 25 ms window is complete. Frame indices are absolute (frame 0 is the stream's
    first frame); frames handed out by :meth:`pop_frames` or dropped by :meth:`drop_frames`
    are freed, so memory stays bounded for streams of any length.
    """

    def __init__(self) -> None:
        self._fbank = knf.OnlineFbank(fbank_options())
        self._first = 0  # absolute index of the oldest frame still held
        self._finished = False

    @property
    def num_frames_ready(self) -> int:
        """Absolute count of frames computed so far (popped ones included)."""
        return int(self._fbank.num_frames_ready)

    @property
    def first_available(self) -> int:
        """Absolute index of the oldest frame still held."""
        return self._first

    @property
    def num_frames_available(self) -> int:
        """Frames computed and not yet popped."""
        return self.num_frames_ready - self._first

    @property
    def finished(self) -> bool:
        return self._finished

    def accept_waveform(self, samples: np.ndarray) -> None:
        """Append (N,) samples (int16, or floats in int16 range, 16 kHz)."""
        if self._finished:
            raise RuntimeError("accept_waveform() after input_finished(): start a new FbankStream")
        x = _as_float_samples(samples)
        if x.shape[0]:
            self._fbank.accept_waveform(SAMPLE_RATE, x)

    def input_finished(self) -> None:
        """Mark the end of the audio; with snip_edges no further frame appears."""
        if not self._finished:
            self._fbank.input_finished()
            self._finished = True

    def get_frames(self, start: int, n: int) -> np.ndarray:
        """Frames [start, start + n) by absolute index, without removing them.

        Returns:
            (n, 80) float32.
        """
        if start < self._first or n < 0 or start + n > self.num_frames_ready:
            raise IndexError(
                f"frames [{start}, {start + n}) not available: held frames are [{self._first}, {self.num_frames_ready})"
            )
        out = np.empty((n, NUM_MEL_BINS), dtype=np.float32)
        for i in range(n):
            out[i] = self._fbank.get_frame(start + i)
        return out

    def drop_frames(self, n: int) -> None:
        """Free the ``n`` oldest held frames."""
        if n < 0 or n > self.num_frames_available:
            raise IndexError(f"cannot drop {n} frames: {self.num_frames_available} held")
        if n:
            self._fbank.pop(n)
            self._first += n

    def pop_frames(self, n: int) -> np.ndarray:
        """Remove and return the ``n`` oldest held frames, (n, 80) float32."""
        frames = self.get_frames(self._first, n)
        self.drop_frames(n)
        return frames
