"""A stalled bridge worker (issue 54, item 4): while the worker is stuck in the transcript
processor, a SIP call's RTP is still received, its BYE and a new OPTIONS are still answered (the
event loop never waits for the worker), its end is queued past the queue's bound, and once the
worker moves again nothing durable is lost: ``call.started`` first, every final the engine
produced, ``call.ended`` last."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asr_gateway.dev.sipp_calls import place_call, rtp_packets
from asr_gateway.service import Service
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import TranscriptUpdate
from tests.audio_clients import recording
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import read_valid_events, service_config, wait_drained
from tests.test_gateway_metrics import options_status
from tests.test_node_calls import scrape
from tests.tool_marks import needs_redis_server, needs_sipp

__all__ = ["redis_server"]  # the fixture, used by name

pytestmark = [needs_redis_server, needs_sipp, pytest.mark.timeout(120)]

DEADLINE_S = 60.0


class StallingProcessor(TranscriptProcessor):
    """The service's processor, stuck in its first ``process`` until ``gate`` opens."""

    gate: threading.Event
    stalled: threading.Event

    def process(self, update: TranscriptUpdate) -> list[Any]:
        self.stalled.set()
        self.gate.wait()
        return super().process(update)


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S:.0f} s"
        await asyncio.sleep(0.02)


def test_a_stalled_worker_stalls_neither_rtp_nor_sip_and_loses_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    config = service_config(tmp_path, redis_server.url)
    processor = StallingProcessor.from_settings(config.kb_hooks)
    assert isinstance(processor, StallingProcessor)
    processor.gate, processor.stalled = threading.Event(), threading.Event()
    pcm = np.tile(recording("hotline_1", 8000), 3)  # ~12 s: the worker is stuck well before the call ends
    sent_packets = len(rtp_packets(pcm, 8000))

    async def scenario() -> tuple[int, int]:
        service = Service(config)
        service.bridge.processor = processor
        queue = service.bridge.queue
        full_bound = queue.bound
        ports = await service.start()
        assert ports.sip_udp is not None
        try:
            call = asyncio.create_task(place_call(tmp_path / "stall", ports.sip_udp, pcm, 8000, call_tag="stall"))
            await wait_until(processor.stalled.is_set, "transcript reaching the processor")
            # From now on the worker's queue counts as full: every put meets its bound (partials
            # are dropped, finals wait in the finalizer, the event loop's messages go past it).
            queue.bound = 0
            result = await call  # INVITE, ACK, the whole recording as RTP, BYE: all while the worker is stuck
            assert result.returncode == 0, result.errors
            assert not processor.gate.is_set()
            assert service.rtp_totals.snapshot()["packets"] >= sent_packets
            assert await asyncio.to_thread(options_status, ports.sip_udp) in (200, 503)  # answered: full or not
            await wait_until(lambda: queue.over_bound > 0, "call end queued past the bound")
            assert service.calls.active == 0, "the door's call ended on time"
            assert ports.metrics is not None
            samples = await asyncio.to_thread(scrape, ports.metrics)
            assert samples[("asr_worker_queue_over_bound_total", ())] == queue.over_bound
            assert samples[("asr_worker_queue_depth", ())] >= 1  # the call's end, at least
            queue.bound = full_bound
            processor.gate.set()
            await wait_drained(service)
            return service.engine.stats.finals, service.bridge.worker_errors
        finally:
            queue.bound = full_bound
            processor.gate.set()
            await service.stop(grace_s=5)

    finals_made, worker_errors = asyncio.run(scenario())
    assert worker_errors == 0
    events = [e for e in read_valid_events(redis_server.url) if str(e["sip_call_id"]).startswith("stall-")]
    kinds = [e["event_type"] for e in events]
    assert kinds[0] == "call.started" and kinds[-1] == "call.ended", kinds
    assert kinds.count("call.started") == 1 and kinds.count("call.ended") == 1
    finals = [e for e in events if e["event_type"] == "transcript.final"]
    assert finals and len(finals) == finals_made, "every final the engine made was published"
    assert events[-1]["stats"]["audio_ms"], events[-1]
