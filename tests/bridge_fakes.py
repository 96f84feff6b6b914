"""Stand-ins for ``CallBridge``'s collaborators, typed as what it takes.

Each is a subclass of the real class, so the bridge gets every method it calls with its real
signature and return type (a ``call_started`` that returned None once made the bridge's worker
fail on every call while the tests passed). Where a fake leaves part of the real object unset,
a bridge that reads it raises ``AttributeError`` in its worker, which tests/conftest.py turns
into a failure through ``worker_errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from asr_core.engine import Engine
from asr_core.events import Event
from asr_core.model.loader import LoadedModel
from asr_core.stream import Stream, StreamConfig
from kb_hooks import events as ev
from kb_hooks.config import KbHooksSettings, RedisSettings
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.publisher import Publisher

SUBSAMPLING = 4  # the streams' encoder frames are 40 ms, as with a U2++ model's 4x subsampling
RIGHT_CONTEXT = 6


def units_only(units: Sequence[str]) -> LoadedModel:
    """A ``LoadedModel`` with its ``units`` and nothing else: all ``CallBridge`` reads of a model."""
    loaded = LoadedModel.__new__(LoadedModel)
    loaded.units = list(units)
    return loaded


class FakeEngine(Engine):
    """An Engine with no model: ``open_stream`` gives real ``Stream``s that nothing schedules, and
    the test plays the engine by calling ``callbacks[stream_id](event)``. Every stream config
    opened is kept in ``configs``."""

    def __init__(self, units: Sequence[str] = ("<blank>",), free_slots: int = 10) -> None:
        # Engine.__init__ is not run: it loads weights and starts threads. What the bridge reads
        # of an Engine is set here or overridden below.
        self.loaded = units_only(units)
        self.slots = free_slots
        self.callbacks: dict[str, Callable[[Event], None]] = {}
        self.configs: list[StreamConfig] = []

    @property
    def free_slots(self) -> int:
        return self.slots

    @property
    def overloaded(self) -> bool:
        return False

    def open_stream(self, config: StreamConfig, on_event: Callable[[Event], None]) -> Stream:
        stream_id = config.stream_id or f"stream-{len(self.configs)}"
        self.configs.append(config)
        self.callbacks[stream_id] = on_event
        chunk_frames = config.chunk_frames(SUBSAMPLING)
        return Stream(stream_id, config, 0, chunk_frames, SUBSAMPLING, RIGHT_CONTEXT, on_event, wake=lambda: None)


def bare_processor() -> TranscriptProcessor:
    """The real processor with the default settings: no knowledge base, tag or analytics rules."""
    return TranscriptProcessor.from_settings(KbHooksSettings())


class RecordingPublisher(Publisher):
    """A Publisher that is never started: ``submit`` keeps each event in ``events`` instead of
    queueing it for Redis. ``call_started`` and ``call_ended`` are the real ones."""

    def __init__(self) -> None:
        super().__init__(RedisSettings())
        self.events: list[ev.Event] = []

    def submit(self, event: ev.Event, *, audio_end_monotonic: float | None = None) -> None:
        self.events.append(event)

    @property
    def started(self) -> list[tuple[str, list[str]]]:
        """(call id, its participants' roles sorted) of each ``call.started``, in order."""
        return [
            (e.call_id, sorted(p.role for p in e.participants)) for e in self.events if isinstance(e, ev.CallStarted)
        ]

    @property
    def ended(self) -> list[str]:
        """The call id of each ``call.ended``, in order."""
        return [e.call_id for e in self.events if isinstance(e, ev.CallEnded)]
