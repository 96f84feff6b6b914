"""One call leg's recognition state: audio inbox, features, utterance and cache slot.

A ``Stream`` is created by ``Engine.open_stream``. Producers (the RTP side, a file reader)
call ``accept_waveform`` / ``input_finished`` / ``close`` from any thread; those calls only
append to an inbox under a short lock and wake the engine. Everything else on this object
belongs to the engine's scheduler thread.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from asr_core.context_graph import ContextGraph
from asr_core.events import Event
from asr_core.frontend import DEFAULT_FRONTEND, FbankStream, FrontendConfig


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Per-stream recognition settings (a route or the caller picks them)."""

    chunk_ms: int = 160
    left_chunks: int = 8
    rescore: bool = True
    emit_unchanged_partials: bool = False
    stream_id: str | None = None
    context: ContextGraph | None = None  # hotwords biasing the finals' CTC search; None: none
    attention_beam: int | None = None  # finals' decoder proposals (joint; 0: rescore); None: the engine's
    # Under load the engine may run the stream at longer chunks up to this size (ms; None: its
    # own ``chunk_ms``, never degraded), keeping its attention window (asr_core/surge.py).
    max_chunk_ms: int | None = None
    surge_priority: int = 0  # higher: degraded later, restored sooner

    def chunk_frames(self, subsampling: int, frame_ms: int = 10) -> int:
        """Encoder frames per chunk: 160 ms -> 4 with 4x subsampling of 10 ms frames."""
        frames, rest = divmod(self.chunk_ms, subsampling * frame_ms)
        if rest or frames < 1:
            raise ValueError(f"chunk_ms {self.chunk_ms} is not a multiple of {subsampling * frame_ms} ms")
        return frames


def chunk_input_frames(chunk_frames: int, subsampling: int, right_context: int) -> int:
    """Fbank frames a full chunk of ``chunk_frames`` encoder frames reads (WeNet's window)."""
    return (chunk_frames - 1) * subsampling + right_context + 1


def chunk_output_frames(input_frames: int, subsampling: int, right_context: int) -> int:
    """Encoder frames that a chunk of ``input_frames`` fbank frames gives (at least
    ``right_context + 1``; a short last chunk gives fewer than a full one): the inverse of
    ``chunk_input_frames``."""
    return (input_frames - right_context - 1) // subsampling + 1


@dataclass(slots=True)
class UtteranceState:
    """Decoding state of the utterance in progress (reset at every endpoint)."""

    utterance_id: int = 0
    start_frame: int = 0  # encoder frame (stream time) where the utterance began
    offset: int = 0  # encoder frames emitted in this utterance (the model's offset)
    tokens: list[int] = field(default_factory=list)
    token_frames: list[int] = field(default_factory=list)  # encoder frame (utterance time) per token
    last_token: int = -1  # CTC greedy's previous frame label (for repeat collapsing)
    topk_values: list[np.ndarray] = field(default_factory=list)  # each (C, k)
    topk_ids: list[np.ndarray] = field(default_factory=list)  # each (C, k)
    encoder_out: list[torch.Tensor] = field(default_factory=list)  # each (C, D), on the engine's device
    trailing_frames: int = 0
    changed: bool = False

    def reset(self, next_start_frame: int) -> None:
        self.utterance_id += 1
        self.start_frame = next_start_frame
        self.offset = 0
        self.tokens = []
        self.token_frames = []
        self.last_token = -1
        self.topk_values = []
        self.topk_ids = []
        self.encoder_out = []
        self.trailing_frames = 0
        self.changed = False


