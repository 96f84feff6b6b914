"""One leg's audio after the reorder buffer: frames -> decoded PCM -> batches -> 16 kHz PCM.

The codecs come from `rtp.codecs`. What a codec's decoder yields at 8 kHz is queued for the
8 -> 16 kHz resampler (`rtp.resample`: the event loop's shared upsampler by default); what it
yields at 16 kHz goes to the output as it is (resampled down for a model at 8 kHz). Both are
handed on in batches of `batch_ms`, so the per-batch costs (decode, resampler submission, the
sink call) are paid once per few packets. A codec with a decode table (G.711) is queued as
payload bytes and decoded once per batch, or by the shared upsampler together with every
other leg's bytes; the C receive path hands over such bytes too (`queue_in_order`).

Stateful decoders (G.722) are made at a stream's first packet and made anew for a new stream
(`new_stream`, after an SSRC change) or a codec switch (`set_codecs` with another map), as the
sender's encoder is. Sans-IO apart from the resampler choice: no socket, no timer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from asr_common.audio import SAMPLE_RATE, TELEPHONE_RATE
from rtp.codecs import Codec, Decoder
from rtp.jitter import Frame, FrameKind
from rtp.resample import PassThroughStream, SoxrStream, UpsamplerStream, loop_stream

RESAMPLERS = ("halfband", "soxr", "none")
Deliver = Callable[[np.ndarray], None]


def upsampler_stream(kind: str, deliver: Deliver) -> UpsamplerStream | SoxrStream | PassThroughStream:
    """`halfband`: a stream of the running loop's shared upsampler (without a running loop,
    one that upsamples at once); `soxr`: a per-leg soxr stream; `none`: 8 kHz as decoded, for
    a model whose front end runs at 8 kHz. ValueError otherwise."""
    if kind == "soxr":
        return SoxrStream(deliver)
    if kind == "none":
        return PassThroughStream(deliver)
    if kind != "halfband":
        raise ValueError(f"unknown resampler {kind!r}; use one of {', '.join(RESAMPLERS)}")
    return loop_stream(deliver)


class AudioDecoding:
    """Decodes one leg's frames and hands 16 kHz int16 PCM (8 kHz with `resampler="none"`) to
    `deliver` in batches of `batch_ms` (0: every frame). ValueError for an unknown resampler.

    `resampler`: "halfband" hands each 8 kHz batch to the event loop's
    `rtp.resample.SharedUpsampler`, which upsamples the batches of all legs ready in the same
    pass in one matrix product and calls `deliver` with each leg's output; "soxr" runs a soxr
    stream per leg. Per-batch costs are paid once per 4 packets at 80 ms. The price is
    latency: a sample waits (batch - packet) / 2 on average for its batch, 30 ms at 80 ms
    (10 ms at 40 ms), plus the resampler's lag (2.5 ms for halfband, 63 ms on average for
    soxr; see `rtp.resample`); the engine consumes 160-640 ms chunks, so it hardly sees it.
    """

    def __init__(self, deliver: Deliver, *, resampler: str, batch_ms: int) -> None:
        self._deliver = deliver
        self._upsampler = upsampler_stream(resampler, deliver)
        self._narrow = resampler == "none"
        self._downsampler: SoxrStream | None = None
        self._batch_samples = batch_ms * TELEPHONE_RATE // 1000  # at 8 kHz
        self._wide_batch_samples = batch_ms * SAMPLE_RATE // 1000  # at 16 kHz
        self._codecs: dict[int, Codec] = {}
        self._decoders: dict[int, Decoder] = {}
        # 8 kHz audio waiting for the next resampler call, in order: payload bytes of one
        # table codec not yet decoded (`_raw`, decoded with `_raw_table`), after decoded PCM
        # (`_pcm`); `_queued_samples` counts both.
        self._raw: list[bytes] = []
        self._raw_table: np.ndarray | None = None
        self._pcm: list[np.ndarray] = []
        self._queued_samples = 0
        # 16 kHz audio waiting for its batch, and its length in samples.
        self._wide_pcm: list[np.ndarray] = []
        self._wide_samples = 0

    @property
    def batch_bytes(self) -> int:
        """A batch's payload bytes for the codecs of the C receive path (1 byte per 8 kHz sample)."""
        return self._batch_samples

    @property
    def queued_samples(self) -> int:
        """8 kHz samples waiting for the resampler (what a batch in progress holds)."""
        return self._queued_samples

    def set_codecs(self, codecs: dict[int, Codec]) -> None:
        """The audio codecs by payload type (a new SDP answer); another map than before is a
        codec switch: streams after it start with fresh decoders."""
        if codecs != self._codecs:
            self._decoders = {}
        self._codecs = codecs

    @property
    def stateful(self) -> bool:
        """Whether a decoder holds a stream's state (so a new stream needs `new_stream`)."""
        return bool(self._decoders)

    def new_stream(self) -> None:
        """The sender's stream restarted (a new SSRC): its next payloads start fresh decoders."""
        self._decoders = {}

    def play_in_order(self, codec: Codec, payload_type: int, payload: bytes) -> None:
        """One in-order audio packet (the common case, without a `Frame`; for a table codec
        this runs for every packet that leaves the C path, so it stays short)."""
        table = codec.decode_table
        if table is None or self._wide_pcm:
            if table is None:
                self._queue_decoded(codec, payload_type, payload)
            else:
                self._queue_raw(table, payload)
            self._hand_on_full_batches()
            return
        if table is not self._raw_table:
            self._decode_raw()
            self._raw_table = table
        self._raw.append(payload)
        self._queued_samples += len(payload)
        if self._queued_samples >= self._batch_samples:
            self._resample_queued()

    def queue_in_order(self, payloads: bytes) -> None:
        """Payload bytes the C receive path took, of the table codec of the last in-order packet."""
        self._raw.append(payloads)
        self._queued_samples += len(payloads)
        if self._queued_samples >= self._batch_samples:
            self._resample_queued()

    def play(self, frames: list[Frame]) -> None:
        """Queue the frames' audio (silence for SILENCE frames and payload types no longer
        known, as 8 kHz samples for the latter) and hand on every full batch."""
        for frame in frames:
            codec = self._codecs.get(frame.payload_type)
            if codec is None or frame.kind is FrameKind.SILENCE:
                self._queue_silence(codec, frame.samples)
            elif codec.decode_table is not None:
                self._queue_raw(codec.decode_table, frame.payload)
            else:
                self._queue_decoded(codec, frame.payload_type, frame.payload)
        self._hand_on_full_batches()

    def flush(self) -> None:
        """Hand on everything queued and the resamplers' tails (the leg closes)."""
        self._resample_queued()
        self._upsampler.flush()
        self._emit_wideband()
        if self._downsampler is not None:
            self._downsampler.flush()

    def _hand_on_full_batches(self) -> None:
        if self._queued_samples >= self._batch_samples:
            self._resample_queued()
        if self._wide_samples >= self._wide_batch_samples:
            self._emit_wideband()

    def _queue_raw(self, table: np.ndarray, payload: bytes) -> None:
        """Queue a table codec's payload bytes, decoded later with the whole batch."""
        if self._wide_pcm:
            self._emit_wideband()
        if table is not self._raw_table:
            self._decode_raw()
            self._raw_table = table
        self._raw.append(payload)
        self._queued_samples += len(payload)

    def _queue_silence(self, codec: Codec | None, ticks: int) -> None:
        if codec is not None and codec.sample_rate == SAMPLE_RATE:
            self._queue_wideband(np.zeros(codec.samples(ticks), dtype=np.int16))
            return
        samples = codec.samples(ticks) if codec is not None else ticks
        self._queue_narrowband(np.zeros(samples, dtype=np.int16))

    def _queue_decoded(self, codec: Codec, payload_type: int, payload: bytes) -> None:
        """Decode one payload with the stream's decoder for `payload_type` and queue its PCM."""
        decoder = self._decoders.get(payload_type)
        if decoder is None:
            if codec.make_decoder is None:
                raise ValueError(f"audio codec {codec.name} has no decoder in rtp.codecs.CODECS")
            decoder = self._decoders[payload_type] = codec.make_decoder()
        pcm = decoder.decode(payload)
        if codec.sample_rate == SAMPLE_RATE:
            self._queue_wideband(pcm)
        else:
            self._queue_narrowband(pcm)

    def _queue_narrowband(self, pcm: np.ndarray) -> None:
        """Queue 8 kHz PCM; wideband audio queued before it is handed on first."""
        if self._wide_pcm:
            self._emit_wideband()
        self._decode_raw()
        self._pcm.append(pcm)
        self._queued_samples += len(pcm)

    def _queue_wideband(self, pcm: np.ndarray) -> None:
        """Queue 16 kHz PCM; narrowband audio queued before it goes to the resampler first."""
        if self._raw or self._pcm:
            self._resample_queued()
        self._wide_pcm.append(pcm)
        self._wide_samples += len(pcm)

    def _emit_wideband(self) -> None:
        """Hand the queued 16 kHz audio on (resampled to 8 kHz for a model at 8 kHz)."""
        pieces = self._wide_pcm
        if not pieces:
            return
        pcm = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        self._wide_pcm, self._wide_samples = [], 0
        if not self._narrow:
            self._deliver(pcm)
            return
        if self._downsampler is None:
            self._downsampler = SoxrStream(self._deliver, SAMPLE_RATE, TELEPHONE_RATE)
        self._downsampler.submit(pcm)

    def _decode_raw(self) -> None:
        """Decode the queued table-codec bytes with one lookup (`take` is cheaper than indexing)."""
        raw = self._raw
        if not raw or self._raw_table is None:
            return
        data = raw[0] if len(raw) == 1 else b"".join(raw)
        self._pcm.append(self._raw_table.take(np.frombuffer(data, dtype=np.uint8)))
        self._raw = []

    def _resample_queued(self) -> None:
        """One resampler submission per batch. A batch of table-codec bytes only (the usual
        case) is submitted undecoded: the shared upsampler decodes all legs' bytes at once."""
        if not self._pcm and self._raw and self._raw_table is not None:
            raw = self._raw
            self._upsampler.submit_g711(raw[0] if len(raw) == 1 else b"".join(raw), self._raw_table)
            self._raw = []
            self._queued_samples = 0
            return
        self._decode_raw()
        pcm_pieces = self._pcm
        if not pcm_pieces:
            return
        pcm = pcm_pieces[0] if len(pcm_pieces) == 1 else np.concatenate(pcm_pieces)
        self._pcm = []
        self._queued_samples = 0
        self._upsampler.submit(pcm)
