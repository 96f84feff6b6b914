"""The shared streaming recognizer: one per device, many streams, batched chunk forwards.

The ``Engine`` owns the weights, the cache pool (``kv_ring.KvPool``) and one scheduler
thread. Each tick the scheduler
1. moves every stream's queued audio into its fbank extractor,
2. collects the streams whose next chunk is complete,
3. groups them by chunk shape (chunk size, input frames) -- one bucket per shape, so streams
   with different chunk sizes are all served, each by its own batched forward,
4. forms batches of up to ``max_batch`` (a group smaller than that waits at most
   ``max_wait_ms`` for more streams, unless every stream of that chunk size is already in it),
5. runs ONE ``forward_chunk_batch`` per batch, ring-writes the new keys/values, takes the CTC
   top-k, updates greedy partials and endpoint counters with array operations,
6. finalizes every utterance that ended in this tick together: prefix beam search on the
   stored per-frame top-k, then one batched attention-rescoring call across those streams.

Oldest-ready-first ordering keeps it fair: a stream never waits behind newer chunks. When a
chunk's latency exceeds ``behind_ms`` the engine counts it and logs (rate-limited) that it
is behind real time; audio is never dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from asr_common.errors import CapacityError
from asr_common.latency import MeasurementRing
from asr_core import memtrim
from asr_core.backends import ChunkRunner, make_runner, rescoring_decoder
from asr_core.ctc_search import Hypothesis
from asr_core.endpoint import LEADING_SILENCE, NO_ENDPOINT, REASONS, EndpointRules, loud_frames, update_endpoints
from asr_core.events import Ended, Event, Final, NBestEntry, Partial
from asr_core.finals import FinalRequest, FinalSearch, FinalSettings, ProcessFinalSearch
from asr_core.frontend import fbank_windows
from asr_core.model.loader import LoadedModel
from asr_core.stream import Stream, StreamConfig, Utterance, chunk_input_frames
from asr_core.tokens import tokens_to_text
from kv_ring import KvPool
from rescoring.attention import RescoreResult

__all__ = ["CapacityError", "Engine", "EngineOptions", "EngineStats", "StreamConfig"]

log = logging.getLogger(__name__)

FINALIZER_NICENESS = 5
# Utterances rescored in one decoder call: enough to batch, few enough that a burst of
# hang-ups neither makes every final wait for the whole burst nor spikes memory.
FINALIZE_BATCH = 16


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Engine-wide limits. ``max_window_frames`` sizes the pool's per-slot ring."""

    max_streams: int = 256
    max_batch: int = 64
    max_wait_ms: float = 20.0
    allowed_chunk_ms: tuple[int, ...] = (160, 240, 320, 640)
    max_left_chunks: int = 8
    beam: int = 10
    ctc_weight: float = 0.5
    reverse_weight: float = 0.3
    # Finals: the attention decoder's own beam search adds up to this many hypotheses to each
    # CTC n-best before rescoring (asr_core/finals.py); 0 = WeNet's attention rescoring only.
    attention_beam: int = 0
    endpoint: EndpointRules = field(default_factory=EndpointRules)
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    backend: str = "torch"
    behind_ms: float = 1000.0
    trim_interval_s: float = 60.0  # return freed heap to the OS this often (glibc); 0 = never
    # Where finals are searched and rescored while the engine runs: "thread" (a thread of this
    # process) or "process" (a child process, CPU only: keeps that Python work off this
    # process's GIL; see asr_core/finals.py). Without the engine's threads (run_once) finals
    # are always computed in the caller's thread.
    finalizer: str = "thread"
    # The torch backends on a CPU run each full chunk shape as a frozen TorchScript graph, which
    # does not wait for the GIL between operations (asr_core/backends/traced.py); False: eager.
    traced_step: bool = True
    # Traced steps of large batches are cut into this many parts run at once in as many threads
    # (one core each; asr_core/backends TorchChunkRunner); 1 = one thread runs every step.
    step_threads: int = 1


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """The engine dtype for a config name on ``device``, or a ``ValueError`` that says why not.

    float16 runs on GPUs only. bfloat16 runs on GPUs and on CPUs with native bf16 matmuls
    (AVX512-BF16 or AMX), where it is about as fast as the int8 backends and needs no
    quantization step: the model and the cache pool are cast, so the pool also halves.
    """
    if name not in DTYPES:
        raise ValueError(f"engine dtype {name!r} unknown; choose one of {', '.join(DTYPES)}")
    on_cpu = torch.device(device).type == "cpu"
    if name == "float16" and on_cpu:
        raise ValueError("engine dtype float16 needs a GPU; on a CPU use float32, or bfloat16 where supported")
    if name == "bfloat16" and on_cpu and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise ValueError("engine dtype bfloat16: this CPU has no native bf16 support (AVX512-BF16/AMX); use float32")
    return DTYPES[name]


