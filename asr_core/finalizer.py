"""The engine's finalizer: the queues of ended utterances and the threads that turn them into
``Final`` events (and retired streams into ``Ended``), off the scheduler threads.

The scheduler hands over an utterance at its endpoint and moves the stream on at once, so
finals never delay partials. Each finalizer thread (``workers`` of them, one lane each) takes
up to ``FINALIZE_BATCH`` jobs at a time from its own queue and runs their search
(``asr_core.finals``: prefix beam search, attention rescoring) in that thread (``FinalSearch``)
or in its child process (``ProcessFinalSearch``, CPU only), then emits the events in job
order. A stream's jobs all go to one lane, so its events stay in order. Without the threads
(``run_once`` drivers: tests, offline tools) ``finalize_pending`` does the same work in the
caller's thread.

Under surge (``EngineOptions.surge``) a batch whose oldest utterance has waited that long, or
any batch while the engine is saturated (asr_core/surge.py ``finals_reduction``), is searched
with ``FinalSettings.reduced`` settings (a narrower beam, no decoder proposals): the finals
catch up before they queue long enough to make the node refuse calls, and leave a saturated
engine's schedulers the CPU. Those finals say so, and why (``Final.reduced_search``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from asr_common.draining import wait_while_progressing
from asr_core.ctc_search import Hypothesis
from asr_core.engine_stats import EngineStats
from asr_core.events import Ended, Event, Final, NBestEntry
from asr_core.finals import WORKER_NICENESS, FinalRequest, FinalSearch, FinalSettings, ProcessFinalSearch
from asr_core.stream import Stream, UtteranceState
from asr_core.surge import FinalsReduction, SurgeSettings, finals_reduction
from rescoring.attention import RescoreResult

log = logging.getLogger(__name__)

FINALIZER_NICENESS = 5
# Utterances rescored in one decoder call: enough to batch, few enough that a burst of
# hang-ups neither makes every final wait for the whole burst nor spikes memory.
FINALIZE_BATCH = 16


def deliver(stream: Stream, event: Event) -> None:
    """Hand ``event`` to the stream's callback; a failing callback loses that event only."""
    try:
        stream.on_event(event)
    except Exception:
        log.exception("event callback of stream %s failed; event dropped", stream.stream_id)


@dataclass(frozen=True, slots=True)
class UtteranceSnapshot:
    """What finalizing an utterance needs, detached from the stream (which moves on)."""

    utterance_id: int
    start_frame: int
    offset: int
    topk_values: list[np.ndarray]
    topk_ids: list[np.ndarray]
    encoder_out: list[torch.Tensor]
    chunk_ms: int  # in force at its last chunk

    @classmethod
    def of(cls, utt: UtteranceState, chunk_ms: int) -> UtteranceSnapshot:
        return cls(
            utt.utterance_id, utt.start_frame, utt.offset, utt.topk_values, utt.topk_ids, utt.encoder_out, chunk_ms
        )


@dataclass(frozen=True, slots=True)
class FinalJob:
    stream: Stream
    reason: str
    utterance: UtteranceSnapshot
    detected: float  # monotonic time the endpoint was detected, s


@dataclass(frozen=True, slots=True)
class EndJob:
    stream: Stream
    reason: str
    audio_ms: int


Job = FinalJob | EndJob


