"""``PcmLeg``: a leg whose peer sends linear PCM (AudioSocket, WebSocket), on its way to its sink.

The doors beside SIP receive 16-bit samples at 8 or 16 kHz; the sink takes them at
``SAMPLE_RATE``. A ``PcmLeg`` is the sink, the stream that brings the peer's rate to it
(``resample.model_rate_stream``: 8 kHz through the loop's shared upsampler), how much has
come, and the one ``finish`` that flushes the stream and ends the sink's input.
"""

from __future__ import annotations

import numpy as np

from asr_common.audio import PcmSink
from rtp.resample import PassThroughStream, UpsamplerStream, model_rate_stream


class PcmLeg:
    """One leg's way from the peer's int16 samples to its sink at ``SAMPLE_RATE``.

    The first ``submit`` fixes the leg's ``rate`` (Hz) and makes its stream, so a door that
    learns the rate from the first audio (AudioSocket) and one told it up front (WebSocket)
    are served alike; ``samples`` counts what came, at that rate."""

    def __init__(self, sink: PcmSink) -> None:
        self.sink = sink
        self.rate: int | None = None
        self.samples = 0
        self._stream: UpsamplerStream | PassThroughStream | None = None

    @property
    def received_ms(self) -> int:
        """Milliseconds of audio received so far (0 before the first)."""
        return self.samples * 1000 // self.rate if self.rate else 0

    def submit(self, samples: np.ndarray, rate: int) -> None:
        """Take int16 samples (N,) at ``rate`` Hz. ValueError for a rate the door cannot bring
        to ``SAMPLE_RATE``, or one other than the leg's first."""
        if self._stream is None:
            self._stream = model_rate_stream(rate, self.sink.accept_waveform)
            self.rate = rate
        elif rate != self.rate:
            raise ValueError(f"leg audio changed from {self.rate} to {rate} Hz")
        self._stream.submit(samples)
        self.samples += len(samples)

    def finish(self) -> None:
        """Deliver what the stream holds and end the sink's input; call once, when the leg ends."""
        if self._stream is not None:
            self._stream.flush()
        self.sink.input_finished()
