"""Streaming 8 kHz -> 16 kHz resampling: a half-band interpolation filter run for many
streams at once, as one matrix product per batch.

Why not one soxr stream per call leg: at 1000 legs soxr cost ~20 us per call (its per-stream
state falls out of the CPU caches between a leg's calls), about 5 us of every received packet
at 80 ms batches, a third of the whole receive path. Upsampling by 2 needs no general
resampler:
- every even output sample is an input sample (a half-band filter's even phase is a unit
  impulse), so only the odd outputs, halfway between two inputs, are computed;
- each odd output is a dot product of the 2R inputs around it with fixed taps (a windowed
  sinc: R = 20 taps per side, Kaiser beta 8). Response: flat to within 0.001 dB up to 3.4 kHz
  (the telephone band's top), -0.07 dB at 3.6 kHz, images above 4.6 kHz at least 82 dB down;
- the dot products of every stream that has a batch ready are one matrix product: each
  stream's samples, cut into overlapping windows of BLOCK + 2R - 1, times a banded
  (BLOCK + 2R - 1) x BLOCK matrix of the taps.

Output lags input by R input samples (2.5 ms), against 63 ms on average (115 ms at most)
for soxr's HQ fixed-ratio stream.

The same bits on every CPU, whatever the grouping: the taps are fixed point (integers, in
units of 2^-TAP_FRACTION_BITS) and the product runs in float64 on integer-valued operands.
Every product of an int16 sample and an integer tap is an integer below 2^15 * 2^24, and
every partial sum, in whatever order or blocking a BLAS kernel adds them (FMA or not, any
SIMD width, any row count), is an integer of magnitude at most 2^15 * sum|taps| < 2^53
(checked at import): float64 represents all of them exactly, so each odd output's
accumulator is the exact integer dot product, and one scaling by a power of two and one
round-half-to-even make the int16 sample. So any cutting into pieces, any batch of
streams, and any BLAS kernel (OpenBLAS's Haswell or SkylakeX ones, MKL) give the samples
one call on the whole signal gives: exactly 2 x the input's length in total, the last R
pairs coming from `flush()`. (A float32 product, as before, rounded its partial sums, so
its rounding depended on the kernel's blocking: 4 of 16,000 samples differed by 1 LSB
between piece sizes on an AVX2 CPU.) Rounding the taps to 2^-24 moves an output by at
most 2^15 * 40 * 2^-25 < 0.04 LSB before the final rounding, so the output is within
1 LSB of the float32 filter the bundled demo model was trained with.

`SharedUpsampler` is the batcher: one per event loop (`for_loop`), each leg holds one
`UpsamplerStream` from it. A stream's `submit()` queues its piece; the batch runs in a
callback scheduled at once on the loop (`call_soon`), so every leg that completed a piece in
the same poller pass shares one product. Without a loop, `submit()` runs at once.
`Upsampler` is one stream with a synchronous process/flush interface.

Where the optional extension `rtp._fastrtp` is built, `upsample_rows` runs its C loop instead
of the matrix product: the same exact integer sums (in another order, which exactness makes
irrelevant), the same scaling, rounding and clipping, so the same bits; it skips the band's
zero multiplications and the BLAS call's overhead. ASR_NATIVE_RESAMPLE=0 forces the numpy
path (A/B measurements, debugging).

The matrix products run on numpy's BLAS; the first `SharedUpsampler.for_loop` limits that BLAS
to one thread for the process (threadpoolctl): its worker threads would otherwise spin on the
second core after every product (measured: 31.7 against 14.4 us per packet at 1000 legs),
and the service's threads are planned without them.

`SoxrStream` keeps the older per-leg soxr HQ stream (`rtp.resampler: soxr`), with the same
submit/flush interface: its output for a piece comes at once, in soxr's own block sizes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Callable

import numpy as np
import soxr
from threadpoolctl import threadpool_limits

from asr_common.audio import SAMPLE_RATE, TELEPHONE_RATE

try:  # the same computation in C, where the optional extension was built (setup.py)
    from rtp._fastrtp import upsample_rows as _native_upsample_rows
except ImportError:  # pragma: no cover - depends on the build
    _native_upsample_rows = None
if os.environ.get("ASR_NATIVE_RESAMPLE", "1") == "0":  # the numpy path even where C is built (A/B, debugging)
    _native_upsample_rows = None

TAPS_PER_SIDE = 20
KAISER_BETA = 8.0
# Fixed-point scale of the taps: an integer tap t weighs t * 2^-TAP_FRACTION_BITS.
TAP_FRACTION_BITS = 24
# Odd outputs computed per matrix row: larger blocks waste fewer multiplications on the
# band's overlap ((BLOCK + 2R - 1) / BLOCK) but pad short pieces further.
BLOCK = 64
# Input samples a stream keeps from one piece for the next: the window of the first new
# output reaches this far back.
HISTORY = 2 * TAPS_PER_SIDE - 1

Deliver = Callable[[np.ndarray], None]

log = logging.getLogger(__name__)


def halfband_taps(taps_per_side: int = TAPS_PER_SIDE, beta: float = KAISER_BETA) -> np.ndarray:
    """The odd phase of a Kaiser-windowed half-band filter: 2 * taps_per_side weights for
    the inputs at offsets -R+0.5 ... R-0.5 from the output's position, summing to 1."""
    offsets = np.arange(2 * taps_per_side) - taps_per_side + 0.5
    window = np.i0(beta * np.sqrt(1.0 - (offsets / taps_per_side) ** 2)) / np.i0(beta)
    taps = np.sinc(offsets) * window
    return taps / taps.sum()