class Stream:
    """A call leg being recognized. See the module docstring for the threading contract."""

    def __init__(
        self,
        stream_id: str,
        config: StreamConfig,
        slot: int,
        chunk_frames: int,
        subsampling: int,
        right_context: int,
        on_event: Callable[[Event], None],
        wake: Callable[[], None],
        frontend: FrontendConfig = DEFAULT_FRONTEND,
        ladder: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.stream_id = stream_id
        self.config = config
        self.slot = slot
        # (chunk ms, left chunks) it may run at, its own first (asr_core.surge.chunk_ladder).
        self.ladder = ladder or ((config.chunk_ms, config.left_chunks),)
        self.chunk_ms = config.chunk_ms  # in force: changes between chunks under load (``set_chunk``)
        self.chunk_frames = chunk_frames
        self.left_chunks = config.left_chunks
        self.degraded_since = 0.0  # monotonic time it left its own chunk size; 0 while at it
        self.on_event = on_event
        self._wake = wake
        self._lock = threading.Lock()
        self._inbox: list[np.ndarray] = []
        self._input_finished = False
        self._close_requested = False
        self.input_end_time = 0.0  # monotonic time of input_finished()/close(), 0 before
        self.done = threading.Event()  # set once the last Final (if any) has been emitted

        # Arrival log: (total samples received after this piece, monotonic time of hand-off).
        self._arrivals: deque[tuple[int, float]] = deque()
        self._samples_in = 0

        # Scheduler-thread state.
        self.fbank = FbankStream(frontend)
        self.frames_consumed = 0  # fbank frames (stream time) already behind the next chunk's start
        self.chunk_start = 0  # fbank frame (stream time) where the chunk taken last began
        self._subsampling = subsampling
        self._right_context = right_context
        self.stride = subsampling * chunk_frames  # fbank frames per chunk
        self.window = chunk_input_frames(chunk_frames, subsampling, right_context)  # fbank frames per chunk input
        self.context = right_context + 1  # fewest fbank frames that yield one encoder frame
        self.utterance = UtteranceState()
        self.noise_floor = math.inf  # log power; see asr_core.endpoint.loud_frames (all utterances)
        self._seq = itertools.count(1)  # shared by the scheduler (partials) and the finalizer (finals)
        self.finishing = False  # input finished and drained into the fbank
        self.closing = False
        self.ready_since = 0.0

    # -- producer side (any thread) -------------------------------------------------

    @property
    def cache_frames(self) -> int:
        """Encoder frames of attention cache this stream keeps (its cache slot's window)."""
        return self.chunk_frames * self.left_chunks

    def accept_waveform(self, samples: np.ndarray) -> None:
        """Queue 16 kHz mono PCM (int16, or float in int16 range) of any length; never blocks on the engine."""
        if samples.ndim != 1:
            raise ValueError(f"expected mono samples (1-D), got shape {samples.shape}")
        if samples.size == 0:
            return
        now = time.monotonic()
        with self._lock:
            if self._input_finished:
                raise RuntimeError(f"stream {self.stream_id}: audio after input_finished/close")
            self._inbox.append(samples)
            self._samples_in += samples.size
            self._arrivals.append((self._samples_in, now))
        self._wake()

    @property
    def received_ms(self) -> int:
        """Audio handed to the stream so far, ms (all of it: the encoder frames cover up to one
        chunk and the fbank window less)."""
        with self._lock:
            return self._samples_in * 1000 // self.fbank.config.sample_rate

    def input_finished(self) -> None:
        """No more audio: decode what is buffered, emit the last Final, then release the slot."""
        with self._lock:
            self._input_finished = True
            self.input_end_time = self.input_end_time or time.monotonic()
        self._wake()

    def close(self) -> None:
        """The call ended: decode what was received, emit the Final, release the slot."""
        with self._lock:
            self._close_requested = True
            self._input_finished = True
            self.input_end_time = self.input_end_time or time.monotonic()
        self._wake()

    # -- scheduler side -------------------------------------------------------------

    def drain_inbox(self) -> None:
        """Move queued audio into the feature extractor; note input end and close requests."""
        with self._lock:
            pieces, self._inbox = self._inbox, []
            finished = self._input_finished
            self.closing = self._close_requested
        for piece in pieces:
            self.fbank.accept_waveform(piece)
        if finished and not self.finishing:
            self.fbank.input_finished()
            self.finishing = True

    def arrival_time_of_sample(self, sample_index: int) -> float:
        """Monotonic time the piece holding ``sample_index`` (0-based) was handed over.

        Older log entries are dropped: chunks are formed in order, so they are not needed again.
        """
        with self._lock:
            arrivals = self._arrivals
            while len(arrivals) > 1 and arrivals[0][0] <= sample_index:
                arrivals.popleft()
            return arrivals[0][1] if arrivals else time.monotonic()

    def next_chunk_frames(self) -> int:
        """Fbank frames the next chunk would read now (0: not ready)."""
        available = self.fbank.num_frames_ready - self.frames_consumed
        if available >= self.window:
            return self.window
        if self.finishing and available >= self.context:
            return available
        return 0

    def chunk_last_sample(self, num_frames: int) -> int:
        """Index of the last audio sample that the next chunk of ``num_frames`` fbank frames needs."""
        last_frame = self.frames_consumed + num_frames - 1
        frontend = self.fbank.config
        return last_frame * frontend.frame_shift_samples + frontend.frame_length_samples - 1

    def take_chunk_samples(self, num_frames: int) -> np.ndarray:
        """The audio of the next chunk's fbank frames, (window_samples(num_frames),) float32,
        for the engine to compute many streams' features at once; advances by one stride."""
        samples = self.fbank.window(self.frames_consumed, num_frames)
        self.chunk_start = self.frames_consumed
        self.frames_consumed += min(self.stride, num_frames)
        # The chunk's own frames stay held until the next one is taken, for ``rewind``.
        self.fbank.drop_frames(self.chunk_start - self.fbank.first_available)
        return samples

    def rewind(self, encoder_frames: int) -> None:
        """Read the chunk just taken again from its ``encoder_frames``-th encoder frame on: an
        utterance ended inside it (``asr_core.endpoint.silence_ends_inside``), and its later
        frames start the next utterance, decoded again on that utterance's fresh cache."""
        if not 0 < encoder_frames * self._subsampling <= self.frames_consumed - self.chunk_start:
            raise ValueError(
                f"stream {self.stream_id}: cannot rewind to encoder frame {encoder_frames} of a chunk of "
                f"{self.frames_consumed - self.chunk_start} fbank frames"
            )
        self.frames_consumed = self.chunk_start + encoder_frames * self._subsampling
        self.ready_since = 0.0

    def set_chunk(self, chunk_ms: int, chunk_frames: int, now: float) -> None:
        """Run the next chunks at ``chunk_ms`` (``chunk_frames`` encoder frames), one of ``ladder``.

        Called between chunks: the next chunk starts at ``frames_consumed`` whatever its size,
        so no audio is skipped or read twice; the model offset and the cache slot go on as they
        are (the window in encoder frames is the same at every size of the ladder). A chunk
        that was ready at the old size is formed again at the new one (``ready_since`` reset).
        """
        left_chunks = dict(self.ladder).get(chunk_ms)
        if left_chunks is None or chunk_frames * left_chunks != self.cache_frames:
            raise ValueError(
                f"stream {self.stream_id}: {chunk_ms} ms chunks ({chunk_frames} frames) are not on its ladder "
                f"{self.ladder}"
            )
        if chunk_ms == self.chunk_ms:
            return
        self.chunk_ms = chunk_ms
        self.chunk_frames = chunk_frames
        self.left_chunks = left_chunks
        self.stride = self._subsampling * chunk_frames
        self.window = chunk_input_frames(chunk_frames, self._subsampling, self._right_context)
        self.ready_since = 0.0
        degraded = chunk_ms != self.config.chunk_ms
        self.degraded_since = (self.degraded_since or now) if degraded else 0.0

    def next_seq(self) -> int:
        return next(self._seq)
