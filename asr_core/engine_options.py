"""The engine's options (``EngineOptions``), its dtype names (``resolve_dtype``) and what a count
of 0 means for its per-core settings (``per_core``).

Their own module so that imports point one way: the engine and the scheduler it runs both read
these options, and both import them from here (engine -> scheduler -> finalizer -> options and
stats; the ``engine`` contract in setup.cfg).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from asr_core import memtrim
from asr_core.endpoint import EndpointRules
from asr_core.finals import WORKER_NICENESS
from asr_core.surge import SurgeSettings


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Engine-wide limits. The largest allowed chunk times ``max_left_chunks`` sizes the pool's
    per-slot ring (encoder frames)."""

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
    trim_interval_s: float = memtrim.DEFAULT_INTERVAL_S  # return freed heap to the OS this often; 0 = never
    # Where finals are searched and rescored while the engine runs: "thread" (a thread of this
    # process) or "process" (a child process, CPU only: keeps that Python work off this
    # process's GIL; see asr_core/finals.py). Without the engine's threads (run_once) finals
    # are always computed in the caller's thread.
    finalizer: str = "thread"
    # The torch backends on a CPU run each full chunk shape as a frozen TorchScript graph, which
    # does not wait for the GIL between operations (asr_core/backends/traced.py); False: eager.
    traced_step: bool = True
    # On a CPU the finals' rescoring runs the decoder's prefix-tree forward as frozen TorchScript
    # graphs, without Python between its operations (asr_core/backends/traced_decoder.py); False: eager.
    traced_rescoring: bool = True
    # Traced steps of large batches are cut into this many parts run at once in as many threads
    # (one core each; asr_core/backends TorchChunkRunner); 1 = one thread runs every step.
    step_threads: int = 1
    # Schedulers, each on its own thread over its own streams (a new stream joins the one with
    # the fewest): their chunk steps and most of their tensor work run at once on as many
    # cores. 1 = one thread runs every batch (the library's default; the service's is a core each).
    schedulers: int = 1
    # Nice value added to the finals process (0-19). High: finals take only the CPU the
    # schedulers leave idle, which starves them once the schedulers fill every core; 0: they
    # share the cores equally with the schedulers.
    finals_niceness: int = WORKER_NICENESS
    # An utterance waiting this long (ms) for its Final means the node has more calls than it can
    # finalize: it then counts as overloaded (new calls get 503) until the finals catch up.
    finals_behind_ms: float = 4000.0
    # Finalizer lanes searching at once, each with its own thread (and child process with
    # ``finalizer="process"``); a stream's utterances always go to the same one. 1 = the
    # library's default; the service's is one per core (``per_core``): a single niced child
    # process waits on one core's run queue while the other cores idle.
    finals_workers: int = 1
    # Graceful degradation: while a scheduler falls behind, its streams that allow it
    # (``StreamConfig.max_chunk_ms``) move to longer chunks and back (asr_core/surge.py). None: off.
    surge: SurgeSettings | None = None


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def per_core(count: int, device: str) -> int:
    """``count`` of a per-core setting (schedulers, finals lanes), or what its 0 stands for: one
    per usable core on a CPU, one on a GPU (where the work is the device's, not the cores')."""
    if count:
        return count
    return 1 if device.startswith("cuda") else usable_cores()


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