class _Lane:
    """One worker of the finalizer: its job queue, its thread and its search (this thread's
    ``FinalSearch`` or a ``ProcessFinalSearch`` child)."""

    def __init__(self, index: int, search: FinalSearch) -> None:
        self.index = index
        self.search: FinalSearch | ProcessFinalSearch = search
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.completed = 0  # jobs finished (progress, for stop)
        self.busy_since = 0.0  # detection time of the oldest utterance in the batch being searched (0: none)

    def oldest_waiting(self, now: float) -> float:
        """Detection time of the oldest utterance queued or being searched here (``now``: none)."""
        oldest = self.busy_since or now
        with self.jobs.mutex:  # the queue's own lock; jobs arrive in detection order (per lane)
            for job in self.jobs.queue:
                if isinstance(job, FinalJob):
                    return min(oldest, job.detected)
        return oldest

    def drain(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        while len(jobs) < limit:
            try:
                jobs.append(self.jobs.get_nowait())
            except queue.Empty:
                break
        return jobs


class Finalizer:
    """Owns the finals' job queues, the finalizer threads and their searches (thread or process).

    ``text`` maps token ids to text; ``frame_ms`` is the duration of one encoder frame;
    ``stats`` gets the finals' count, latency and errors. ``workers`` lanes (a thread each,
    with a child process each when started with a decoder) search at once; a stream's jobs
    always go to the same lane, so its Finals and its Ended are emitted in order.
    """

    def __init__(
        self,
        search: FinalSearch,
        text: Callable[[Iterable[int]], str],
        frame_ms: int,
        stats: EngineStats,
        workers: int = 1,
        surge: SurgeSettings | None = None,
        saturated: Callable[[], bool] = lambda: False,
    ) -> None:
        """With ``surge``, finals that waited its ``finals_reduce_ms``, and all finals while
        ``saturated()`` says the engine is (with its ``finals_reduce_when_saturated``), are
        searched with the cheaper settings (a beam of at most its ``finals_beam``, no proposals).
        ``saturated`` is asked once per batch, from the finalizer's threads."""
        if workers < 1:
            raise ValueError(f"finals workers must be at least 1, got {workers}")
        self.surge = surge
        self.saturated = saturated
        self.reduced_settings: FinalSettings = search.settings.reduced(
            surge.finals_beam if surge else search.settings.beam
        )
        self.local_search = search
        self.text = text
        self.frame_ms = frame_ms
        self.stats = stats
        self._lanes = [_Lane(index, search) for index in range(workers)]
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self._lanes[0].thread is not None

    @property
    def searches(self) -> list[FinalSearch | ProcessFinalSearch]:
        """Each lane's search (the same ``local_search`` for lanes without a child process)."""
        return [lane.search for lane in self._lanes]

    @property
    def completed(self) -> int:
        """Jobs the threads have finished (progress, for stop)."""
        return sum(lane.completed for lane in self._lanes)

    def submit(self, job: Job) -> None:
        self._lane_of(job.stream).jobs.put(job)

    def _lane_of(self, stream: Stream) -> _Lane:
        lanes = self._lanes
        return lanes[0] if len(lanes) == 1 else lanes[zlib.crc32(stream.stream_id.encode()) % len(lanes)]

    def lag_s(self, now: float | None = None) -> float:
        """How long the oldest utterance not finalized yet (queued or being searched) has waited
        since its endpoint, in seconds; 0 when none waits."""
        now = time.monotonic() if now is None else now
        return max(0.0, now - min(lane.oldest_waiting(now) for lane in self._lanes))

    def start(
        self, *, process_decoder: torch.nn.Module | None = None, backend: str = "torch",
        niceness: int = WORKER_NICENESS, traced: bool = True,
    ) -> None:  # fmt: skip
        """Start the threads. With ``process_decoder`` (the float decoder; the child applies
        ``backend``'s rescoring variant, traced or not: ``backends.rescoring_decoder``) each lane
        searches in a child process at ``niceness``, or in its thread when the child does not start."""
        self._stop.clear()
        for lane in self._lanes:
            if process_decoder is not None and lane.search is self.local_search:
                try:
                    lane.search = ProcessFinalSearch(
                        process_decoder, backend, self.local_search, niceness, traced=traced
                    )
                except RuntimeError:
                    log.exception("finals process failed to start; finals run in a thread of this process")
            name = "asr-finalizer" if len(self._lanes) == 1 else f"asr-finalizer-{lane.index}"
            lane.thread = threading.Thread(target=self._run, args=(lane,), name=name, daemon=True)
            lane.thread.start()

    def stop(self, timeout: float) -> None:
        """Finish the jobs already queued, however many (giving up only when no job finished
        for ``timeout`` s), stop the threads and the child processes, if any."""
        self._stop.set()
        threads = [lane.thread for lane in self._lanes if lane.thread is not None]
        for lane in self._lanes:
            lane.thread = None
        if threads and not wait_while_progressing(lambda: not any(t.is_alive() for t in threads),
                                                  lambda: self.completed, timeout):  # fmt: skip
            queued = sum(lane.jobs.qsize() for lane in self._lanes)
            log.error("finalizer stalled for %.0f s; %d queued utterances get no Final", timeout, queued)
        for lane in self._lanes:
            if lane.search is not self.local_search:
                lane.search.close()
                lane.search = self.local_search

    def _run(self, lane: _Lane) -> None:
        torch.set_grad_enabled(False)
        # Finals may wait a little; partials may not. On Linux a thread has its own nice
        # value, so the scheduler thread wins the CPU when both have work.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), FINALIZER_NICENESS)
        while not self._stop.is_set() or not lane.jobs.empty():
            try:
                first = lane.jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            jobs = [first, *lane.drain(FINALIZE_BATCH - 1)]
            detected = [job.detected for job in jobs if isinstance(job, FinalJob)]
            lane.busy_since = min(detected) if detected else 0.0
            try:
                self._finalize(jobs, lane.search)
            except Exception:
                with self.stats.lock:  # shared with the schedulers
                    self.stats.errors += 1
                log.exception("finalizing utterances failed")
                self._end_streams(jobs)  # their Finals are lost; their owners still learn the streams ended
            finally:
                lane.busy_since = 0.0
            lane.completed += len(jobs)

    def finalize_pending(self) -> None:
        """Run queued finalizations in the caller's thread (when the finalizer threads are not running)."""
        for lane in self._lanes:
            jobs = lane.drain(limit=1 << 30)
            if jobs:
                self._finalize(jobs, self.local_search)

    def _end_streams(self, jobs: list[Job]) -> None:
        """Ended for each retired stream among ``jobs`` that did not get it yet."""
        for job in jobs:
            if isinstance(job, EndJob) and not job.stream.done.is_set():
                self._end(job)

    def _end(self, job: EndJob) -> None:
        deliver(job.stream, Ended(job.stream.stream_id, job.stream.next_seq(), job.reason, job.audio_ms))
        job.stream.done.set()

    def _finalize(self, jobs: list[Job], search: FinalSearch | ProcessFinalSearch) -> None:
        """Prefix beam search per utterance, ONE rescoring call for all of them, events in job order."""
        finals = [job for job in jobs if isinstance(job, FinalJob)]
        requests = [
            FinalRequest(
                np.concatenate(job.utterance.topk_values),
                np.concatenate(job.utterance.topk_ids),
                torch.cat(job.utterance.encoder_out, dim=0) if job.stream.config.rescore else None,
                job.stream.config.context,
                job.stream.config.attention_beam,
            )
            for job in finals
        ]
        reduced: FinalsReduction | None = None
        if self.surge is not None and finals:
            waited_ms = (time.monotonic() - min(job.detected for job in finals)) * 1000.0
            reduced = finals_reduction(self.surge, saturated=self.saturated(), waited_ms=waited_ms)
        results = search.run(requests, self.reduced_settings if reduced is not None else None) if requests else []
        if reduced is not None:
            with self.stats.lock:
                self.stats.reduced_finals_by_reason[reduced] += len(finals)
        nbests = [result.nbest for result in results]
        rescored = {i: result.rescored for i, result in enumerate(results) if result.rescored is not None}
        index = {id(job): i for i, job in enumerate(finals)}
        for job in jobs:
            if isinstance(job, EndJob):
                self._end(job)
                continue
            i = index[id(job)]
            self._emit_final(job, nbests[i], rescored.get(i), reduced)

    def _emit_final(
        self, job: FinalJob, nbest: list[Hypothesis], result: RescoreResult | None, reduced: FinalsReduction | None
    ) -> None:
        utt, stream = job.utterance, job.stream
        if result is not None:
            entries = tuple(
                NBestEntry(h.tokens, self.text(h.tokens), h.score, h.ctc_score, h.l2r_score, h.r2l_score)
                for h in result.hypotheses
            )
            best_times, confidence = result.times, result.confidence
        else:
            entries = tuple(NBestEntry(h.tokens, self.text(h.tokens), h.score, h.score) for h in nbest)
            best_times, confidence = nbest[0].times, ctc_confidence(entries)
        best = entries[0]
        now = time.monotonic()
        latency_ms = (now - job.detected) * 1000.0
        with self.stats.lock:  # several finalizer threads, and readers
            self.stats.final_latency_ms.append(latency_ms)
            self.stats.final_latency_seconds.observe(latency_ms / 1000.0)
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
            chunk_ms=utt.chunk_ms,
            reduced_search=reduced,
        )
        deliver(stream, event)


def ctc_confidence(entries: tuple[NBestEntry, ...]) -> float:
    """Posterior of the best hypothesis among the n-best (softmax over their CTC scores)."""
    scores = np.array([e.ctc_score for e in entries], dtype=np.float64)
    if scores.size == 0:
        return 0.0
    weights = np.exp(scores - scores.max())
    return float(weights[0] / weights.sum())
