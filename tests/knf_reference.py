"""kaldi-native-fbank, the fbank implementation of record (the golden fixture's manifest), as
the tests' reference for `asr_core.frontend`, which computes the same features in torch."""

from __future__ import annotations

import kaldi_native_fbank as knf
import numpy as np


def knf_options() -> knf.FbankOptions:
    """kaldi-native-fbank options equal to WeNet's ``kaldi.fbank`` call."""
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = 16000
    opts.frame_opts.frame_length_ms = 25.0
    opts.frame_opts.frame_shift_ms = 10.0
    opts.frame_opts.dither = 0.0
    opts.frame_opts.preemph_coeff = 0.97
    opts.frame_opts.remove_dc_offset = True
    opts.frame_opts.window_type = "povey"
    opts.frame_opts.round_to_power_of_two = True
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = 80
    opts.mel_opts.low_freq = 20.0
    opts.mel_opts.high_freq = 0.0
    opts.energy_floor = 0.0
    opts.use_energy = False
    opts.raw_energy = True
    opts.htk_compat = False
    opts.use_log_fbank = True
    opts.use_power = True
    return opts


def knf_fbank(samples: np.ndarray, opts: knf.FbankOptions | None = None) -> np.ndarray:
    """(T, 80) float32 features of a whole 16 kHz waveform (int16 values)."""
    fbank = knf.OnlineFbank(opts or knf_options())
    fbank.accept_waveform(16000, np.asarray(samples, dtype=np.float32).tolist())
    fbank.input_finished()
    if not fbank.num_frames_ready:
        return np.zeros((0, 80), dtype=np.float32)
    return np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)]).astype(np.float32)