@dataclass(slots=True)
class EngineStats:
    """Counters and bounded samples for metrics and benchmarks (read from any thread)."""

    chunks: int = 0
    batches: int = 0
    finals: int = 0
    behind_realtime_chunks: int = 0
    errors: int = 0
    batch_sizes: MeasurementRing = field(default_factory=lambda: MeasurementRing(100_000))
    forward_ms: MeasurementRing = field(default_factory=lambda: MeasurementRing(100_000))
    partial_latency_ms: MeasurementRing = field(default_factory=lambda: MeasurementRing(500_000))
    final_latency_ms: MeasurementRing = field(default_factory=lambda: MeasurementRing(100_000))


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
        if self.options.finalizer not in ("thread", "process"):
            raise ValueError(f"finalizer {self.options.finalizer!r} unknown; choose thread or process")
        settings = FinalSettings.for_model(
            loaded,
            beam=self.options.beam,
            ctc_weight=self.options.ctc_weight,
            reverse_weight=self.options.reverse_weight,
            attention_beam=self.options.attention_beam,
        )
        decoder = rescoring_decoder(self.options.backend, self.model.decoder)
        self._local_search = FinalSearch(decoder, settings)
        self._final_search: FinalSearch | ProcessFinalSearch = self._local_search
        self.subsampling = loaded.subsampling
        self.frame_ms = 10 * loaded.subsampling
        max_chunk = max(self.options.allowed_chunk_ms) // self.frame_ms
        self.pool = KvPool(
            num_slots=self.options.max_streams,
            num_layers=loaded.num_blocks,
            heads=loaded.heads,
            d_k=loaded.d_k,
            window=max_chunk * self.options.max_left_chunks,
            d_model=loaded.d_model,
            cnn_frames=loaded.cnn_cache_frames,
            dtype=self.options.dtype,
            device=self.device,
        )
        # fbank frames of a full chunk of each allowed size: the shapes batches mostly have.
        self._chunk_inputs = tuple(
            chunk_input_frames(chunk_ms // self.frame_ms, self.subsampling, loaded.right_context)
            for chunk_ms in self.options.allowed_chunk_ms
        )
        expect = getattr(self.runner, "expect", None)
        if expect is not None:
            for input_frames in self._chunk_inputs:
                expect(input_frames, self.pool.window)
        self.stats = EngineStats()
        self._streams: dict[str, Stream] = {}
        self._streams_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finalizer: threading.Thread | None = None
        self._jobs: queue.Queue[_FinalJob | _EndJob] = queue.Queue()
        self._last_behind_log = 0.0
        self._blank = loaded.blank_id

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        # A GPU decoder stays in this process: a child would need its own device context.
        on_cpu = self.device.type == "cpu"
        if self.options.finalizer == "process" and on_cpu and self._final_search is self._local_search:
            try:
                self._final_search = ProcessFinalSearch(self.model.decoder, self.options.backend, self._local_search)
            except RuntimeError:
                log.exception("finals process failed to start; finals run in a thread of this process")
        self._thread = threading.Thread(target=self._run, name="asr-engine", daemon=True)
        self._finalizer = threading.Thread(target=self._run_finalizer, name="asr-finalizer", daemon=True)
        self._thread.start()
        self._finalizer.start()

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Run one chunk step of each allowed chunk size on an empty cache, so that one-time work
        (tracing the torch graphs, first-run allocations) is done before calls arrive rather
        than in their first chunks. Returns the seconds it took. Call before ``start``."""
        started = time.perf_counter()
        pool = self.pool
        att = torch.zeros(
            (pool.geometry.num_layers, 1, pool.geometry.heads, pool.window, 2 * pool.geometry.d_k),
            dtype=self.options.dtype,
            device=self.device,
        )
        cnn = torch.zeros(
            (pool.geometry.num_layers, 1, pool.geometry.d_model, pool.geometry.cnn_frames),
            dtype=self.options.dtype,
            device=self.device,
        )
        pos = torch.full((1, pool.window), -1, dtype=torch.int64, device=self.device)
        mask = torch.zeros((1, pool.window), dtype=torch.bool, device=self.device)
        offsets = torch.zeros(1, dtype=torch.int64, device=self.device)
        for input_frames in self._chunk_inputs:
            xs = torch.zeros(
                (1, input_frames, self.loaded.config.input_dim), dtype=self.options.dtype, device=self.device
            )
            self.runner.step(xs, offsets, att, pos, mask, cnn)
        return time.perf_counter() - started

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the scheduler (finals already queued are still emitted); open streams get no more events."""
        self._stop.set()
        self._wakeup.set()
        for thread in (self._thread, self._finalizer):
            if thread is not None:
                thread.join(timeout)
        self._thread = self._finalizer = None
        if self._final_search is not self._local_search:
            self._final_search.close()
            self._final_search = self._local_search
        close_runner = getattr(self.runner, "close", None)
        if close_runner is not None:
            close_runner()

    @property
    def decoder(self) -> object:
        """The attention decoder finals are rescored with (an int8 copy with int8 backends)."""
        return self._local_search.decoder

    @property
    def finalizer_pid(self) -> int | None:
        """The finals process's pid while one runs (``finalizer="process"``), else None."""
        search = self._final_search
        return search.pid if isinstance(search, ProcessFinalSearch) else None

    def finalizer_cpu_seconds(self) -> float | None:
        """CPU time the finals process has used (benchmarks add it to this process's)."""
        search = self._final_search
        return search.cpu_seconds() if isinstance(search, ProcessFinalSearch) else None

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

    def open_stream(self, config: StreamConfig, on_event: Callable[[Event], None]) -> Stream:
        """A new stream in a free cache slot; raises ``CapacityError`` when none is free."""
        if config.chunk_ms not in self.options.allowed_chunk_ms:
            allowed = ", ".join(str(ms) for ms in self.options.allowed_chunk_ms)
            raise ValueError(f"chunk_ms {config.chunk_ms} is not one of the engine's chunk sizes {allowed}")
        if not 1 <= config.left_chunks <= self.options.max_left_chunks:
            raise ValueError(f"left_chunks must be 1..{self.options.max_left_chunks}, got {config.left_chunks}")
        chunk_frames = config.chunk_frames(self.subsampling)
        slot = self.pool.allocate(chunk_frames * config.left_chunks)
        stream = Stream(
            stream_id=config.stream_id or uuid.uuid4().hex,
            config=config,
            slot=slot,
            chunk_frames=chunk_frames,
            subsampling=self.subsampling,
            right_context=self.loaded.right_context,
            on_event=on_event,
            wake=self._wakeup.set,
        )
        with self._streams_lock:
            if stream.stream_id in self._streams:
                self.pool.release(slot)
                raise ValueError(f"stream id {stream.stream_id!r} is already open")
            self._streams[stream.stream_id] = stream
        return stream

    # -- scheduler ------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        next_trim = time.monotonic() + self.options.trim_interval_s
        while not self._stop.is_set():
            if self.options.trim_interval_s > 0 and time.monotonic() >= next_trim:
                memtrim.trim()
                next_trim = time.monotonic() + self.options.trim_interval_s
            try:
                timeout = self.run_once()
            except Exception:
                # A bug or a device error must not silently stop every call's recognition:
                # log it, count it, keep serving (the failed batch's chunks are lost).
                self.stats.errors += 1
                log.exception("engine tick failed")
                timeout = 0.1
            if timeout > 0:
                self._wakeup.wait(timeout)
                self._wakeup.clear()

    def run_once(self) -> float:
        """One scheduler tick; returns how long to wait for new audio (0: work may remain).

        Public so tests and offline tools can drive the engine without its thread.
        """
        with self._streams_lock:
            streams = list(self._streams.values())
        ready: list[tuple[Stream, int]] = []
        ending: list[tuple[Stream, str]] = []
        now = time.monotonic()
        for stream in streams:
            stream.drain_inbox()
            frames = stream.next_chunk_frames()
            if frames:
                if not stream.ready_since:
                    since = stream.arrival_time_of_sample(stream.chunk_last_sample(frames))
                    if frames < stream.window:
                        # A short last chunk can only run once the input has ended (its audio may
                        # have arrived long before the caller hung up): it is ready from then on.
                        since = max(since, stream.input_end_time)
                    stream.ready_since = since
                ready.append((stream, frames))
            elif stream.closing:
                ending.append((stream, "closed"))
            elif stream.finishing:
                ending.append((stream, "input_finished"))

        wait = self.options.max_wait_ms / 1000.0
        ran = False
        for batch in self._form_batches(ready, now):
            self._process_batch(batch, ending)
            ran = True
        if ending:
            self._finish_streams(ending)
        if self._finalizer is None:
            self.finalize_pending()  # driven without threads (tests, offline tools)
        if ran or ending:
            return 0.0
        return wait if ready else 0.05

    def _form_batches(self, ready: list[tuple[Stream, int]], now: float) -> Iterable[list[tuple[Stream, int]]]:
        groups: dict[tuple[int, int], list[tuple[Stream, int]]] = {}
        for stream, frames in ready:
            groups.setdefault((stream.chunk_frames, frames), []).append((stream, frames))
        active_per_chunk: dict[int, int] = {}
        with self._streams_lock:
            for stream in self._streams.values():
                active_per_chunk[stream.chunk_frames] = active_per_chunk.get(stream.chunk_frames, 0) + 1
        max_batch = self.options.max_batch
        max_wait = self.options.max_wait_ms / 1000.0
        for (chunk_frames, _), members in groups.items():
            members.sort(key=lambda item: item[0].ready_since)
            oldest_wait = now - members[0][0].ready_since
            complete = len(members) >= min(max_batch, active_per_chunk.get(chunk_frames, 0))
            finishing = any(stream.finishing or stream.closing for stream, _ in members)
            if not (complete or finishing or oldest_wait >= max_wait):
                continue
            for start in range(0, len(members), max_batch):
                yield members[start : start + max_batch]

    @torch.inference_mode()
    def _process_batch(self, batch: list[tuple[Stream, int]], ending: list[tuple[Stream, str]]) -> None:
        streams = [stream for stream, _ in batch]
        frames = batch[0][1]
        size = len(streams)
        audio = np.stack([stream.take_chunk_samples(frames) for stream in streams])  # (B, samples)
        feats = fbank_windows(torch.from_numpy(audio).to(self.device), frames)  # (B, T_in, n_mels)
        xs = feats.to(dtype=self.options.dtype)
        slots = torch.tensor([stream.slot for stream in streams], dtype=torch.int64)
        offsets = torch.tensor([stream.utterance.offset for stream in streams], dtype=torch.int64)
        started = time.perf_counter()
        cache = self.pool.gather(slots, reuse_buffer=True)
        ys, log_probs, new_kv, new_cnn = self.runner.step(
            xs, offsets.to(self.device), cache.att, cache.pos, cache.mask, cache.cnn
        )  # ys (B, C, D), log_probs (B, C, V)
        chunk = ys.shape[1]
        positions = offsets.unsqueeze(1) + torch.arange(chunk, dtype=torch.int64).unsqueeze(0)  # (B, C)
        self.pool.write(slots, new_kv, positions, new_cnn)
        top_values, top_ids = log_probs.topk(self.options.beam, dim=-1)  # (B, C, k)
        blank_prob = log_probs[..., self._blank].exp().cpu().numpy()  # (B, C)
        top_values_np = top_values.cpu().numpy()
        top_ids_np = top_ids.cpu().numpy()
        forward_ms = (time.perf_counter() - started) * 1000.0

        decoded_any = self._update_greedy(streams, top_ids_np[:, :, 0], chunk)
        trailing = np.array([s.utterance.trailing_frames for s in streams], dtype=np.int64)
        utt_frames = np.array([s.utterance.offset for s in streams], dtype=np.int64)
        loud = self._loud_frames(streams, feats, chunk) if self.options.endpoint.energy_gate_db > 0 else None
        codes = update_endpoints(
            self.options.endpoint, self.frame_ms, blank_prob, trailing, utt_frames, decoded_any, loud
        )

        now = time.monotonic()
        for i, stream in enumerate(streams):
            utt = stream.utterance
            utt.offset += chunk
            utt.trailing_frames = int(trailing[i])
            utt.topk_values.append(top_values_np[i])
            utt.topk_ids.append(top_ids_np[i])
            utt.encoder_out.append(ys[i].clone())
            latency_ms = (now - stream.ready_since) * 1000.0
            self.stats.partial_latency_ms.append(latency_ms)
            if latency_ms > self.options.behind_ms:
                self._note_behind(latency_ms)
            if utt.changed or stream.config.emit_unchanged_partials:
                self._emit_partial(stream, latency_ms, stream.ready_since)
                utt.changed = False
            stream.ready_since = 0.0
            if codes[i] != NO_ENDPOINT:
                ending.append((stream, REASONS[int(codes[i])]))
        self.stats.chunks += size
        self.stats.batches += 1
        self.stats.batch_sizes.append(size)
        self.stats.forward_ms.append(forward_ms)

    def _loud_frames(self, streams: list[Stream], feats: torch.Tensor, chunk: int) -> np.ndarray:
        """(B, C) bool: new encoder frames whose audio stands out from each stream's noise floor.

        A frame's energy is the loudest of the fbank frames it is computed from (its subsampling
        window), each fbank frame's energy the log of its total mel power."""
        window = self.loaded.right_context + 1
        energy = torch.logsumexp(feats.float(), dim=-1)  # (B, T_in)
        per_frame = energy.unfold(1, window, self.subsampling)[:, :chunk].amax(dim=-1).cpu().numpy()  # (B, C)
        floors = np.array([s.noise_floor for s in streams], dtype=np.float64)
        loud = loud_frames(per_frame.astype(np.float64), floors, self.options.endpoint.energy_gate_db)
        for stream, floor in zip(streams, floors.tolist(), strict=True):
            stream.noise_floor = floor
        return loud

    def _update_greedy(self, streams: list[Stream], best: np.ndarray, chunk: int) -> np.ndarray:
        """CTC greedy over the new frames of every stream; returns (B,) 'utterance has text'."""
        previous = np.array([s.utterance.last_token for s in streams], dtype=np.int64)  # (B,)
        shifted = np.concatenate([previous[:, None], best[:, :-1]], axis=1)  # (B, C)
        emit = (best != self._blank) & (best != shifted)  # (B, C)
        rows, cols = np.nonzero(emit)
        for row, col in zip(rows.tolist(), cols.tolist(), strict=True):
            utt = streams[row].utterance
            utt.tokens.append(int(best[row, col]))
            utt.token_frames.append(utt.offset + col)
            utt.changed = True
        for i, stream in enumerate(streams):
            stream.utterance.last_token = int(best[i, -1])
        return np.array([bool(s.utterance.tokens) for s in streams])

    def _note_behind(self, latency_ms: float) -> None:
        self.stats.behind_realtime_chunks += 1
        now = time.monotonic()
        if now - self._last_behind_log > 10.0:
            self._last_behind_log = now
            log.warning(
                "engine behind real time: chunk latency %.0f ms (%d such chunks so far, %d streams)",
                latency_ms,
                self.stats.behind_realtime_chunks,
                self.active_streams,
            )

    # -- events ---------------------------------------------------------------------

    def _text(self, tokens: Iterable[int]) -> str:
        return tokens_to_text(tokens, self.loaded.units)

    def _times_ms(self, stream: Stream, frames: Iterable[int]) -> tuple[int, ...]:
        base = stream.utterance.start_frame
        return tuple((base + f) * self.frame_ms for f in frames)

    def _emit_partial(self, stream: Stream, latency_ms: float, audio_end: float) -> None:
        utt = stream.utterance
        event = Partial(
            stream_id=stream.stream_id,
            utterance_id=utt.utterance_id,
            seq=stream.next_seq(),
            text=self._text(utt.tokens),
            tokens=tuple(utt.tokens),
            token_times_ms=self._times_ms(stream, utt.token_frames),
            begin_ms=utt.start_frame * self.frame_ms,
            end_ms=(utt.start_frame + utt.offset) * self.frame_ms,
            latency_ms=latency_ms,
            audio_end_monotonic=audio_end,
        )
        self._deliver(stream, event)

    def _deliver(self, stream: Stream, event: Event) -> None:
        try:
            stream.on_event(event)
        except Exception:
            log.exception("event callback of stream %s failed; event dropped", stream.stream_id)

    # -- endpoints and finals -------------------------------------------------------

    def _finish_streams(self, ending: list[tuple[Stream, str]]) -> None:
        """Hand ended utterances to the finalizer; reset the streams at once, or retire them.

        The stream's next utterance starts immediately (fresh offset and cache slot) while the
        finalizer searches and rescores the one that ended, so finals never delay partials.
        """
        seen: set[str] = set()
        detected = time.monotonic()
        for stream, reason in ending:
            if stream.stream_id in seen:
                continue
            seen.add(stream.stream_id)
            retire = reason in ("closed", "input_finished") and not stream.next_chunk_frames()
            if reason in ("closed", "input_finished") and not retire:
                continue  # more chunks to decode first (input finished mid-tick)
            utt = stream.utterance
            if utt.tokens and reason != REASONS[LEADING_SILENCE]:
                self._jobs.put(_FinalJob(stream, reason, _UtteranceSnapshot.of(utt), detected))
            if retire:
                self._retire(stream)
            else:
                self._reset_utterance(stream)

    def _reset_utterance(self, stream: Stream) -> None:
        """Start the next utterance: fresh model offset and caches, as WeNet's runtime does."""
        utt = stream.utterance
        utt.reset(utt.start_frame + utt.offset)
        self.pool.reset(stream.slot)

    def _retire(self, stream: Stream) -> None:
        """Free the slot now; the finalizer emits ``Ended`` after the stream's last Final."""
        with self._streams_lock:
            self._streams.pop(stream.stream_id, None)
        self.pool.release(stream.slot)
        utt = stream.utterance
        reason = "closed" if stream.closing else "input_finished"
        self._jobs.put(_EndJob(stream, reason, (utt.start_frame + utt.offset) * self.frame_ms))

    # -- finalizer ------------------------------------------------------------------

    def _run_finalizer(self) -> None:
        torch.set_grad_enabled(False)
        # Finals may wait a little; partials may not. On Linux a thread has its own nice
        # value, so the scheduler thread wins the CPU when both have work.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), FINALIZER_NICENESS)
        while not self._stop.is_set() or not self._jobs.empty():
            try:
                first = self._jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                self._finalize([first, *self._drain_jobs(FINALIZE_BATCH - 1)])
            except Exception:
                self.stats.errors += 1
                log.exception("finalizing utterances failed")

    def _drain_jobs(self, limit: int) -> list[_FinalJob | _EndJob]:
        jobs: list[_FinalJob | _EndJob] = []
        while len(jobs) < limit:
            try:
                jobs.append(self._jobs.get_nowait())
            except queue.Empty:
                break
        return jobs

    def finalize_pending(self) -> None:
        """Run queued finalizations in the caller's thread (when the engine thread is not running)."""
        jobs = self._drain_jobs(limit=1 << 30)
        if jobs:
            self._finalize(jobs)

    def _finalize(self, jobs: list[_FinalJob | _EndJob]) -> None:
        """Prefix beam search per utterance, ONE rescoring call for all of them, events in job order."""
        finals = [job for job in jobs if isinstance(job, _FinalJob)]
        requests = [
            FinalRequest(
                np.concatenate(job.utterance.topk_values),
                np.concatenate(job.utterance.topk_ids),
                torch.cat(job.utterance.encoder_out, dim=0) if job.stream.config.rescore else None,
            )
            for job in finals
        ]
        search = self._final_search if self._finalizer is not None else self._local_search
        results = search.run(requests) if requests else []
        nbests = [result.nbest for result in results]
        rescored = {i: result.rescored for i, result in enumerate(results) if result.rescored is not None}
        index = {id(job): i for i, job in enumerate(finals)}
        for job in jobs:
            if isinstance(job, _EndJob):
                self._deliver(job.stream, Ended(job.stream.stream_id, job.stream.next_seq(), job.reason, job.audio_ms))
                job.stream.done.set()
                continue
            i = index[id(job)]
            self._emit_final(job, nbests[i], rescored.get(i))

    def _emit_final(self, job: _FinalJob, nbest: list[Hypothesis], result: RescoreResult | None) -> None:
        utt, stream = job.utterance, job.stream
        if result is not None:
            entries = tuple(
                NBestEntry(h.tokens, self._text(h.tokens), h.score, h.ctc_score, h.l2r_score, h.r2l_score)
                for h in result.hypotheses
            )
            best_times, confidence = result.times, result.confidence
        else:
            entries = tuple(NBestEntry(h.tokens, self._text(h.tokens), h.score, h.score) for h in nbest)
            best_times, confidence = nbest[0].times, _ctc_confidence(entries)
        best = entries[0]
        now = time.monotonic()
        latency_ms = (now - job.detected) * 1000.0
        self.stats.final_latency_ms.append(latency_ms)
        self.stats.finals += 1
        event = Final(
            stream_id=stream.stream_id,
            utterance_id=utt.utterance_id,
            seq=stream.next_seq(),
            text=best.text,
            tokens=best.tokens,
            token_times_ms=tuple((utt.start_frame + f) * self.frame_ms for f in best_times),
            begin_ms=utt.start_frame * self.frame_ms,
            end_ms=(utt.start_frame + utt.offset) * self.frame_ms,
            reason=job.reason,
            nbest=entries,
            confidence=confidence,
            latency_ms=latency_ms,
            audio_end_monotonic=now,
        )
        self._deliver(stream, event)


@dataclass(frozen=True, slots=True)
class _UtteranceSnapshot:
    """What finalizing an utterance needs, detached from the stream (which moves on)."""

    utterance_id: int
    start_frame: int
    offset: int
    topk_values: list[np.ndarray]
    topk_ids: list[np.ndarray]
    encoder_out: list[torch.Tensor]

    @classmethod
    def of(cls, utt: Utterance) -> _UtteranceSnapshot:
        return cls(utt.utterance_id, utt.start_frame, utt.offset, utt.topk_values, utt.topk_ids, utt.encoder_out)


@dataclass(frozen=True, slots=True)
class _FinalJob:
    stream: Stream
    reason: str
    utterance: _UtteranceSnapshot
    detected: float  # monotonic time the endpoint was detected


@dataclass(frozen=True, slots=True)
class _EndJob:
    stream: Stream
    reason: str
    audio_ms: int


def _ctc_confidence(entries: tuple[NBestEntry, ...]) -> float:
    """Posterior of the best hypothesis among the n-best (softmax over their CTC scores)."""
    scores = np.array([e.ctc_score for e in entries], dtype=np.float64)
    if scores.size == 0:
        return 0.0
    weights = np.exp(scores - scores.max())
    return float(weights[0] / weights.sum())