def fixed_point_taps(taps: np.ndarray, fraction_bits: int = TAP_FRACTION_BITS) -> np.ndarray:
    """int64 taps in units of 2^-fraction_bits; raises ValueError when an int16 signal's dot
    product with them could leave float64's exact integer range (2^53), the condition that
    makes the matrix product independent of summation order."""
    # Averaged with its mirror so that the fixed taps stay exactly symmetric (linear phase).
    fixed = np.rint((taps + taps[::-1]) * 2.0 ** (fraction_bits - 1)).astype(np.int64)
    bound = 2**15 * int(np.abs(fixed).sum())
    if bound >= 2**53:
        raise ValueError(f"taps at {fraction_bits} fraction bits can sum to {bound}, beyond float64's exact 2^53")
    return fixed


def _band_matrix(taps: np.ndarray, block: int) -> np.ndarray:
    """(block + len(taps) - 1, block) float64: column s holds the taps at rows s ... s + 2R - 1."""
    matrix = np.zeros((block + len(taps) - 1, block), dtype=np.float64)
    for column in range(block):
        matrix[column : column + len(taps), column] = taps
    return matrix


_TAPS = fixed_point_taps(halfband_taps())
_BAND = _band_matrix(_TAPS, BLOCK)
_OUTPUT_SCALE = 2.0**-TAP_FRACTION_BITS
_TAPS_FLOAT = np.ascontiguousarray(_TAPS, dtype=np.float64)  # the C loop's taps: exact integers


