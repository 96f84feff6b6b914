"""The finals' search: CTC prefix beam search on stored top-k posteriors, then attention rescoring.

With ``attention_beam`` > 0 (``FinalSettings``, the engine's; a request, i.e. a stream's
route, may set its own) the attention decoder's own beam search (WeNet's "attention"
mode, ``rescoring.attention_search``) proposes hypotheses too ("joint" finals; the service's
default is 0, WeNet's attention rescoring of the CTC n-best). They join the CTC n-best, every
member is scored by CTC's forward algorithm on the same stored posteriors, and the bidirectional
rescoring picks among all of them. On the bundled demo model, whose CTC head is much weaker
than its decoder, this cut the finals' CER at 320 ms chunks from 46.6 % to 21.3 % (fifth
release), from 19.5 % to 15.2 % (sixth), from 9.9 % to 9.0 % (seventh), from 8.9 % to 8.0 %
(eighth) and from 8.0 % to 7.0 % (ninth; docs/BENCHMARKS.md).

Two runners with one interface (``run(requests) -> results``):

- ``FinalSearch`` runs in the calling thread.
- ``ProcessFinalSearch`` runs the same code in a child process. The search is mostly small
  numpy operations and the decoder call is glue between torch operations, so in a thread it
  holds the GIL most of the time; every Python step of the engine's scheduler thread (and of
  the gateway's RTP loop) then queues behind it, and partial latency grows long before the
  CPU is spent. In its own process it runs beside them. The child gets a copy of the decoder
  at start-up; requests and results are plain arrays and dataclasses sent over a pipe. A child
  that dies or stops answering is replaced, and the batch it held is searched in the calling
  thread, so no final is lost.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast

import numpy as np
import torch

from asr_common.proc_cpu import process_cpu_seconds
from asr_core import memtrim
from asr_core.context_graph import ContextGraph
from asr_core.ctc_search import Hypothesis, ctc_prefix_beam_search_topk, ctc_scores_topk, ctc_token_frames_topk
from asr_core.model.loader import LoadedModel
from rescoring.attention import RescoreResult, attention_rescore
from rescoring.attention_search import StepDecoder, attention_beam_search, supports_search
from rescoring.protocols import DecoderFn

__all__ = ["FinalRequest", "FinalResult", "FinalSearch", "FinalSettings", "ProcessFinalSearch"]

log = logging.getLogger(__name__)

WORKER_NICENESS = 15  # the default: finals may wait a little; partials may not (EngineOptions.finals_niceness)
REPLY_TIMEOUT_S = 120.0  # a batch taking longer than this means the child is stuck
START_TIMEOUT_S = 120.0  # importing torch and building the decoder
PROPOSAL_LENGTH_FACTOR = 2  # attention proposals: at most 2 x the longest CTC hypothesis + 4 tokens
PROPOSAL_LENGTH_SLACK = 4


@dataclass(frozen=True, slots=True)
class FinalSettings:
    beam: int
    blank: int
    sos: int
    eos: int
    ctc_weight: float
    reverse_weight: float
    attention_beam: int = 0  # > 0: add this many attention-decoder proposals to each n-best
    vocab_size: int = 0  # CTC output size; needed to score proposals (see ctc_scores_topk)
    proposals: bool = True  # False: no decoder proposals, whatever a request's attention beam (surge)

    def reduced(self, beam: int) -> FinalSettings:
        """The cheaper search finals get under surge: a beam of at most ``beam``, no proposals
        (not even for a route's joint finals)."""
        return replace(self, beam=min(self.beam, beam), attention_beam=0, proposals=False)

    @classmethod
    def for_model(
        cls, loaded: LoadedModel, *, beam: int, ctc_weight: float, reverse_weight: float, attention_beam: int = 0
    ) -> FinalSettings:
        """The settings with the model's own ids (blank, sos, eos) and vocabulary size."""
        return cls(
            beam, loaded.blank_id, loaded.sos_id, loaded.eos_id, ctc_weight, reverse_weight,
            attention_beam, loaded.vocab_size,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class FinalRequest:
    """One ended utterance: per-frame CTC top-k and, when it is rescored, its encoder output."""

    topk_values: np.ndarray  # (T, k) float32
    topk_ids: np.ndarray  # (T, k) int64
    encoder_out: torch.Tensor | np.ndarray | None  # (T, D); None: no rescoring
    context: ContextGraph | None = None  # the stream's hotwords; None: no biasing
    attention_beam: int | None = None  # the stream's decoder proposals (0: rescore); None: FinalSettings'

    def portable(self) -> FinalRequest:
        """The request with its encoder output as a float32 numpy array (to send to a process)."""
        out = self.encoder_out
        if isinstance(out, torch.Tensor):
            out = out.detach().to("cpu", torch.float32).numpy()
        return FinalRequest(self.topk_values, self.topk_ids, out, self.context, self.attention_beam)


@dataclass(frozen=True, slots=True)
class FinalResult:
    nbest: list[Hypothesis]
    rescored: RescoreResult | None


class FinalSearch:
    """Prefix beam search per utterance, then ONE batched rescoring call for all of them."""

    def __init__(self, decoder: DecoderFn, settings: FinalSettings, proposer: DecoderFn | None = None) -> None:
        """``decoder`` rescores; ``proposer`` (default: ``decoder``) runs the attention beam search
        that proposes hypotheses (``attention_beam`` > 0). Its scores are not kept, only its
        hypotheses, so it may differ from ``decoder``: the int8 backends propose with the float
        decoder, whose search steps (a few rows each) ran faster than int8 Linears that quantize
        their input at every call (demo model, proposals of 32 utterances: docs/BENCHMARKS.md)."""
        if settings.attention_beam > 0 and settings.vocab_size <= 0:
            raise ValueError("FinalSettings.attention_beam > 0 needs vocab_size (the CTC output size)")
        self.decoder = decoder
        self.proposer = decoder if proposer is None else proposer
        self.settings = settings
        # Encoder outputs are moved to the decoder's device and float dtype (a float32 cpu
        # default for decoders that are not modules, or whose Linears are packed int8).
        reference = next(iter(_parameters(decoder)), torch.empty(0))
        self._device, self._dtype = reference.device, reference.dtype

    @torch.inference_mode()
    def run(self, requests: list[FinalRequest], settings: FinalSettings | None = None) -> list[FinalResult]:
        """The finals of ``requests``, searched with ``settings`` (default: this search's own;
        the finalizer passes ``FinalSettings.reduced`` ones under surge)."""
        s = settings or self.settings
        nbests = [ctc_prefix_beam_search_topk(r.topk_values, r.topk_ids, s.beam, s.blank, r.context) for r in requests]
        to_rescore = [i for i, r in enumerate(requests) if r.encoder_out is not None and nbests[i]]
        rescored: dict[int, RescoreResult] = {}
        if to_rescore:
            encoder_outs = []
            for i in to_rescore:
                out = requests[i].encoder_out
                assert out is not None
                encoder_outs.append(torch.as_tensor(out).to(self._device, self._dtype))
            candidates = [nbests[i] for i in to_rescore]
            if s.proposals and supports_search(self.proposer):
                candidates = self._with_all_proposals([requests[i] for i in to_rescore], candidates, encoder_outs, s)
            # The hotword bonus the CTC search ranked by joins the rescoring score (None: no list).
            biased = any(requests[i].context is not None for i in to_rescore)
            bonuses = [[h.context_score for h in c] for c in candidates] if biased else None
            results = attention_rescore(
                self.decoder, encoder_outs, candidates,
                ctc_weight=s.ctc_weight, reverse_weight=s.reverse_weight, sos=s.sos, eos=s.eos, bonuses=bonuses,
            )  # fmt: skip
            for i, result in zip(to_rescore, results, strict=True):
                if result.tokens and not result.times:  # a proposal won: align it for token times
                    request = requests[i]
                    times = ctc_token_frames_topk(
                        request.topk_values, request.topk_ids, result.tokens, s.vocab_size, s.blank
                    )
                    result = replace(result, times=times)
                rescored[i] = result
        return [FinalResult(nbest, rescored.get(i)) for i, nbest in enumerate(nbests)]

    def _with_all_proposals(
        self,
        requests: list[FinalRequest],
        nbests: list[list[Hypothesis]],
        encoder_outs: list[torch.Tensor],
        s: FinalSettings,
    ) -> list[list[Hypothesis]]:
        """The n-best lists with proposals where a request's attention beam (its own, else the
        settings') is > 0: one search per beam width in use, the others as they were."""
        beams = [s.attention_beam if r.attention_beam is None else r.attention_beam for r in requests]
        out = list(nbests)
        for beam in sorted({b for b in beams if b > 0}):
            if s.vocab_size <= 0:
                raise ValueError("attention proposals need FinalSettings.vocab_size (the CTC output size)")
            rows = [i for i, b in enumerate(beams) if b == beam]
            merged = self._with_proposals(
                [requests[i] for i in rows], [nbests[i] for i in rows], [encoder_outs[i] for i in rows], beam, s
            )
            for i, nbest in zip(rows, merged, strict=True):
                out[i] = nbest
        return out

    def _with_proposals(
        self,
        requests: list[FinalRequest],
        nbests: list[list[Hypothesis]],
        encoder_outs: list[torch.Tensor],
        beam: int,
        s: FinalSettings,
    ) -> list[list[Hypothesis]]:
        """Each CTC n-best plus the attention decoder's own beam-search hypotheses that it lacks,
        every member scored by CTC's forward on the stored posteriors, so that the rescoring
        compares them on one scale. CTC n-best members keep their order and token times;
        proposals CTC cannot align to the utterance's frames are dropped."""
        # A proposal much longer than every CTC hypothesis would get a hopeless CTC score; the
        # cap also bounds the search where the decoder does not end (e.g. untrained weights).
        limits = [
            min(len(out), PROPOSAL_LENGTH_FACTOR * max(len(h.tokens) for h in nbest) + PROPOSAL_LENGTH_SLACK)
            for out, nbest in zip(encoder_outs, nbests, strict=True)
        ]
        assert supports_search(self.proposer)
        proposals = attention_beam_search(
            cast(StepDecoder, self.proposer), encoder_outs, beam, sos=s.sos, eos=s.eos, max_tokens=limits
        )
        merged = []
        for request, nbest, proposed in zip(requests, nbests, proposals, strict=True):
            members = [h.tokens for h in nbest]
            for p in proposed:
                if p.tokens not in members:
                    members.append(p.tokens)
            scores = ctc_scores_topk(request.topk_values, request.topk_ids, members, s.vocab_size, s.blank)
            times = [h.times for h in nbest] + [()] * (len(members) - len(nbest))
            graph = request.context
            bonus = [h.context_score for h in nbest] + [
                graph.score(tokens) if graph is not None else 0.0 for tokens in members[len(nbest) :]
            ]
            merged.append(
                [
                    Hypothesis(tokens, score, t, b)
                    for tokens, score, t, b in zip(members, scores, times, bonus, strict=True)
                    if score > -math.inf  # a proposal CTC cannot align to these frames at all
                ]
            )
        return merged

    def close(self) -> None:
        pass


def _parameters(decoder: object) -> list[torch.Tensor]:
    """Float parameters of a torch decoder (none for int8 Linears' packed weights or non-modules)."""
    if not isinstance(decoder, torch.nn.Module):
        return []
    return [p for p in decoder.parameters() if p.is_floating_point()]


class ProcessFinalSearch:
    """``FinalSearch`` in a child process (CPU only). Thread-safe: one batch at a time.

    The child is a fresh interpreter (``python -c``), not a ``multiprocessing`` child: those
    re-import the parent's main module, which runs whatever unguarded code a script has.
    """

    def __init__(
        self, decoder: torch.nn.Module, backend: str, fallback: FinalSearch, niceness: int = WORKER_NICENESS,
        *, traced: bool = True,
    ) -> None:  # fmt: skip
        """``decoder``: the float decoder (the child applies ``backend``'s rescoring variant to
        it, with its traced graphs where ``traced``: ``backends.rescoring_decoder``); ``fallback``:
        the same search in this process, for a batch the child cannot answer; ``niceness``: added
        to the child's nice value (0-19: how much it yields to the engine)."""
        if not 0 <= niceness <= 19:
            raise ValueError(f"finals niceness must be 0-19, got {niceness}")
        self.niceness = niceness
        buffer = io.BytesIO()
        torch.save(decoder, buffer)
        self._decoder_bytes = buffer.getvalue()
        self._backend = backend
        self._traced = traced
        self.settings = fallback.settings
        self._fallback = fallback
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self.restarts = 0
        self._start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> None:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        with parent, child:
            process = subprocess.Popen(
                [sys.executable, "-c", f"from asr_core.finals import serve; serve({child.fileno()})"],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
            conn = Connection(parent.detach())
        self._process, self._conn = process, conn
        # Wait until the child has its decoder, so it never competes with the first calls'
        # partials for the CPU while it imports torch, and a broken one fails here, loudly.
        try:
            conn.send((self._decoder_bytes, self._backend, self._traced, self.settings, self.niceness))
            ready = conn.poll(START_TIMEOUT_S) and conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._stop_child(timeout=1.0)
            raise RuntimeError(f"the finals process did not start (exit code {process.poll()})")

    def cpu_seconds(self) -> float | None:
        """CPU time the child has used so far (``asr_common.proc_cpu``); None when unknown
        (no child, or not Linux)."""
        pid = self.pid
        return None if pid is None else process_cpu_seconds(pid)

    def _stop_child(self, timeout: float) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
            conn.close()
        if process is not None:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)

    def run(self, requests: list[FinalRequest], settings: FinalSettings | None = None) -> list[FinalResult]:
        with self._lock:
            try:
                if self._conn is None:
                    raise EOFError("no child")
                self._conn.send(([request.portable() for request in requests], settings))
                if not self._conn.poll(REPLY_TIMEOUT_S):
                    raise TimeoutError(f"no reply in {REPLY_TIMEOUT_S:.0f} s")
                results: list[FinalResult] = self._conn.recv()
                return results
            except (EOFError, OSError, TimeoutError) as exc:
                log.error("finals process failed (%s); restarting it, this batch runs in-process", exc)
                self._stop_child(timeout=1.0)
                self.restarts += 1
                try:
                    self._start()
                except RuntimeError:
                    log.exception("finals process could not be restarted; finals run in-process")
        return self._fallback.run(requests, settings)

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stop_child(timeout)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child when its parent dies (``PR_SET_PDEATHSIG``).

    Without it a child busy with a batch outlives a SIGKILLed service until its next send fails,
    holding a core the restarted service needs. Elsewhere (not Linux) the closed socket ends it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def serve(fd: int) -> None:
    """The child's main: build the decoder from the first message, then answer batches until
    told to stop (``None``) or the parent goes away."""
    from asr_core.backends import rescoring_decoder
    from asr_core.backends.traced_decoder import TracedTreeDecoder

    conn = Connection(fd)
    _die_with_parent()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    try:
        decoder_bytes, backend, traced, settings, niceness = conn.recv()
    except (EOFError, OSError):
        return
    if niceness:
        with contextlib.suppress(OSError):
            os.nice(niceness)
    decoder = torch.load(io.BytesIO(decoder_bytes), weights_only=False).eval()
    rescorer = rescoring_decoder(backend, decoder, traced)
    if isinstance(rescorer, TracedTreeDecoder):
        rescorer.warm_up()  # before "ready": the first final does not wait for the tracer
    search = FinalSearch(rescorer, settings, proposer=decoder)
    conn.send("ready")
    trim = memtrim.Periodic()  # jemalloc keeps freed pages in this process too (asr_common.allocator)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        requests, batch_settings = message
        conn.send(search.run(requests, batch_settings))
        trim()
