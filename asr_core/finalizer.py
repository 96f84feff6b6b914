"""The engine's finalizer: the queue of ended utterances and the thread that turns them into
``Final`` events (and retired streams into ``Ended``), off the scheduler thread.

The scheduler hands over an utterance at its endpoint and moves the stream on at once, so
finals never delay partials. The finalizer thread takes up to ``FINALIZE_BATCH`` jobs at a
time and runs their search (``asr_core.finals``: prefix beam search, attention rescoring) in
this thread (``FinalSearch``) or in a child process (``ProcessFinalSearch``, CPU only), then
emits the events in job order. Without the thread (``run_once`` drivers: tests, offline tools)
``finalize_pending`` does the same work in the caller's thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from asr_common.draining import wait_while_progressing
from asr_core.ctc_search import Hypothesis
from asr_core.events import Ended, Event, Final, NBestEntry
from asr_core.finals import FinalRequest, FinalSearch, ProcessFinalSearch
from asr_core.stream import Stream, Utterance
from rescoring.attention import RescoreResult

if TYPE_CHECKING:
    from asr_core.engine import EngineStats

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

    @classmethod
    def of(cls, utt: Utterance) -> UtteranceSnapshot:
        return cls(utt.utterance_id, utt.start_frame, utt.offset, utt.topk_values, utt.topk_ids, utt.encoder_out)


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


class Finalizer:
    """Owns the finals' job queue, the finalizer thread and the search (thread or process).

    ``text`` maps token ids to text; ``frame_ms`` is the duration of one encoder frame;
    ``stats`` gets the finals' count, latency and errors.
    """

    def __init__(
        self, search: FinalSearch, text: Callable[[Iterable[int]], str], frame_ms: int, stats: EngineStats
    ) -> None:
        self.local_search = search
        self.search: FinalSearch | ProcessFinalSearch = search
        self.text = text
        self.frame_ms = frame_ms
        self.stats = stats
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.completed = 0  # jobs the thread has finished (progress, for stop)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def start(self, *, process_decoder: torch.nn.Module | None = None, backend: str = "torch") -> None:
        """Start the thread. With ``process_decoder`` (the float decoder; the child applies
        ``backend``'s rescoring variant) the batches are searched in a child process, or in
        this thread when the child does not start."""
        if process_decoder is not None and self.search is self.local_search:
            try:
                self.search = ProcessFinalSearch(process_decoder, backend, self.local_search)
            except RuntimeError:
                log.exception("finals process failed to start; finals run in a thread of this process")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="asr-finalizer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Finish the jobs already queued, however many (giving up only when no job finished
        for ``timeout`` s), stop the thread and the child process, if any."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and not wait_while_progressing(lambda: not thread.is_alive(), lambda: self.completed,
                                                             timeout):  # fmt: skip
            log.error("finalizer stalled for %.0f s; %d queued utterances get no Final", timeout, self._jobs.qsize())
        if self.search is not self.local_search:
            self.search.close()
            self.search = self.local_search

    def _run(self) -> None:
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
            jobs = [first, *self._drain(FINALIZE_BATCH - 1)]
            try:
                self._finalize(jobs)
            except Exception:
                with self.stats.lock:  # shared with the schedulers
                    self.stats.errors += 1
                log.exception("finalizing utterances failed")
                self._end_streams(jobs)  # their Finals are lost; their owners still learn the streams ended
            self.completed += len(jobs)

    def _drain(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        while len(jobs) < limit:
            try:
                jobs.append(self._jobs.get_nowait())
            except queue.Empty:
                break
        return jobs

    def finalize_pending(self) -> None:
        """Run queued finalizations in the caller's thread (when the finalizer thread is not running)."""
        jobs = self._drain(limit=1 << 30)
        if jobs:
            self._finalize(jobs)

    def _end_streams(self, jobs: list[Job]) -> None:
        """Ended for each retired stream among ``jobs`` that did not get it yet."""
        for job in jobs:
            if isinstance(job, EndJob) and not job.stream.done.is_set():
                self._end(job)

    def _end(self, job: EndJob) -> None:
        deliver(job.stream, Ended(job.stream.stream_id, job.stream.next_seq(), job.reason, job.audio_ms))
        job.stream.done.set()

    def _finalize(self, jobs: list[Job]) -> None:
        """Prefix beam search per utterance, ONE rescoring call for all of them, events in job order."""
        finals = [job for job in jobs if isinstance(job, FinalJob)]
        requests = [
            FinalRequest(
                np.concatenate(job.utterance.topk_values),
                np.concatenate(job.utterance.topk_ids),
                torch.cat(job.utterance.encoder_out, dim=0) if job.stream.config.rescore else None,
                job.stream.config.context,
            )
            for job in finals
        ]
        search = self.search if self._thread is not None else self.local_search
        results = search.run(requests) if requests else []
        nbests = [result.nbest for result in results]
        rescored = {i: result.rescored for i, result in enumerate(results) if result.rescored is not None}
        index = {id(job): i for i, job in enumerate(finals)}
        for job in jobs:
            if isinstance(job, EndJob):
                self._end(job)
                continue
            i = index[id(job)]
            self._emit_final(job, nbests[i], rescored.get(i))

    def _emit_final(self, job: FinalJob, nbest: list[Hypothesis], result: RescoreResult | None) -> None:
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
        )
        deliver(stream, event)


def ctc_confidence(entries: tuple[NBestEntry, ...]) -> float:
    """Posterior of the best hypothesis among the n-best (softmax over their CTC scores)."""
    scores = np.array([e.ctc_score for e in entries], dtype=np.float64)
    if scores.size == 0:
        return 0.0
    weights = np.exp(scores - scores.max())
    return float(weights[0] / weights.sum())