def upsample_rows(samples: np.ndarray, n: int) -> np.ndarray:
    """samples: float64 (G, HISTORY + n) holding int16 values, each row a stream's history
    then its n new 8 kHz samples -> int16 (G, 2n): for each new input position, the even
    output (an input sample, R - 1 positions into the row) and the odd output after it.
    Exact whatever G and the BLAS kernel (see the module docstring); the C loop, where built,
    gives the same bits."""
    rows = samples.shape[0]
    if _native_upsample_rows is not None:
        out = np.empty((rows, 2 * n), dtype=np.int16)
        _native_upsample_rows(np.ascontiguousarray(samples, dtype=np.float64), rows, n, _TAPS_FLOAT, _OUTPUT_SCALE, out)
        return out
    blocks = -(-n // BLOCK)
    width = blocks * BLOCK + HISTORY
    if samples.shape[1] < width:
        padded = np.zeros((rows, width), dtype=np.float64)
        padded[:, : samples.shape[1]] = samples
        samples = padded
    row_stride, column_stride = samples.strides
    windows = np.lib.stride_tricks.as_strided(
        samples,
        shape=(rows, blocks, BLOCK + HISTORY),
        strides=(row_stride, BLOCK * column_stride, column_stride),
        writeable=False,
    ).reshape(rows * blocks, BLOCK + HISTORY)
    odd = (windows @ _BAND).reshape(rows, blocks * BLOCK)[:, :n]
    out = np.empty((rows, 2 * n), dtype=np.int16)
    start = TAPS_PER_SIDE - 1
    out[:, 0::2] = samples[:, start : start + n]
    np.multiply(odd, _OUTPUT_SCALE, out=odd)
    np.rint(odd, out=odd)
    np.clip(odd, -32768, 32767, out=odd)
    out[:, 1::2] = odd
    return out


Coded = tuple[bytes, np.ndarray]
"""G.711 bytes and the int16 table that decodes them (`rtp.g711.DECODE_TABLES`)."""
Piece = np.ndarray | Coded


def _decoded(piece: Piece) -> np.ndarray:
    if isinstance(piece, np.ndarray):
        return piece
    data, table = piece
    return table.take(np.frombuffer(data, dtype=np.uint8))


def _piece_length(piece: Piece) -> int:
    return len(piece) if isinstance(piece, np.ndarray) else len(piece[0])


class UpsamplerStream:
    """One stream's filter state in a `SharedUpsampler`; output goes to `deliver`."""

    __slots__ = ("_deliver", "_finished", "_history", "_owner", "_pending", "_skip")

    def __init__(self, owner: SharedUpsampler, deliver: Deliver) -> None:
        self._owner = owner
        self._deliver = deliver
        self._history = np.zeros(HISTORY, dtype=np.float64)
        # Output pairs before the first input sample (the window sliding in over the zero
        # history): not delivered, so output stays exactly twice the input.
        self._skip = TAPS_PER_SIDE
        self._pending: list[Piece] | None = None
        self._finished = False

    def submit(self, samples: np.ndarray) -> None:
        """Queue int16 8 kHz samples; their 16 kHz output reaches `deliver` when the batch
        runs (at once without an event loop). RuntimeError after `flush()`."""
        self._queue(samples, len(samples))

    def submit_g711(self, data: bytes, table: np.ndarray) -> None:
        """Queue G.711 bytes with their decode table (one of `rtp.g711.DECODE_TABLES`): the
        batch decodes the pieces of all streams with the same table in one lookup."""
        self._queue((data, table), len(data))

    def _queue(self, piece: Piece, length: int) -> None:
        if self._finished:
            raise RuntimeError("UpsamplerStream.submit() called after flush()")
        if not length:
            return
        if self._pending is None:
            self._pending = [piece]
            self._owner._queue(self)
        else:
            self._pending.append(piece)

    def flush(self) -> None:
        """Deliver what is queued and the filter's tail now; the stream takes no more input."""
        if self._finished:
            return
        self._finished = True
        queued = self._take()
        tail = np.zeros(TAPS_PER_SIDE, dtype=np.int16)
        _run_group([self], [tail if queued is None else np.concatenate([_decoded(queued), tail])])

    def _take(self) -> Piece | None:
        """What is queued as one piece: G.711 bytes when all of it is bytes of one table."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        if len(pending) == 1:
            return pending[0]
        first = pending[0]
        if not isinstance(first, np.ndarray) and all(
            not isinstance(piece, np.ndarray) and piece[1] is first[1] for piece in pending
        ):
            return b"".join(piece[0] for piece in pending), first[1]
        return np.concatenate([_decoded(piece) for piece in pending])


def _run_group(streams: list[UpsamplerStream], pieces: list[Piece]) -> None:
    """Upsample pieces of one length (all arrays, or all G.711 bytes of one table), one per
    stream, in one product; deliver each stream's output. A deliver callback that raises is
    logged and does not stop the others."""
    n = _piece_length(pieces[0])
    samples = np.empty((len(streams), HISTORY + n), dtype=np.float64)
    samples[:, :HISTORY] = np.stack([stream._history for stream in streams])
    first = pieces[0]
    if isinstance(first, np.ndarray):
        samples[:, HISTORY:] = np.stack(pieces)  # type: ignore[arg-type]
    else:
        codes = np.frombuffer(b"".join(piece[0] for piece in pieces), dtype=np.uint8)
        samples[:, HISTORY:] = first[1].take(codes).reshape(len(streams), n)
    out = upsample_rows(samples, n)
    histories = samples[:, n : n + HISTORY].copy()
    for index, stream in enumerate(streams):
        stream._history = histories[index]
        row = out[index]
        if stream._skip:
            dropped = min(stream._skip, n)
            stream._skip -= dropped
            row = row[2 * dropped :]
            if not len(row):
                continue
        try:
            stream._deliver(row)
        except Exception:
            log.exception("an upsampler consumer failed; its output for this batch is lost")


_blas_limited = False


def _single_thread_blas() -> None:
    global _blas_limited
    if not _blas_limited:
        threadpool_limits(limits=1, user_api="blas")
        _blas_limited = True


_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SharedUpsampler] = weakref.WeakKeyDictionary()


class SharedUpsampler:
    """Runs the queued pieces of all its streams together, grouped by length."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._waiting: list[UpsamplerStream] = []
        self._scheduled: asyncio.Handle | None = None

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> SharedUpsampler:
        """The loop's shared upsampler, created on first use."""
        shared = _shared.get(loop)
        if shared is None:
            _single_thread_blas()
            shared = _shared[loop] = cls(loop)
        return shared

    def stream(self, deliver: Deliver) -> UpsamplerStream:
        return UpsamplerStream(self, deliver)

    def _queue(self, stream: UpsamplerStream) -> None:
        self._waiting.append(stream)
        if self._loop is None:
            self.run()
        elif self._scheduled is None:
            self._scheduled = self._loop.call_soon(self.run)

    def run(self) -> None:
        """Upsample every queued piece now (the scheduled callback)."""
        self._scheduled = None
        waiting, self._waiting = self._waiting, []
        groups: dict[tuple[int, int], tuple[list[UpsamplerStream], list[Piece]]] = {}
        for stream in waiting:
            piece = stream._take()
            if piece is None:  # flushed since it was queued
                continue
            table = 0 if isinstance(piece, np.ndarray) else id(piece[1])
            streams, pieces = groups.setdefault((_piece_length(piece), table), ([], []))
            streams.append(stream)
            pieces.append(piece)
        for streams, pieces in groups.values():
            _run_group(streams, pieces)


class Upsampler:
    """One stream, synchronously: 8 kHz int16 pieces in, 16 kHz int16 pieces out."""

    __slots__ = ("_out", "_stream")

    def __init__(self) -> None:
        self._out: list[np.ndarray] = []
        self._stream = SharedUpsampler().stream(self._out.append)

    def process(self, samples: np.ndarray) -> np.ndarray:
        """samples: int16, shape (N,) at 8 kHz -> int16 at 16 kHz (2N samples, R pairs fewer
        on the first call; those come later). RuntimeError after `flush()`."""
        if self._stream._finished:
            raise RuntimeError("Upsampler.process() called after flush(); create a new Upsampler")
        self._stream.submit(samples)
        return self._collect()

    def flush(self) -> np.ndarray:
        """The remaining output; afterwards the upsampler accepts no more input."""
        self._stream.flush()
        return self._collect()

    def _collect(self) -> np.ndarray:
        out = self._out[:]
        self._out.clear()
        if not out:
            return np.zeros(0, dtype=np.int16)
        return out[0] if len(out) == 1 else np.concatenate(out)


class SoxrStream:
    """One leg's soxr HQ stream (fixed ratio) behind the `UpsamplerStream` interface: output
    lags input by 63 ms on average and comes in soxr's blocks of ~60-120 ms. 8 -> 16 kHz by
    default; a leg receiving G.722 for a model at 8 kHz uses one from 16 to 8 kHz."""

    __slots__ = ("_deliver", "_finished", "_stream")

    def __init__(self, deliver: Deliver, in_rate: int = TELEPHONE_RATE, out_rate: int = SAMPLE_RATE) -> None:
        self._deliver = deliver
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16", quality="HQ")
        self._finished = False

    def submit(self, samples: np.ndarray) -> None:
        if self._finished:
            raise RuntimeError("SoxrStream.submit() called after flush()")
        out = self._stream.resample_chunk(samples)
        if len(out):
            self._deliver(out)

    def submit_g711(self, data: bytes, table: np.ndarray) -> None:
        self.submit(_decoded((data, table)))

    def flush(self) -> None:
        if self._finished:
            return
        self._finished = True
        out = self._stream.resample_chunk(np.zeros(0, dtype=np.int16), last=True)
        if len(out):
            self._deliver(out)


class PassThroughStream:
    """No resampling, behind the `UpsamplerStream` interface: for a model whose front end runs
    at 8 kHz, the decoded G.711 samples go to the sink as they are (no lag, no CPU)."""

    __slots__ = ("_deliver", "_finished")

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._finished = False

    def submit(self, samples: np.ndarray) -> None:
        if self._finished:
            raise RuntimeError("PassThroughStream.submit() called after flush()")
        if len(samples):
            self._deliver(np.asarray(samples, dtype=np.int16))

    def submit_g711(self, data: bytes, table: np.ndarray) -> None:
        self.submit(_decoded((data, table)))

    def flush(self) -> None:
        self._finished = True


def upsample_recording(pcm8k: np.ndarray) -> np.ndarray:
    """A whole 8 kHz int16 recording (N,) -> 16 kHz float32 (2N,) at int16 scale: the samples a
    call's leg hands the engine for the same audio (`Upsampler`, int16 rounding included).
    Test sets and the demo model's training features go through it, so they hear what calls do."""
    upsampler = Upsampler()
    pieces = [upsampler.process(np.asarray(pcm8k, dtype=np.int16)), upsampler.flush()]
    return np.concatenate(pieces).astype(np.float32)


def loop_stream(deliver: Deliver) -> UpsamplerStream:
    """A stream of the running loop's shared upsampler; without a running loop (tests, offline
    use), one that upsamples at once."""
    try:
        shared = SharedUpsampler.for_loop(asyncio.get_running_loop())
    except RuntimeError:
        shared = SharedUpsampler()
    return shared.stream(deliver)


def model_rate_stream(rate: int, deliver: Deliver) -> UpsamplerStream | PassThroughStream:
    """A stream of int16 pieces at ``rate`` Hz delivered at ``SAMPLE_RATE``, for a front door
    whose peer sends linear PCM: ``TELEPHONE_RATE`` through the shared half-band upsampler
    (``loop_stream``), ``SAMPLE_RATE`` as it is. ValueError for any other rate."""
    if rate == SAMPLE_RATE:
        return PassThroughStream(deliver)
    if rate != TELEPHONE_RATE:
        raise ValueError(f"no resampler from {rate} Hz; use {TELEPHONE_RATE} or {SAMPLE_RATE} Hz")
    return loop_stream(deliver)
