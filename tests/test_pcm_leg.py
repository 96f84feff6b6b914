"""``rtp.pcm_leg.PcmLeg``: the doors' one leg. 8 kHz reaches the sink at 16 kHz as the shared
upsampler makes it, 16 kHz as it came; the first audio fixes the rate; ``finish`` delivers
what the stream held and ends the sink's input."""

from __future__ import annotations

import numpy as np
import pytest

from asr_common.audio import CountingPcmSink
from rtp.pcm_leg import PcmLeg
from rtp.resample import upsample_recording

TONE = (1000 * np.sin(np.arange(800) / 5)).astype(np.int16)  # 100 ms at 8 kHz


def test_8khz_audio_reaches_the_sink_upsampled_whole_after_finish() -> None:
    sink = CountingPcmSink(keep=True)
    leg = PcmLeg(sink)
    assert leg.received_ms == 0 and leg.rate is None
    for start in range(0, len(TONE), 160):
        leg.submit(TONE[start : start + 160], 8000)
    assert leg.rate == 8000 and leg.samples == 800 and leg.received_ms == 100
    leg.finish()
    assert sink.finished == 1
    np.testing.assert_array_equal(sink.pcm, upsample_recording(TONE).astype(np.int16))


def test_16khz_audio_passes_as_it_came() -> None:
    sink = CountingPcmSink(keep=True)
    leg = PcmLeg(sink)
    leg.submit(TONE, 16000)
    np.testing.assert_array_equal(sink.pcm, TONE)
    assert leg.received_ms == 50
    leg.finish()
    assert sink.finished == 1 and sink.samples == len(TONE)


def test_the_first_audio_fixes_the_rate_and_a_leg_without_audio_still_ends() -> None:
    leg = PcmLeg(CountingPcmSink())
    leg.submit(TONE, 16000)
    with pytest.raises(ValueError, match="leg audio changed from 16000 to 8000 Hz"):
        leg.submit(TONE, 8000)
    with pytest.raises(ValueError, match="no resampler from 44100 Hz"):
        PcmLeg(CountingPcmSink()).submit(TONE, 44100)
    silent = CountingPcmSink()
    PcmLeg(silent).finish()
    assert silent.finished == 1 and silent.samples == 0
