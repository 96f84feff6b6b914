"""Between incoming calls, engine streams and the Redis publisher.

``CallBridge`` is the ``calls.handler.CallHandler`` of the service (every front door's
application): each transcribed call leg becomes an engine ``Stream`` whose PCM comes straight
from the door's leg (SIP: the RTP leg). Engine events are
handed to one worker thread that runs KB matching, tagging and redaction
(``kb_hooks.TranscriptProcessor``) and submits the results to the publisher. Its queue
(``bridge_queue.WorkQueue``) has a bound: past it partials are dropped, the engine threads'
finals and stream ends wait for room, and the event loop's messages (calls announced and ended,
key presses) are queued all the same, so the event loop never waits for the worker and no
durable message is lost. ``call.ended`` is published after the
last final of the call's last leg, right after ``call.analytics`` where the route wants it.

Plain calls with the same ``CallInfo.join_key`` (CUCM built-in-bridge recording: one INVITE
per direction) are one call here: the second one's legs become more participants of the first
one's call, which ends when every call joined into it has ended. The first waits up to its
profile's ``join_timeout_s`` for its partner (``calls.join.Joiner``) before ``call.started`` is
published (at once if a transcript of it comes first); a partner after that is a call of its own.
The calls, their legs, joins and watchers are kept in ``call_table.CallTable``.

A door that answers its peer with the call's transcripts (the WebSocket API) ``watch``es the
call: every event published for it is also handed to the door's listener, on the worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import assert_never

import numpy as np

from asr_common.draining import wait_while_progressing
from asr_core.context_graph import ContextGraph
from asr_core.engine import Engine
from asr_core.events import Ended, Event, Final, Partial
from asr_core.stream import Stream, StreamConfig
from asr_core.surge import FinalsReduction
from asr_gateway.bridge_queue import STOP, AnnounceCall, JoinTimedOut, LegKeyPress, MemberEnded, Stop, WorkQueue
from asr_gateway.call_context import call_context
from asr_gateway.call_table import CallState, CallTable, EventListener
from asr_gateway.hotwords import HotwordLists
from calls.call import CallInfo, LegInfo
from calls.profile import Profile
from kb_hooks import events as ev
from kb_hooks.features import NodeDefaults
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.publisher import Publisher
from kb_hooks.types import CallContext, Participant, RedactionMode, ReducedReason, TranscriptUpdate
from rtp.dtmf import KeyPress

log = logging.getLogger(__name__)


# Why a final was searched the cheaper way, as the event says it (kb_hooks restates the engine's
# reasons: it does not import the engine).
REDUCED_REASONS: dict[FinalsReduction, ReducedReason] = {
    FinalsReduction.FINALS_QUEUED: "finals_queued",
    FinalsReduction.ENGINE_SATURATED: "engine_saturated",
}

_Message = AnnounceCall | JoinTimedOut | LegKeyPress | MemberEnded | Partial | Final | Ended


class StreamSink:
    """``asr_common.audio.PcmSink`` that feeds an engine stream; key presses (``rtp.sink.DtmfSink``) go
    to ``on_dtmf`` (None: ignored, the route's ``dtmf: off``)."""

    def __init__(self, stream: Stream, on_dtmf: Callable[[KeyPress], None] | None = None) -> None:
        self.stream = stream
        self.on_dtmf = on_dtmf

    def accept_waveform(self, samples: np.ndarray) -> None:
        self.stream.accept_waveform(samples)

    def input_finished(self) -> None:
        self.stream.input_finished()

    def dtmf(self, press: KeyPress) -> None:
        if self.on_dtmf is not None:
            self.on_dtmf(press)


class CallBridge:
    """Every door's call handler (on the event loop) and the engine's event consumer (engine
    threads), with one worker thread that publishes. Thread-safe.

    Its calls are in a ``call_table.CallTable``, whose lock guards what both threads touch (it
    says which fields); the worker's queue is a ``bridge_queue.WorkQueue``. Neither waits for the
    worker, so the event loop never does.
    """

    def __init__(
        self,
        engine: Engine,
        processor: TranscriptProcessor,
        publisher: Publisher,
        default_redaction: RedactionMode = RedactionMode.MASK,
        queue_size: int = 50_000,
        hotwords: HotwordLists | None = None,
    ) -> None:
        self.engine = engine
        self.hotwords = hotwords  # the profiles' phrase files; None: no biasing
        self.processor = processor
        self.publisher = publisher
        self.default_redaction = default_redaction
        self.table = CallTable()
        self.queue: WorkQueue[_Message | Stop] = WorkQueue(queue_size)  # the worker's; bridge_queue
        self._worker: threading.Thread | None = None
        self.partials_dropped = 0
        self.overload_refusals = 0  # admission checks refused while the engine was behind real time
        self.worker_errors = 0
        self._handled = 0  # queue items the worker has handled (progress, for stop)

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        self._worker = threading.Thread(target=self._work, name="kb-hooks", daemon=True)
        self._worker.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Process everything queued, however much (giving up only when the worker handled
        nothing for ``timeout`` s), then stop the worker."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        self.queue.put(STOP)
        if not wait_while_progressing(lambda: not worker.is_alive(), lambda: self._handled, timeout):
            log.error("kb-hooks worker stalled for %.0f s; %d queued events are not published", timeout,
                      len(self.queue))  # fmt: skip

    @property
    def active_calls(self) -> int:
        return len(self.table)

    # -- calls.handler.CallHandler -------------------------------------------------------

    def has_capacity(self, legs: int) -> bool:
        """A free engine slot per leg, and an engine that keeps up: while it has no room
        (``Engine.overloaded``: behind real time, or with surge behind even at its calls'
        longest chunks) new calls and OPTIONS probes get 503 (counted in ``overload_refusals``)
        instead of making every call's transcripts later."""
        if self.engine.overloaded:
            self.overload_refusals += 1
            return False
        return self.engine.free_slots >= legs

    def open_leg(self, call: CallInfo, leg: LegInfo) -> StreamSink:
        profile = call.profile
        context = self.hotwords.get(profile.hotwords) if self.hotwords is not None else None
        config = stream_config(profile, stream_id=leg.leg_id, context=context)
        stream = self.engine.open_stream(config, self._on_engine_event)  # PoolExhausted: a CapacityError, 503
        try:
            now = time.monotonic()
            call_id, state, waits = self.table.add_leg(call, leg.leg_id, _participant(leg), self._context, now)
        except BaseException:
            stream.input_finished()  # its slot is freed; its events find no call and are ignored
            raise
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (direct use): announce now, wait for no partner
            loop = None
        if loop is not None and waits:
            loop.call_later(call.profile.join_timeout_s, self._queue_put, JoinTimedOut(call_id))
        elif loop is not None:
            # Legs of one call are opened back to back in one step of the SIP worker: announce
            # the call after that step, when all of them are known.
            loop.call_soon(self._queue_put, AnnounceCall(call_id))
        else:
            self.table.stop_waiting(state)
            self._queue_put(AnnounceCall(call_id))
        if profile.dtmf == "off":
            return StreamSink(stream)
        publish = profile.dtmf == "publish"
        return StreamSink(stream, lambda press: self._queue_put(LegKeyPress(leg.leg_id, press, publish)))

    def leg_updated(self, call: CallInfo, leg: LegInfo) -> None:
        self.table.leg_updated(call, leg.leg_id, _participant(leg))

    def call_ended(self, call: CallInfo, reason: str) -> None:
        self._queue_put(MemberEnded(call.call_id, reason))

    def watch(self, call_id: str, listener: EventListener) -> None:
        """Hand every event published for call ``call_id`` to ``listener`` too, up to and including
        its ``call.ended``. Call before ``open_leg`` so that ``call.started`` is not missed; a
        call joined into another one publishes under the other's id (SIP joins only)."""
        self.table.watch(call_id, listener)

    def unwatch(self, call_id: str) -> None:
        """Forget the listener of ``call_id`` (its leg was never opened); no-op when none."""
        self.table.unwatch(call_id)

    def _tell(self, event: ev.Event) -> None:
        listener = self.table.listener(event.call_id)
        if listener is not None:
            listener(event.to_json())

    # -- engine events (engine thread) -----------------------------------------------

    def _on_engine_event(self, event: Event) -> None:
        """Partials are dropped while the worker's queue is full; finals and stream ends wait for
        room there, holding the engine thread (``bridge_queue``: back-pressure, never a loss)."""
        if isinstance(event, Partial):
            if not self.queue.offer(event):
                self.partials_dropped += 1
            return
        self.queue.put_waiting(event)

    def _queue_put(self, item: _Message | Stop) -> None:
        """The event loop's messages (calls announced and ended, key presses, join timeouts):
        queued at once, past the queue's bound if need be, so the loop never waits for the worker."""
        self.queue.put(item)

    # -- worker -----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            message = self.queue.get()
            if isinstance(message, Stop):
                return
            try:
                self._handle(message)
            except Exception:
                self.worker_errors += 1
                log.exception("transcript post-processing failed for %r", message)
            self._handled += 1

    def _handle(self, message: _Message) -> None:
        match message:
            case AnnounceCall(call_id):
                self._publish_started(call_id)
            case JoinTimedOut(call_id):
                self._join_timed_out(call_id)
            case LegKeyPress(leg_id, press, publish):
                self._key_pressed(leg_id, press, publish)
            case MemberEnded(member, reason):
                self._mark_call_ended(member, reason)
            case Partial() | Final() | Ended():
                self._engine_event(message)
            case _:
                assert_never(message)

    def _engine_event(self, item: Partial | Final | Ended) -> None:
        state = self.table.of_leg(item.stream_id)
        if state is None:
            return
        if isinstance(item, Ended):
            self.table.leg_ended(state, item.stream_id)
            state.audio_ms[item.stream_id] = item.audio_ms
            self._maybe_publish_ended(state)
            return
        if not state.started:  # a transcript before the partner INVITE came: announce now
            self._announce(state, now=True)
        participant = self.table.participant(state, item.stream_id)
        for out in self.processor.process(_update(state.ctx, participant, item, self.engine.loaded.units)):
            self.publisher.submit(out, audio_end_monotonic=item.audio_end_monotonic)
            self._tell(out)

    def _key_pressed(self, leg_id: str, press: KeyPress, publish: bool) -> None:
        """Count a leg's key press; with ``publish``, send a ``dtmf`` event (redacted per route)."""
        state = self.table.of_leg(leg_id)
        if state is None:
            return
        index = state.dtmf.get(leg_id, 0)
        state.dtmf[leg_id] = index + 1
        if not publish:
            return
        if not state.started:
            self._announce(state, now=True)
        participant = self.table.participant(state, leg_id)
        event = ev.Dtmf.press(state.ctx, participant, press.key, index, press.duration_ms)
        self.publisher.submit(event)
        self._tell(event)

    def _publish_started(self, call_id: str) -> None:
        state = self.table.get(call_id)
        if state is not None:
            self._announce(state)

    def _announce(self, state: CallState, *, now: bool = False) -> None:
        """Publish the call's ``call.started`` once, unless it waits for its partner; ``now``:
        stop waiting first (something of the call is about to be published)."""
        participants = self.table.to_announce(state, now=now)
        if participants is None:
            return
        state.started = True
        self._tell(self.publisher.call_started(state.ctx, participants, state.metadata, state.source))

    def _join_timed_out(self, call_id: str) -> None:
        """The partner call did not come in time: close the join and announce the call alone."""
        state = self.table.get(call_id)
        if state is None:
            return
        self.table.close_join(state)
        self._announce(state)

    def _mark_call_ended(self, member: str, reason: str) -> None:
        state = self.table.member_ended(member, reason)
        if state is not None:  # None: another call joined into it is still up
            self._maybe_publish_ended(state)

    def _maybe_publish_ended(self, state: CallState) -> None:
        reason = self.table.take_ended(state)
        if reason is None:
            return
        self._announce(state)
        stats: dict[str, object] = {"audio_ms": dict(state.audio_ms)}
        if state.dtmf:
            stats["dtmf_events"] = dict(state.dtmf)
        analytics = self.processor.call_analytics(state.ctx, max(state.audio_ms.values(), default=0))
        if analytics is not None:
            self.publisher.submit(analytics)
            self._tell(analytics)
        self._tell(self.publisher.call_ended(state.ctx, reason, stats))
        self.table.unwatch(state.ctx.call_id)
        self.processor.end_call(state.ctx.call_id)

    def _context(self, call: CallInfo) -> CallContext:
        return call_context(call, NodeDefaults(self.default_redaction), self.processor.features)


def stream_config(profile: Profile, stream_id: str | None = None, context: ContextGraph | None = None) -> StreamConfig:
    """The engine stream of a leg of a call routed to ``profile``."""
    return StreamConfig(
        chunk_ms=profile.chunk_ms,
        left_chunks=profile.left_chunks,
        stream_id=stream_id,
        context=context,
        attention_beam=profile.attention_beam,
        max_chunk_ms=profile.surge.max_chunk_ms,
        surge_priority=profile.surge.priority,
    )


def _participant(leg: LegInfo) -> Participant:
    return Participant(role=leg.role, aor=leg.aor, label=leg.label, name=leg.name)


def _update(ctx: CallContext, participant: Participant, event: Partial | Final, units: list[str]) -> TranscriptUpdate:
    tokens = tuple((units[t], ms, None) for t, ms in zip(event.tokens, event.token_times_ms, strict=False))
    final = event if isinstance(event, Final) else None
    reduced = final.reduced_search if final is not None else None
    return TranscriptUpdate(
        call=ctx,
        participant=participant,
        utterance_id=event.utterance_id,
        is_partial=final is None,
        text=event.text,
        tokens=tokens,
        begin_offset_ms=event.begin_ms,
        end_offset_ms=event.end_ms,
        confidence=final.confidence if final else None,
        nbest=tuple((e.text, e.score) for e in final.nbest) if final else (),
        latency_ms=event.latency_ms,
        audio_end_monotonic=event.audio_end_monotonic,
        chunk_ms=event.chunk_ms,
        reduced_search=True if reduced is not None else None,
        reduced_reason=REDUCED_REASONS[reduced] if reduced is not None else None,
    )
