"""``asr-bench accuracy --backend``: a test set decoded through the serving ``Engine``, as calls
are served, at one chunk plan per run.

Every utterance is one stream, all opened at once, their audio handed over whole; the engine is
driven tick by tick in this thread (``Engine.run_once``), so decoding is deterministic. A plan
is a chunk size with its cache window (``left_chunks``) and, for surge, a move up the ladder
(``asr_core.surge.chunk_ladder``) a given time into each stream's audio: the stream starts at
its route's chunk size and is moved between two of its chunks with ``Stream.set_chunk``, the
call the scheduler makes for the surge controller's moves, keeping its cache slot, its model
offset and the utterance decoded so far. The surge controller itself is held still
(``HELD``), so only the plan moves streams.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from asr_core.context_graph import ContextGraph
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions, resolve_dtype
from asr_core.events import Event, Final, Partial
from asr_core.frontend import encoder_frame_ms
from asr_core.model.loader import LoadedModel
from asr_core.stream import Stream, StreamConfig
from asr_core.surge import SurgeSettings, chunk_ladder

HELD = SurgeSettings(degrade_ms=math.inf, restore_ms=0.0, restore_after_s=math.inf, finals_reduce_ms=math.inf)
"""Surge on (streams get their ladders) with a controller that never moves a stream and finals
never searched with the reduced settings: the plan alone moves streams, the finals stay the
service's default ones."""

NEVER = 10**9  # ms: one utterance per test item, endpoints only at the end of the input


class PlanError(ValueError):
    """Chunk sizes that a plan asked for cannot run as asked (the message says what to change)."""


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Every stream runs ``chunk_ms`` chunks keeping ``left_chunks`` of them; with ``switch_to``
    it moves to that chunk size (and the left chunks that keep its attention window) at its
    first chunk boundary at or past ``switch_at_s`` seconds of its audio."""

    chunk_ms: int
    left_chunks: int
    switch_to: int | None = None
    switch_at_s: float = 0.0

    @property
    def mode(self) -> str:
        """The report's name for it: ``160ms``, or ``160>640ms`` for a switch."""
        return f"{self.chunk_ms}ms" if self.switch_to is None else f"{self.chunk_ms}>{self.switch_to}ms"


@dataclass(frozen=True, slots=True)
class StreamingTexts:
    """Texts per method, one per utterance ("greedy": the last live partial; "rescore", or
    "joint", the final), and how many streams ended at the plan's ``switch_to`` size, as their
    finals' ``chunk_ms`` says (0 without a switch)."""

    texts: dict[str, list[str]]
    switched: int


def surge_left_chunks(loaded: LoadedModel, chunk_ms: int, left_chunks: int, sizes: tuple[int, ...]) -> dict[int, int]:
    """Left chunks per chunk size of ``sizes`` that keep the attention window of ``chunk_ms``
    chunks keeping ``left_chunks`` (160 ms x 8 = 320 ms x 4 = 640 ms x 2), as surge runs a
    stream of that route. ``PlanError`` naming the sizes off that ladder."""
    frame_ms = encoder_frame_ms(loaded.frontend, loaded.subsampling)
    ladder = dict(chunk_ladder(chunk_ms, left_chunks, max(sizes), sizes, frame_ms))
    missing = [size for size in sizes if size not in ladder]
    if missing:
        raise PlanError(
            f"chunk sizes {missing} ms cannot keep the attention window of {chunk_ms} ms x {left_chunks} left chunks "
            f"({chunk_ms * left_chunks} ms); pick --left-chunks so that it is a multiple of each size"
        )
    return ladder


def decode_streaming(
    loaded: LoadedModel, audio: list[np.ndarray], plan: ChunkPlan, backend: str, max_left_chunks: int,
    dtype: str = "float32", attention_beam: int = 0, context: ContextGraph | None = None,
) -> StreamingTexts:  # fmt: skip
    """Every utterance of ``audio`` (float32 at int16 scale, the model's rate) one stream, all
    at once, run by ``plan``. The finals are "rescore", or "joint" with ``attention_beam`` > 0;
    ``context``: every stream's hotwords (as a route's list reaches its calls' finals)."""
    options = EngineOptions(
        max_streams=len(audio), max_batch=64, backend=backend, max_left_chunks=max_left_chunks, trim_interval_s=0,
        behind_ms=float("inf"),  # audio arrives all at once: latency is meaningless here
        dtype=resolve_dtype(dtype, "cpu"), attention_beam=attention_beam,
        endpoint=EndpointRules(trailing_silence_ms=NEVER, leading_silence_ms=NEVER, max_utterance_ms=NEVER),
        surge=HELD if plan.switch_to is not None else None,
    )  # fmt: skip
    engine = Engine(loaded, options)
    greedy: list[list[str]] = [[] for _ in audio]
    finals: list[list[str]] = [[] for _ in audio]
    last_partial: list[str] = ["" for _ in audio]
    last_chunk_ms: list[int] = [0 for _ in audio]

    def collector(i: int) -> Any:
        def on_event(event: Event) -> None:
            if isinstance(event, Partial):
                last_partial[i] = event.text
            elif isinstance(event, Final):
                greedy[i].append(last_partial[i])
                finals[i].append(event.text)
                last_partial[i] = ""
                last_chunk_ms[i] = event.chunk_ms

        return on_event

    streams = []
    for i, samples in enumerate(audio):
        config = StreamConfig(
            chunk_ms=plan.chunk_ms, left_chunks=plan.left_chunks, stream_id=f"utt{i}", context=context,
            max_chunk_ms=plan.switch_to,
        )  # fmt: skip
        stream = engine.open_stream(config, collector(i))
        stream.accept_waveform(np.clip(np.rint(samples), -32768, 32767).astype(np.int16))
        stream.input_finished()
        streams.append(stream)
    waiting = list(streams) if plan.switch_to is not None else []
    switch_frame = round(plan.switch_at_s * 1000.0 / loaded.frontend.frame_shift_ms)  # fbank frames
    while not all(stream.done.is_set() for stream in streams):
        engine.run_once()
        waiting = [stream for stream in waiting if not _switched(stream, plan, switch_frame, engine.frame_ms)]
    final_method = "joint" if attention_beam > 0 else "rescore"
    texts = {"greedy": ["".join(g) for g in greedy], final_method: ["".join(f) for f in finals]}
    switched = sum(ms == plan.switch_to for ms in last_chunk_ms) if plan.switch_to is not None else 0
    return StreamingTexts(texts, switched)


def _switched(stream: Stream, plan: ChunkPlan, switch_frame: int, frame_ms: int) -> bool:
    """Between two ticks (no chunk of ``stream`` in a batch): move it to ``plan.switch_to`` once
    its decoded audio reaches ``switch_frame`` (fbank frames); True once moved, or once it has
    no chunk left to move for."""
    assert plan.switch_to is not None
    if stream.done.is_set() or (stream.finishing and not stream.next_chunk_frames()):
        return True
    if stream.frames_consumed < switch_frame:
        return False
    stream.set_chunk(plan.switch_to, plan.switch_to // frame_ms, time.monotonic())
    return True
