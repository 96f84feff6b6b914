"""Kaldi fbank, computed as WeNet's front end computes it, for many streams at once.

The options are the model's own (`FrontendConfig`, from train.yaml's ``dataset_conf``); the
defaults, described below, are WeNet's 16 kHz 80-bin front end.

WeNet calls ``torchaudio.compliance.kaldi.fbank(waveform * (1 << 15), num_mel_bins=80,
frame_length=25, frame_shift=10, dither=0.0, energy_floor=0.0, sample_frequency=16000)``;
kaldi-native-fbank with the same options is the implementation of record (see the golden
fixture's manifest, and tests/test_frontend.py, which holds this module to it: on log mel
energies of about 5-25, a mean difference of ~1e-5, the largest ones, up to a few 1e-3, in
bins with little energy). Input samples are int16 values, as int16 or as floats
in int16 range. Frames are 25 ms long (400 samples) every 10 ms (160 samples), snip_edges: a
waveform of N samples gives ``1 + (N - 400) // 160`` frames (0 if N < 400).

Each frame goes through Kaldi's steps as tensor operations over a whole batch of frames:
remove the frame's mean (DC), pre-emphasis 0.97 (the first sample against itself), Povey
window, 512-point real FFT, power spectrum, 80 triangular mel filters from 20 Hz to 8 kHz
(Kaldi's mel scale, 1127 ln(1 + f/700), on FFT bins 0-255), natural log floored at float32
epsilon. So the engine computes the chunk features of every stream in a batch with one call
(`fbank_windows`), on the engine's device, instead of one extractor call per stream: on the
2-core CPU 2-3x less time per stream-chunk than kaldi-native-fbank, and on a GPU the cost
of ten thousand streams' features is one small kernel sequence. A frame's values do not depend
on the batch it is computed in (checked bit for bit in the tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from asr_common.audio import SAMPLE_RATE

NUM_MEL_BINS = 80
FRAME_LENGTH_SAMPLES = 400
FRAME_SHIFT_SAMPLES = 160
FFT_SIZE = 512
PREEMPHASIS = 0.97
LOW_FREQ_HZ = 20.0
POVEY_POWER = 0.85
# Frames computed per call by `FbankStream.get_frames` (a whole file is cut into such calls).
MAX_FRAMES_PER_CALL = 4096
INITIAL_BUFFER_SAMPLES = 16_000
"""A stream's sample buffer to start with (1 s at 16 kHz; it doubles when it must hold more)."""


@dataclass(frozen=True)
class FrontendConfig:
    """A model's own fbank options (WeNet's ``dataset_conf.fbank_conf`` and resample rate).

    The defaults are WeNet's 16 kHz, 80-bin, 25 ms / 10 ms front end; an 8 kHz telephony model
    sets ``sample_rate=8000`` and takes G.711 audio as it arrives. Dither is not an option:
    inference always runs without it (WeNet's training dither would make decoding random).
    """

    sample_rate: int = SAMPLE_RATE  # Hz
    num_mel_bins: int = NUM_MEL_BINS
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0

    def __post_init__(self) -> None:
        if self.sample_rate <= 0 or self.num_mel_bins <= 0:
            raise ValueError(f"sample rate and mel bins must be > 0, got {self.sample_rate} Hz, {self.num_mel_bins}")
        if self.frame_shift_ms <= 0 or self.frame_length_ms <= 0:
            raise ValueError("frame length and shift must be > 0 ms")
        if self.frame_length_samples < 2 or self.frame_shift_samples < 1:
            raise ValueError(
                f"frames of {self.frame_length_ms} ms every {self.frame_shift_ms} ms at {self.sample_rate} Hz "
                "are shorter than two samples"
            )
        if self.sample_rate / 2 <= LOW_FREQ_HZ:
            raise ValueError(f"sample rate {self.sample_rate} Hz leaves no band above {LOW_FREQ_HZ} Hz")

    @property
    def frame_length_samples(self) -> int:
        """Kaldi's ``window_size``: samples per frame (truncated, as Kaldi does)."""
        return int(self.sample_rate * 0.001 * self.frame_length_ms)

    @property
    def frame_shift_samples(self) -> int:
        """Kaldi's ``window_shift``: samples between frame starts."""
        return int(self.sample_rate * 0.001 * self.frame_shift_ms)

    @property
    def fft_size(self) -> int:
        """The frame length rounded up to a power of two (Kaldi's round_to_power_of_two)."""
        return 1 << (self.frame_length_samples - 1).bit_length()


DEFAULT_FRONTEND = FrontendConfig()


def encoder_frame_ms(config: FrontendConfig, subsampling: int) -> int:
    """Duration of one encoder frame in ms (``subsampling`` fbank shifts); whole ms only, since
    chunk sizes, endpoints and timestamps are counted in whole ms."""
    ms = config.frame_shift_ms * subsampling
    if ms != int(ms):
        raise ValueError(f"frame shift {config.frame_shift_ms} ms x {subsampling} is not a whole number of ms")
    return int(ms)


