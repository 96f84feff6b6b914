"""The engine's scheduler: the batching loop that turns many streams' audio into batched chunk
steps, partials and endpoints, on one thread that owns its streams' model state.

An engine may run several schedulers (``EngineOptions.schedulers``), each over its own
disjoint set of streams and cache slots, each on its own thread: the chunk step (a frozen
graph) and most of the per-batch tensor work run without the GIL, so they run on as many
cores at once.

Each tick it
0. under surge (``EngineOptions.surge``; asr_core/surge.py), every ``sample_interval_s``, feeds
   its lag (or the finals' past ``finals_reduce_ms``, ``surge_lag_ms``) to its
   ``SurgeController`` and moves the streams it names to a longer or shorter
   chunk, between their chunks, and keeps each chunk size's measured cost (``costs``) for the
   engine's admission check,
1. moves every stream's queued audio into its fbank extractor,
2. collects the streams whose next chunk is complete,
3. groups them by chunk shape (chunk size, input frames) -- one bucket per shape, so streams
   with different chunk sizes are all served, each by its own batched forward; a stream's
   short last chunk joins its full chunk's bucket where the runner takes it padded
   (``ChunkRunner.pads_short_chunks``, see ``_pad_short_chunks``),
4. forms batches of up to ``max_batch`` (a group smaller than that waits at most
   ``max_wait_ms`` for more streams, unless every stream of that chunk size is already in it),
5. runs ONE ``ChunkRunner.step`` per batch (on the pool's caches where they lie, or on a
   gathered copy: ``ChunkRunner.reads_pool``), ring-writes the new keys/values, takes the CTC
   top-k, updates greedy partials and endpoint counters with array operations,
6. hands every utterance that ended in this tick to the ``Finalizer`` and moves its stream on.

Oldest-ready-first ordering keeps it fair: a stream never waits behind newer chunks. When a
chunk's latency exceeds ``behind_ms`` the scheduler counts it and logs (rate-limited) that it
is behind real time; audio is never dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch

from asr_core import memtrim
from asr_core.backends import ChunkRunner, ChunkStepInputs
from asr_core.capacity import ChunkCosts
from asr_core.endpoint import (
    LEADING_SILENCE,
    NO_ENDPOINT,
    REASONS,
    TRAILING_SILENCE,
    loud_frames,
    silence_ends_inside,
    update_endpoints,
)
from asr_core.engine_options import EngineOptions
from asr_core.engine_stats import EngineStats
from asr_core.events import Partial
from asr_core.finalizer import EndJob, Finalizer, FinalJob, UtteranceSnapshot, deliver
from asr_core.frontend import DEFAULT_FRONTEND, FrontendConfig, encoder_frame_ms, fbank_windows, window_samples
from asr_core.stream import Stream, chunk_output_frames
from asr_core.surge import SurgeController, SurgeStream, surge_lag_ms
from kv_ring import KvPool

log = logging.getLogger(__name__)

FULL_LOAD = 0.9
"""Share of a scheduler's time its batches may take before it counts as full: the rest of
its tick (draining inboxes, forming batches, events) is not in the measured batch times."""


class Scheduler:
    """The batching loop over the open streams (``streams``, guarded by ``lock``).

    ``text`` maps token ids to text. ``wakeup`` is set by streams when audio arrives.
    ``name`` names its thread. The shared ``stats`` are updated under ``stats.lock``.
    """

    def __init__(
        self,
        options: EngineOptions,
        *,
        pool: KvPool,
        runner: ChunkRunner,
        finalizer: Finalizer,
        text: Callable[[Iterable[int]], str],
        stats: EngineStats,
        device: torch.device,
        subsampling: int,
        right_context: int,
        blank: int,
        frontend: FrontendConfig = DEFAULT_FRONTEND,
        name: str = "asr-engine",
    ) -> None:
        self.name = name
        self.options = options
        self.pool = pool
        self.runner = runner
        self.finalizer = finalizer
        self.text = text
        self.stats = stats
        self.device = device
        self.subsampling = subsampling
        self.right_context = right_context
        self.frontend = frontend
        self.frame_ms = encoder_frame_ms(frontend, subsampling)
        self._blank = blank
        self.streams: dict[str, Stream] = {}
        self.lock = threading.Lock()
        self.wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_behind_log = 0.0
        self.trims_heap = True  # returns freed heap to the OS (one of an engine's schedulers does)
        self.lag_s = 0.0  # how long the oldest chunk ready at the latest tick had waited (0: none)
        self.surge = SurgeController(options.surge) if options.surge is not None else None
        self._surge_sampled = 0.0  # monotonic time of the controller's latest sample
        self.degraded_streams = 0  # streams above their own chunk size at the latest sample
        self.costs = ChunkCosts()  # measured per chunk size, for admission under surge

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def open_streams(self) -> int:
        return len(self.streams)

    def add(self, stream: Stream) -> None:
        """Schedule ``stream`` from the next tick on; ``ValueError`` if its id is already open."""
        with self.lock:
            if stream.stream_id in self.streams:
                raise ValueError(f"stream id {stream.stream_id!r} is already open")
            self.streams[stream.stream_id] = stream

    @property
    def saturated(self) -> bool:
        """Under surge, at its controller's latest sample: behind with no stream left to move to
        a longer chunk. Always false without surge."""
        return self.surge is not None and self.surge.saturated

    def full_at_longest_chunks(self, behind_ms: float) -> bool:
        """Under surge: no room for one more stream even if every stream ran at the longest
        chunk of its ladder. Only a scheduler that is behind (lag past ``behind_ms``, the rule
        without surge) can be full, so surge never refuses a call the fixed chunks would take;
        then it is full with every stream at its longest chunk already, or when the measured
        costs (``costs``) of its streams at their longest chunks, and one more like them, would
        take more than ``FULL_LOAD`` of its time. A longest size not measured yet gives no
        estimate: it is not full while streams can still move."""
        if self.lag_s * 1000.0 <= behind_ms:
            return False
        if self.surge is None or self.surge.saturated:
            return True
        with self.lock:
            longest = [stream.ladder[-1][0] for stream in self.streams.values()]
        load = self.costs.load(longest) if longest else None
        return load is not None and load * (len(longest) + 1) / len(longest) > FULL_LOAD

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop the thread after its current tick; False if it is still in it after ``timeout`` s."""
        self._stop.set()
        self.wakeup.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def end_open_streams(self) -> int:
        """After ``stop``: end every stream still open with what was decoded of it (a Final of
        its current utterance, then Ended), so that its owner always learns that it ended.
        Audio not decoded yet is lost. Returns how many streams were cut short."""
        with self.lock:
            streams = list(self.streams.values())
        detected = time.monotonic()
        for stream in streams:
            utt = stream.utterance
            if utt.tokens:
                self.finalizer.submit(FinalJob(stream, "closed", UtteranceSnapshot.of(utt, stream.chunk_ms), detected))
            self._retire(stream)
        return len(streams)

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        trim = memtrim.Periodic(self.options.trim_interval_s)
        while not self._stop.is_set():
            if self.trims_heap:
                trim()
            try:
                timeout = self.run_once()
            except Exception:
                # A bug or a device error must not silently stop every call's recognition:
                # log it, count it, keep serving (the failed batch's chunks are lost).
                with self.stats.lock:
                    self.stats.errors += 1
                log.exception("engine tick failed")
                timeout = 0.1
            if timeout > 0:
                self.wakeup.wait(timeout)
                self.wakeup.clear()

    def run_once(self) -> float:
        """One scheduler tick; returns how long to wait for new audio (0: work may remain).

        Public so tests and offline tools can drive the engine without its thread.
        """
        with self.lock:
            streams = list(self.streams.values())
        ready: list[tuple[Stream, int]] = []
        ending: list[tuple[Stream, str]] = []
        now = time.monotonic()
        if self.surge is not None and now - self._surge_sampled >= self.surge.settings.sample_interval_s:
            self._apply_surge(streams, now)
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

        self.lag_s = now - min(stream.ready_since for stream, _ in ready) if ready else 0.0
        wait = self.options.max_wait_ms / 1000.0
        ran = False
        for batch in self._form_batches(ready, now):
            self._process_batch(batch, ending)
            ran = True
        if ending:
            self._finish_streams(ending)
        if not self.finalizer.running:
            self.finalizer.finalize_pending()  # driven without threads (tests, offline tools)
        if ran or ending:
            return 0.0
        return wait if ready else 0.05

    def _apply_surge(self, streams: list[Stream], now: float) -> None:
        """Feed the surge controller this tick's lag (``surge_lag_ms``) and move the streams it
        names, between their chunks (none of them is in a batch now); count the time spent degraded."""
        assert self.surge is not None
        elapsed = now - self._surge_sampled if self._surge_sampled else 0.0
        self._surge_sampled = now
        views = [
            SurgeStream(s.stream_id, s.config.surge_priority, tuple(ms for ms, _ in s.ladder), s.chunk_ms)
            for s in streams
            if len(s.ladder) > 1
        ]
        lag_ms = surge_lag_ms(self.surge.settings, self.lag_s * 1000.0, self.finalizer.lag_s(now) * 1000.0)
        moves = self.surge.decide(now, lag_ms, views)
        by_id = {stream.stream_id: stream for stream in streams}
        up = 0
        for move in moves:
            stream = by_id[move.stream_id]
            up += move.chunk_ms > stream.chunk_ms
            stream.set_chunk(move.chunk_ms, move.chunk_ms // self.frame_ms, now)
        degraded = sum(1 for s in streams if s.degraded_since)
        with self.stats.lock:
            self.stats.degraded_stream_seconds += self.degraded_streams * elapsed
            self.stats.chunk_moves_up += up
            self.stats.chunk_moves_down += len(moves) - up
        self.degraded_streams = degraded
        if moves:
            log.info(
                "%s: lag %.0f ms, %d streams moved %s a chunk size; %d of %d degraded",
                self.name, self.lag_s * 1000.0, len(moves), "up" if up else "down", degraded, len(streams),
            )  # fmt: skip

    def _form_batches(self, ready: list[tuple[Stream, int]], now: float) -> Iterable[list[tuple[Stream, int]]]:
        groups: dict[tuple[int, int], list[tuple[Stream, int]]] = {}
        for stream, frames in ready:
            groups.setdefault((stream.chunk_frames, self._input_frames(stream, frames)), []).append((stream, frames))
        active_per_chunk: dict[int, int] = {}
        with self.lock:
            for stream in self.streams.values():
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

    def _input_frames(self, stream: Stream, frames: int) -> int:
        """Fbank frames the step runs for a chunk of ``frames``: a short last chunk is padded to
        the full chunk's ``stream.window`` where the runner takes it so."""
        return stream.window if self.runner.pads_short_chunks else frames

    @torch.inference_mode()
    def _process_batch(self, batch: list[tuple[Stream, int]], ending: list[tuple[Stream, str]]) -> None:
        batch_started = time.perf_counter()
        streams = [stream for stream, _ in batch]
        frames = self._input_frames(streams[0], batch[0][1])  # T_in of the step, the same for all
        size = len(streams)
        full_chunks = frames == streams[0].window  # the full chunk's shape: a fair cost sample
        length = window_samples(frames, self.frontend)
        audio = np.zeros((size, length), dtype=np.float32)  # (B, samples); zeros past a short chunk
        for row, (stream, count) in enumerate(batch):
            samples = stream.take_chunk_samples(count)
            audio[row, : samples.shape[0]] = samples
        feats = fbank_windows(torch.from_numpy(audio).to(self.device), frames, self.frontend)  # (B, T_in, n_mels)
        real_in = [count for _, count in batch]  # (B,) fbank frames of real audio
        valid: np.ndarray | None = None  # (B,) encoder frames of real audio; None: all of each chunk
        if min(real_in) < frames:
            feats = _pad_short_chunks(feats, real_in)
            real_out = [chunk_output_frames(count, self.subsampling, self.right_context) for count in real_in]
            valid = np.array(real_out, dtype=np.int64)
        xs = feats.to(dtype=self.options.dtype)
        slots = torch.tensor([stream.slot for stream in streams], dtype=torch.int64)
        offsets = torch.tensor([stream.utterance.offset for stream in streams], dtype=torch.int64)
        started = time.perf_counter()
        window = max(stream.cache_frames for stream in streams)  # all they attend over (Engine._step_shape)
        if self.runner.reads_pool:  # the step reads each layer's rows of the pool where they lie
            rows, pos, mask = self.pool.positions(slots, window)
            inputs = ChunkStepInputs(
                xs, offsets.to(self.device), self.pool.attention_cache(window), pos, mask, self.pool.cnn, rows
            )
        else:
            cache = self.pool.gather(slots, reuse_buffer=True, window=window)
            inputs = ChunkStepInputs(xs, offsets.to(self.device), cache.att, cache.pos, cache.mask, cache.cnn)
        lengths = None if valid is None else torch.from_numpy(valid)
        if lengths is not None:
            inputs = inputs._replace(valid_frames=lengths.to(self.device))
        ys, log_probs, new_kv, new_cnn = self.runner.step(inputs)  # ys (B, C, D), log_probs (B, C, V)
        chunk = ys.shape[1]
        positions = offsets.unsqueeze(1) + torch.arange(chunk, dtype=torch.int64).unsqueeze(0)  # (B, C)
        self.pool.write(slots, new_kv, positions, new_cnn, lengths)  # a padded row's real frames only
        top_values, top_ids = log_probs.topk(self.options.beam, dim=-1)  # (B, C, k)
        blank_prob = log_probs[..., self._blank].exp().cpu().numpy()  # (B, C)
        top_values_np = top_values.cpu().numpy()
        top_ids_np = top_ids.cpu().numpy()
        forward_ms = (time.perf_counter() - started) * 1000.0

        real = np.full(size, chunk, dtype=np.int64) if valid is None else valid  # (B,) frames kept per row
        rules = self.options.endpoint
        trailing = np.array([s.utterance.trailing_frames for s in streams], dtype=np.int64)
        utt_frames = np.array([s.utterance.offset for s in streams], dtype=np.int64)
        loud = self._loud_frames(streams, feats, chunk, valid) if rules.energy_gate_db > 0 else None
        best = top_ids_np[:, :, 0]  # (B, C)
        nonblank = best != self._blank  # (B, C)
        ends_inside: np.ndarray | None = None  # (B,) bool: utterances that ended inside the chunk
        if rules.check_every_frame:
            had_tokens = np.array([bool(s.utterance.tokens) for s in streams])
            split = silence_ends_inside(rules, self.frame_ms, blank_prob, trailing, had_tokens, nonblank, loud, valid)
            if split.any():  # those rows keep the frames up to the endpoint: the rest is read again
                ends_inside = split > 0
                real = np.where(ends_inside, split, real)
        decoded_any = self._update_greedy(streams, best, real)
        codes = update_endpoints(
            rules, self.frame_ms, blank_prob, trailing, utt_frames, decoded_any, loud,
            valid if ends_inside is None else real, nonblank,
        )  # fmt: skip

        now = time.monotonic()
        latencies: list[float] = []
        for i, stream in enumerate(streams):
            utt = stream.utterance
            kept = int(real[i])
            utt.offset += kept
            utt.trailing_frames = int(trailing[i])
            utt.topk_values.append(top_values_np[i, :kept])
            utt.topk_ids.append(top_ids_np[i, :kept])
            utt.encoder_out.append(ys[i, :kept].clone())
            latency_ms = (now - stream.ready_since) * 1000.0
            latencies.append(latency_ms)
            if utt.changed or stream.config.emit_unchanged_partials:
                self._emit_partial(stream, latency_ms, stream.ready_since)
                utt.changed = False
            stream.ready_since = 0.0
            if codes[i] != NO_ENDPOINT:
                ending.append((stream, REASONS[int(codes[i])]))
            if ends_inside is not None and ends_inside[i]:
                # Its kept frames end in the silence that met the rule: it ends now, and the
                # rest of the chunk is read again on the next utterance's fresh cache.
                assert codes[i] == TRAILING_SILENCE, f"stream {stream.stream_id}: split without an endpoint"
                stream.rewind(kept)
        behind = [ms for ms in latencies if ms > self.options.behind_ms]
        with self.stats.lock:
            for latency_ms in latencies:
                self.stats.partial_latency_ms.append(latency_ms)
                self.stats.partial_latency_seconds.observe(latency_ms / 1000.0)
            self.stats.chunks += size
            self.stats.batches += 1
            self.stats.batch_sizes.append(size)
            self.stats.batch_size_histogram.observe(size)
            self.stats.forward_ms.append(forward_ms)
            self.stats.step_seconds.observe(forward_ms / 1000.0)
            self.stats.behind_realtime_chunks += len(behind)
            if ends_inside is not None:
                self.stats.endpoints_inside_chunks += int(ends_inside.sum())
        if behind:
            self._note_behind(max(behind))
        if full_chunks:
            self.costs.observe(streams[0].chunk_ms, size, time.perf_counter() - batch_started)

    def _loud_frames(
        self, streams: list[Stream], feats: torch.Tensor, chunk: int, valid: np.ndarray | None
    ) -> np.ndarray:
        """(B, C) bool: new encoder frames whose audio stands out from each stream's noise floor.

        A frame's energy is the loudest of the fbank frames it is computed from (its subsampling
        window), each fbank frame's energy the log of its total mel power. ``valid`` (B,): real
        frames per row (padding neither loud nor moving the floor); None: all."""
        window = self.right_context + 1
        energy = torch.logsumexp(feats.float(), dim=-1)  # (B, T_in)
        per_frame = energy.unfold(1, window, self.subsampling)[:, :chunk].amax(dim=-1).cpu().numpy()  # (B, C)
        floors = np.array([s.noise_floor for s in streams], dtype=np.float64)
        loud = loud_frames(per_frame.astype(np.float64), floors, self.options.endpoint.energy_gate_db, valid)
        for stream, floor in zip(streams, floors.tolist(), strict=True):
            stream.noise_floor = floor
        return loud

    def _update_greedy(self, streams: list[Stream], best: np.ndarray, real: np.ndarray) -> np.ndarray:
        """CTC greedy over the new frames of every stream, the first ``real`` (B,) of each row
        (the rest padding); returns (B,) 'utterance has text'."""
        previous = np.array([s.utterance.last_token for s in streams], dtype=np.int64)  # (B,)
        shifted = np.concatenate([previous[:, None], best[:, :-1]], axis=1)  # (B, C)
        kept = np.arange(best.shape[1])[None, :] < real[:, None]  # (B, C)
        emit = (best != self._blank) & (best != shifted) & kept  # (B, C)
        rows, cols = np.nonzero(emit)
        for row, col in zip(rows.tolist(), cols.tolist(), strict=True):
            utt = streams[row].utterance
            utt.tokens.append(int(best[row, col]))
            utt.token_frames.append(utt.offset + col)
            utt.changed = True
        for i, stream in enumerate(streams):
            stream.utterance.last_token = int(best[i, real[i] - 1])
        return np.array([bool(s.utterance.tokens) for s in streams])

    def _note_behind(self, latency_ms: float) -> None:
        now = time.monotonic()
        if now - self._last_behind_log > 10.0:
            self._last_behind_log = now
            log.warning(
                "engine behind real time: chunk latency %.0f ms (%d such chunks so far, %d streams)",
                latency_ms,
                self.stats.behind_realtime_chunks,
                self.pool.used_slots,
            )

    def _times_ms(self, stream: Stream, frames: Iterable[int]) -> tuple[int, ...]:
        base = stream.utterance.start_frame
        return tuple((base + f) * self.frame_ms for f in frames)

    def _emit_partial(self, stream: Stream, latency_ms: float, audio_end: float) -> None:
        utt = stream.utterance
        event = Partial(
            stream_id=stream.stream_id,
            utterance_id=utt.utterance_id,
            seq=stream.next_seq(),
            text=self.text(utt.tokens),
            tokens=tuple(utt.tokens),
            token_times_ms=self._times_ms(stream, utt.token_frames),
            begin_ms=utt.start_frame * self.frame_ms,
            end_ms=(utt.start_frame + utt.offset) * self.frame_ms,
            latency_ms=latency_ms,
            audio_end_monotonic=audio_end,
            chunk_ms=stream.chunk_ms,
        )
        deliver(stream, event)

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
                self.finalizer.submit(FinalJob(stream, reason, UtteranceSnapshot.of(utt, stream.chunk_ms), detected))
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
        with self.lock:
            self.streams.pop(stream.stream_id, None)
        self.pool.release(stream.slot)
        reason = "closed" if stream.closing else "input_finished"
        self.finalizer.submit(EndJob(stream, reason, stream.received_ms))


def _pad_short_chunks(feats: torch.Tensor, real_frames: list[int]) -> torch.Tensor:
    """feats: (B, T_in, n_mels) fbank of chunks of which row b has ``real_frames[b]`` frames of
    real audio (a short last chunk) -> the same with each row's later frames a copy of its last
    real frame.

    A short last chunk runs in its full chunk's traced graph instead of eagerly at its own shape.
    WeNet's runtime decodes the shorter chunk (its frames attend to real frames only); sherpa-onnx
    pads the tail with silence, which the real frames of the chunk then attend to. We keep WeNet's
    result in sherpa's shape: the padded frames are masked out as attention keys and kept out of
    the conv cache (``ChunkStepInputs.valid_frames``), and the subsampling reads no padded frame for
    a real output frame, so in float the real frames come out as the short chunk's. What the
    padding holds then matters only to int8's activation scales, taken per call over the whole
    batch: a copy of the last real frame stays within the range of the real ones, where digital
    zeros (dither 0) give log(float32 eps) = -15.9 in every bin, far below any frame the model
    was trained on. Bundled demo model, a 20-frame last chunk of the seed recording at 320 ms:
    in float its log-probs equal the short step's; in int8 they move by up to 0.69 (0.82 with
    zeros), as batching it with another stream moves them today (0.78); unmasked, by 3.5.
    """
    frames = feats.size(1)
    last = torch.tensor(real_frames, dtype=torch.int64, device=feats.device).unsqueeze(1) - 1  # (B, 1)
    index = torch.minimum(torch.arange(frames, device=feats.device).unsqueeze(0), last)  # (B, T_in)
    return feats.gather(1, index.unsqueeze(2).expand(-1, -1, feats.size(2)))
