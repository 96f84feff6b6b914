"""The shared streaming recognizer: one per device, many streams, batched chunk forwards.

The ``Engine`` owns the weights, the cache pool (``kv_ring.KvPool``) and the chunk runner,
opens streams, and runs two collaborators, each with one job: the ``Scheduler``
(``asr_core.scheduler``: the batching loop, partials, endpoints; one thread each, and with
``schedulers`` > 1 as many of them over disjoint sets of streams) and the ``Finalizer``
(``asr_core.finalizer``: the finals' job queue and thread, searching and rescoring ended
utterances in that thread or a child process, ``asr_core.finals``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable

import torch

from asr_core.backends import ChunkRunner, ChunkStepInputs, make_runner, rescoring_decoder
from asr_core.engine_options import EngineOptions
from asr_core.engine_stats import EngineStats
from asr_core.events import Event
from asr_core.finalizer import Finalizer
from asr_core.finals import FinalSearch, FinalSettings, ProcessFinalSearch
from asr_core.frontend import encoder_frame_ms
from asr_core.model.loader import LoadedModel
from asr_core.scheduler import Scheduler
from asr_core.stream import Stream, StreamConfig, chunk_input_frames
from asr_core.surge import chunk_ladder
from asr_core.tokens import tokens_to_text
from kv_ring import KvPool

log = logging.getLogger(__name__)

__all__ = ["Engine"]


class Engine:
    """Shared batched recognizer. Thread-safe API: ``open_stream``; streams' producer methods."""

    def __init__(
        self, loaded: LoadedModel, options: EngineOptions | None = None, runner: ChunkRunner | None = None
    ) -> None:
        self.options = options or EngineOptions()
        self.loaded = loaded
        self.device = torch.device(self.options.device)
        self.model = loaded.model.to(device=self.device, dtype=self.options.dtype).eval()
        self.runner = runner or make_runner(
            self.options.backend, loaded, traced=self.options.traced_step, step_threads=self.options.step_threads
        )
        if self.options.schedulers < 1:
            raise ValueError(f"schedulers must be at least 1, got {self.options.schedulers}")
        if not 0 <= self.options.finals_niceness <= 19:
            raise ValueError(f"finals_niceness must be 0-19, got {self.options.finals_niceness}")
        if self.options.finalizer not in ("thread", "process"):
            raise ValueError(f"finalizer {self.options.finalizer!r} unknown; choose thread or process")
        settings = FinalSettings.for_model(
            loaded,
            beam=self.options.beam,
            ctc_weight=self.options.ctc_weight,
            reverse_weight=self.options.reverse_weight,
            attention_beam=self.options.attention_beam,
        )
        decoder = rescoring_decoder(self.options.backend, self.model.decoder, traced=self.options.traced_rescoring)
        self.subsampling = loaded.subsampling
        self.frontend = loaded.frontend
        self.sample_rate = loaded.frontend.sample_rate  # Hz of the audio streams must be fed
        self.frame_ms = encoder_frame_ms(loaded.frontend, loaded.subsampling)
        max_chunk = max(self.options.allowed_chunk_ms) // self.frame_ms
        self.pool = KvPool(
            self.options.max_streams,
            loaded.cache_geometry(max_chunk * self.options.max_left_chunks, self.options.dtype),
            device=self.device,
        )
        # The step shape of each allowed chunk size at the most left chunks: the widest its
        # batches have.
        self._chunk_shapes = tuple(
            self._step_shape(chunk_ms, self.options.max_left_chunks) for chunk_ms in self.options.allowed_chunk_ms
        )
        for input_frames, window in self._chunk_shapes:
            self.runner.expect(input_frames, window)
        self.stats = EngineStats()
        self._blank = loaded.blank_id
        self.finalizer = Finalizer(
            FinalSearch(decoder, settings, proposer=self.model.decoder),
            self._text,
            self.frame_ms,
            self.stats,
            workers=self.options.finals_workers,
            surge=self.options.surge,
            saturated=lambda: self.saturated,
        )
        self.schedulers = [
            Scheduler(
                self.options,
                pool=self.pool,
                runner=self.runner,
                finalizer=self.finalizer,
                text=self._text,
                stats=self.stats,
                device=self.device,
                subsampling=self.subsampling,
                right_context=loaded.right_context,
                blank=self._blank,
                frontend=loaded.frontend,
                name="asr-engine" if self.options.schedulers == 1 else f"asr-engine-{index}",
            )
            for index in range(self.options.schedulers)
        ]
        for scheduler in self.schedulers[1:]:
            scheduler.trims_heap = False  # malloc_trim is process-wide: once a minute is enough
        self._open_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start the finalizer (and its child process, if configured) and the scheduler threads."""
        if self.schedulers[0].running:
            return
        # A GPU decoder stays in this process: a child would need its own device context.
        in_process = self.options.finalizer == "process" and self.device.type == "cpu"
        self.finalizer.start(
            process_decoder=self.model.decoder if in_process else None,
            backend=self.options.backend,
            niceness=self.options.finals_niceness,
            traced=self.options.traced_rescoring,
        )
        for scheduler in self.schedulers:
            scheduler.start()

    @torch.inference_mode()
    def warm_up(self, streams: Iterable[tuple[int, int]] = ()) -> float:
        """Run one chunk step of each allowed chunk size on an empty cache, so that one-time work
        (tracing the torch graphs, first-run allocations) is done before calls arrive rather
        than in their first chunks. Returns the seconds it took. Call before ``start``.

        A batch attends over its streams' largest cache window, so each (chunk_ms, left_chunks)
        streams will use (the service's routing profiles) is a shape of its own: ``streams``
        names them, each allowed chunk size at ``max_left_chunks`` is always warmed."""
        started = time.perf_counter()
        shapes = dict.fromkeys(self._chunk_shapes)
        for chunk_ms, left_chunks in streams:
            self._check_stream_shape(chunk_ms, left_chunks)
            shape = self._step_shape(chunk_ms, left_chunks)
            self.runner.expect(*shape)
            shapes[shape] = None
        g = self.pool.geometry
        offsets = torch.zeros(1, dtype=torch.int64, device=self.device)
        cnn = torch.zeros(g.cnn_shape(1), dtype=self.options.dtype, device=self.device)
        for input_frames, window in shapes:
            att = torch.zeros(g.att_shape(1, window), dtype=self.options.dtype, device=self.device)
            pos = torch.full((1, window), -1, dtype=torch.int64, device=self.device)
            mask = torch.zeros((1, window), dtype=torch.bool, device=self.device)
            xs = torch.zeros(
                (1, input_frames, self.loaded.config.input_dim), dtype=self.options.dtype, device=self.device
            )
            self.runner.step(ChunkStepInputs(xs, offsets, att, pos, mask, cnn))
        return time.perf_counter() - started

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the schedulers, end the streams still open, emit every queued Final, stop.

        A stream still open is ended with what was decoded of it (a Final of its current
        utterance, then Ended), so its owner always learns that it ended; audio it held that
        was not decoded yet is lost (logged). To lose nothing, finish every stream's input and
        wait for ``active_streams`` to reach 0 first. ``timeout`` (s) bounds the wait for each
        scheduler's current tick, and for the finalizer to finish its next job.
        """
        for scheduler in self.schedulers:
            if scheduler.stop(timeout):
                cut = scheduler.end_open_streams()
                if cut:
                    log.warning(
                        "engine stopped with %d streams still open: they end with what was decoded of them", cut
                    )
            else:
                log.error("engine tick still running after %.0f s; its %d open streams get no Ended", timeout,
                          scheduler.open_streams)  # fmt: skip
        if not self.finalizer.running:
            self.finalizer.finalize_pending()  # driven without threads: emit the cut streams' events now
        self.finalizer.stop(timeout)
        self.runner.close()

    @property
    def decoder(self) -> object:
        """The attention decoder finals are rescored with (an int8 copy with int8 backends)."""
        return self.finalizer.local_search.decoder

    @property
    def finalizer_pids(self) -> list[int]:
        """The finals processes' pids while they run (``finalizer="process"``), else empty."""
        return [s.pid for s in self.finalizer.searches if isinstance(s, ProcessFinalSearch) and s.pid is not None]

    @property
    def finalizer_pid(self) -> int | None:
        """The (first) finals process's pid while one runs, else None."""
        pids = self.finalizer_pids
        return pids[0] if pids else None

    def finalizer_cpu_seconds(self) -> float | None:
        """CPU time the finals processes have used (benchmarks add it to this process's);
        None without one."""
        times = [s.cpu_seconds() for s in self.finalizer.searches if isinstance(s, ProcessFinalSearch)]
        known = [t for t in times if t is not None]
        return sum(known) if known else None

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- streams --------------------------------------------------------------------

    @property
    def active_streams(self) -> int:
        return self.pool.used_slots

    @property
    def free_slots(self) -> int:
        return self.pool.free_slots

    @property
    def lag_ms(self) -> float:
        """How long the oldest chunk waiting for a step had waited at its scheduler's latest tick."""
        return max(scheduler.lag_s for scheduler in self.schedulers) * 1000.0

    @property
    def finals_lag_ms(self) -> float:
        """How long the oldest utterance still without its Final has waited since its endpoint."""
        return self.finalizer.lag_s() * 1000.0

    @property
    def degraded_streams(self) -> int:
        """Streams running at a longer chunk than their own because the engine fell behind."""
        return sum(scheduler.degraded_streams for scheduler in self.schedulers)

    @property
    def saturated(self) -> bool:
        """Under surge: a scheduler is behind with none of its streams left to move to a longer
        chunk (``Scheduler.saturated``); finals are then searched the cheaper way."""
        return any(scheduler.saturated for scheduler in self.schedulers)

    @property
    def overloaded(self) -> bool:
        """No room for another call: an ended utterance has waited longer than
        ``finals_behind_ms`` for its Final, or a chunk longer than ``behind_ms`` for its step.
        The gateway then admits no new calls, so the calls it has are not made later still.

        With surge (``EngineOptions.surge``) a late chunk alone is not full: streams can move to
        longer chunks, which cost less. The scheduler a new stream would join is full only when
        even its streams' longest chunks would fall behind (``Scheduler.full_at_longest_chunks``:
        behind with every stream there, or their measured cost there past its time)."""
        if self.finals_lag_ms > self.options.finals_behind_ms:
            return True
        if self.options.surge is None:
            return self.lag_ms > self.options.behind_ms
        joins = min(self.schedulers, key=lambda s: s.open_streams)
        return joins.full_at_longest_chunks(self.options.behind_ms)

    def open_stream(self, config: StreamConfig, on_event: Callable[[Event], None]) -> Stream:
        """A new stream in a free cache slot; raises ``CapacityError`` when none is free."""
        self._check_stream_shape(config.chunk_ms, config.left_chunks)
        chunk_frames = config.chunk_frames(self.subsampling, self.frame_ms // self.subsampling)
        ladder = self.ladder(config)
        stream_id = config.stream_id or uuid.uuid4().hex
        with self._open_lock:
            if any(stream_id in scheduler.streams for scheduler in self.schedulers):
                raise ValueError(f"stream id {stream_id!r} is already open")
            _, window = self._step_shape(config.chunk_ms, config.left_chunks)
            slot = self.pool.allocate(window)
            # Its batches attend over this window, at each size it may move to under load: a
            # graph for each is traced on first use unless ``warm_up`` built it
            # (``warm_up(streams=...)``).
            for shape in ladder:
                self.runner.expect(*self._step_shape(*shape))
            try:
                scheduler = min(self.schedulers, key=lambda s: s.open_streams)
                stream = Stream(
                    stream_id=stream_id,
                    config=config,
                    slot=slot,
                    chunk_frames=chunk_frames,
                    subsampling=self.subsampling,
                    right_context=self.loaded.right_context,
                    on_event=on_event,
                    frontend=self.frontend,
                    wake=scheduler.wakeup.set,
                    ladder=ladder,
                )
                scheduler.add(stream)
            except ValueError:
                self.pool.release(slot)
                raise
        return stream

    def ladder(self, config: StreamConfig) -> tuple[tuple[int, int], ...]:
        """(chunk ms, left chunks) a stream of ``config`` may run at, its own first: under load
        (``EngineOptions.surge``) it moves up this ladder and back (asr_core/surge.py). Without
        surge, or with ``max_chunk_ms`` unset, its own size only. ``warm_up`` takes these."""
        if self.options.surge is None or config.max_chunk_ms is None:
            return ((config.chunk_ms, config.left_chunks),)
        return chunk_ladder(
            config.chunk_ms, config.left_chunks, config.max_chunk_ms, self.options.allowed_chunk_ms, self.frame_ms
        )

    def _check_stream_shape(self, chunk_ms: int, left_chunks: int) -> None:
        """``ValueError`` unless streams of ``chunk_ms`` chunks keeping ``left_chunks`` may open."""
        if chunk_ms not in self.options.allowed_chunk_ms:
            allowed = ", ".join(str(ms) for ms in self.options.allowed_chunk_ms)
            raise ValueError(f"chunk_ms {chunk_ms} is not one of the engine's chunk sizes {allowed}")
        if not 1 <= left_chunks <= self.options.max_left_chunks:
            raise ValueError(f"left_chunks must be 1..{self.options.max_left_chunks}, got {left_chunks}")

    def _step_shape(self, chunk_ms: int, left_chunks: int) -> tuple[int, int]:
        """(fbank frames of a full chunk, cache frames kept) of a stream of ``chunk_ms`` chunks
        keeping ``left_chunks``: the chunk step's shape for batches of such streams, whose cache
        window (the first ring positions of the pool) is all they attend over. The pool's own
        window is sized for the largest chunk; attending over its positions past a stream's
        window, never written and always masked, cost the service's 320 ms chunks with 4 left
        chunks (32 frames of a 128-frame pool) several times the CPU (docs/BENCHMARKS.md)."""
        chunk_frames = chunk_ms // self.frame_ms
        return chunk_input_frames(chunk_frames, self.subsampling, self.loaded.right_context), chunk_frames * left_chunks

    # -- driving without threads ----------------------------------------------------

    def run_once(self) -> float:
        """One scheduler tick; returns how long to wait for new audio (0: work may remain).

        Public so tests and offline tools can drive the engine without its threads.
        """
        return min([scheduler.run_once() for scheduler in self.schedulers])

    def finalize_pending(self) -> None:
        """Run queued finalizations in the caller's thread (when the engine thread is not running)."""
        self.finalizer.finalize_pending()

    # -- text -----------------------------------------------------------------------

    def _text(self, tokens: Iterable[int]) -> str:
        return tokens_to_text(tokens, self.loaded.units)