def _mel(hz: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log1p(np.asarray(hz, dtype=np.float64) / 700.0)


def mel_filterbank(config: FrontendConfig = DEFAULT_FRONTEND) -> torch.Tensor:
    """(fft_size // 2 + 1, num_mel_bins) float32: Kaldi's triangular filters over the power
    spectrum's bins from 20 Hz to Nyquist (the Nyquist bin gets no weight, as in Kaldi)."""
    bins = config.fft_size // 2
    low, high = _mel(LOW_FREQ_HZ), _mel(config.sample_rate / 2)
    step = (high - low) / (config.num_mel_bins + 1)
    bin_mels = _mel(np.arange(bins) * config.sample_rate / config.fft_size)
    weights = np.zeros((bins + 1, config.num_mel_bins), dtype=np.float32)
    for m in range(config.num_mel_bins):
        left, center, right = low + m * step, low + (m + 1) * step, low + (m + 2) * step
        rising = (bin_mels - left) / (center - left)
        falling = (right - bin_mels) / (right - center)
        weights[:bins, m] = np.maximum(0.0, np.minimum(rising, falling))
    return torch.from_numpy(weights)


def povey_window(config: FrontendConfig = DEFAULT_FRONTEND) -> torch.Tensor:
    """(frame_length_samples,) float32: Kaldi's "povey" window, a Hann window to the 0.85."""
    length = config.frame_length_samples
    n = np.arange(length)
    hann = 0.5 - 0.5 * np.cos(2 * math.pi * n / (length - 1))
    return torch.from_numpy(np.power(hann, POVEY_POWER).astype(np.float32))


_LOG_FLOOR = float(np.finfo(np.float32).eps)
_constants: dict[tuple[FrontendConfig, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _constants_on(config: FrontendConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    found = _constants.get((config, device))
    if found is None:
        window, mel = povey_window(config), mel_filterbank(config)
        found = _constants[(config, device)] = (window.to(device), mel.to(device, torch.float64))
    return found


def fbank_frames(frames: torch.Tensor, config: FrontendConfig = DEFAULT_FRONTEND) -> torch.Tensor:
    """frames: (..., frame_length_samples) float32 samples, one frame per row ->
    (..., num_mel_bins) log mel energies."""
    window, mel = _constants_on(config, frames.device)
    x = frames - frames.mean(dim=-1, keepdim=True)
    x = x - PREEMPHASIS * torch.cat([x[..., :1], x[..., :-1]], dim=-1)
    spectrum = torch.fft.rfft(x * window, n=config.fft_size)
    power = spectrum.real.square() + spectrum.imag.square()
    # The filterbank sum in float64: float32 matrix products of 1-3 rows take another kernel
    # and round differently, and a frame must not depend on how many frames share the call.
    energies = (power.double() @ mel).float()
    return torch.log(torch.clamp(energies, min=_LOG_FLOOR))


def window_samples(num_frames: int, config: FrontendConfig = DEFAULT_FRONTEND) -> int:
    """Samples that `num_frames` consecutive frames cover."""
    if num_frames <= 0:
        return 0
    return config.frame_length_samples + (num_frames - 1) * config.frame_shift_samples


def fbank_windows(samples: torch.Tensor, num_frames: int, config: FrontendConfig = DEFAULT_FRONTEND) -> torch.Tensor:
    """samples: (B, window_samples(num_frames)) float32, each row the audio of `num_frames`
    consecutive frames -> (B, num_frames, num_mel_bins)."""
    frames = samples.unfold(-1, config.frame_length_samples, config.frame_shift_samples)[:, :num_frames]
    return fbank_frames(frames, config)


def num_fbank_frames(num_samples: int, config: FrontendConfig = DEFAULT_FRONTEND) -> int:
    """Frames that ``num_samples`` samples (at the config's rate) give with snip_edges."""
    if num_samples < config.frame_length_samples:
        return 0
    return 1 + (num_samples - config.frame_length_samples) // config.frame_shift_samples


def _mono(samples: np.ndarray) -> np.ndarray:
    """``samples`` as an (N,) array (not copied; the stream copies what it keeps)."""
    x = np.asarray(samples)
    if x.ndim != 1:
        raise ValueError(f"expected mono samples of shape (N,), got shape {x.shape}")
    return x


def compute_fbank(samples: np.ndarray, config: FrontendConfig = DEFAULT_FRONTEND) -> np.ndarray:
    """Fbank of a whole waveform at ``config.sample_rate`` (16 kHz by default).

    Args:
        samples: (N,) int16 samples, or floats in int16 range.
    Returns:
        (T, num_mel_bins) float32 log mel energies, T = ``num_fbank_frames(N, config)``.
    """
    stream = FbankStream(config)
    stream.accept_waveform(samples)
    stream.input_finished()
    return stream.pop_frames(stream.num_frames_ready)


class FbankStream:
    """Incremental fbank of one audio stream, identical to :func:`compute_fbank` on the whole.

    Waveform pieces of any size (0 and 1 samples included) go in; a frame is ready as soon as
    its 25 ms window is complete. Frame indices are absolute (frame 0 is the stream's first
    frame). The stream keeps samples, not frames: `get_frames` computes frames when asked
    (`window` hands out the samples for a caller that batches many streams), and samples no
    longer needed by a held frame are freed by `pop_frames` / `drop_frames`, so memory stays
    bounded for streams of any length.
    """

    def __init__(self, config: FrontendConfig = DEFAULT_FRONTEND) -> None:
        self.config = config
        # Held samples are self._buffer[self._begin:self._end], absolute indices from
        # self._buffer_start: received samples are written behind them and dropped ones skipped,
        # and only when the buffer's end is reached do the held ones move to its front (or to a
        # larger buffer), so that a chunk costs no copy of the samples it keeps.
        self._buffer = np.zeros(INITIAL_BUFFER_SAMPLES, dtype=np.float32)
        self._begin = 0
        self._end = 0
        self._buffer_start = 0  # absolute index of self._buffer[self._begin]
        self._total = 0  # samples received
        self._first = 0  # absolute index of the oldest frame still held
        self._finished = False

    @property
    def num_frames_ready(self) -> int:
        """Absolute count of frames computable so far (popped ones included)."""
        return num_fbank_frames(self._total, self.config)

    @property
    def first_available(self) -> int:
        """Absolute index of the oldest frame still held."""
        return self._first

    @property
    def num_frames_available(self) -> int:
        """Frames ready and not yet popped."""
        return self.num_frames_ready - self._first

    @property
    def finished(self) -> bool:
        return self._finished

    def accept_waveform(self, samples: np.ndarray) -> None:
        """Append (N,) samples (int16, or floats in int16 range, at ``config.sample_rate``)."""
        if self._finished:
            raise RuntimeError("accept_waveform() after input_finished(): start a new FbankStream")
        x = _mono(samples)
        count = x.shape[0]
        if count:
            self._make_room(count)
            self._buffer[self._end : self._end + count] = x  # converted to float32 on the way
            self._end += count
            self._total += count

    def input_finished(self) -> None:
        """Mark the end of the audio; with snip_edges no further frame appears."""
        self._finished = True

    def window(self, start: int, n: int) -> np.ndarray:
        """The samples of frames [start, start + n), (window_samples(n),) float32: a view, valid
        until the next ``accept_waveform`` (copy it to keep it)."""
        if start < self._first or n < 0 or start + n > self.num_frames_ready:
            raise IndexError(
                f"frames [{start}, {start + n}) not available: held frames are [{self._first}, {self.num_frames_ready})"
            )
        begin = self._begin + start * self.config.frame_shift_samples - self._buffer_start
        return self._buffer[begin : begin + window_samples(n, self.config)]

    def get_frames(self, start: int, n: int) -> np.ndarray:
        """Frames [start, start + n) by absolute index, without removing them: (n, num_mel_bins)
        float32."""
        config = self.config
        samples = torch.from_numpy(self.window(start, n))
        out = np.empty((n, config.num_mel_bins), dtype=np.float32)
        for first in range(0, n, MAX_FRAMES_PER_CALL):  # bounded memory for hour-long files
            count = min(MAX_FRAMES_PER_CALL, n - first)
            begin = first * config.frame_shift_samples
            piece = samples[begin : begin + window_samples(count, config)]
            out[first : first + count] = fbank_windows(piece[None], count, config)[0].numpy()
        return out

    def drop_frames(self, n: int) -> None:
        """Free the ``n`` oldest held frames (and the samples only they needed)."""
        if n < 0 or n > self.num_frames_available:
            raise IndexError(f"cannot drop {n} frames: {self.num_frames_available} held")
        if not n:
            return
        self._first += n
        keep_from = self._first * self.config.frame_shift_samples - self._buffer_start
        if keep_from > 0:
            self._begin += keep_from
            self._buffer_start += keep_from

    def _make_room(self, count: int) -> None:
        """Room for ``count`` more samples behind the held ones: the held samples move to the
        buffer's front, or to a buffer twice as large where they would fill more than half of it."""
        if self._end + count <= self._buffer.shape[0]:
            return
        held = self._end - self._begin
        if 2 * (held + count) > self._buffer.shape[0]:
            larger = np.empty(max(2 * (held + count), 2 * self._buffer.shape[0]), dtype=np.float32)
            larger[:held] = self._buffer[self._begin : self._end]
            self._buffer = larger
        else:
            self._buffer[:held] = self._buffer[self._begin : self._end]  # numpy copies overlaps safely
        self._begin, self._end = 0, held

    def pop_frames(self, n: int) -> np.ndarray:
        """Remove and return the ``n`` oldest held frames, (n, num_mel_bins) float32."""
        frames = self.get_frames(self._first, n)
        self.drop_frames(n)
        return frames
