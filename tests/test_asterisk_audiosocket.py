"""A real Asterisk 22 (tests/asterisk_peer.py) streams to the service's AudioSocket door, through the
whole service to a local Redis: its ``AudioSocket()`` application (8 kHz ``slin``) and its AudioSocket
channel driver with ``c(slin16)`` (16 kHz frames). Each gives the bundled sentence within the suite's
CER; ``AudioSocket()`` ends by closing the connection, without a hangup frame.
The recipes of deploy/pbx/asterisk.md: tests/test_asterisk_doc.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from asr_common.scoring import cer
from asr_gateway.service import Service
from rtp.pcm_leg import PcmLeg
from tests.asterisk_peer import AsteriskPeer, asterisk_build
from tests.audio_clients import DATA
from tests.demo_quality import GOOD_ENOUGH_CER, SEED_TEXT
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import free_port, read_valid_events, service_config, wait_drained
from tests.tool_marks import needs_redis_server
from tests.waiting import wait_until_async

__all__ = ["redis_server"]  # the fixture, used by name

pytestmark = [
    needs_redis_server,
    pytest.mark.timeout(300, func_only=True),
]  # the first module builds Asterisk in its fixture

ROUTES = "profiles:\n  default: {role: mixed, redaction: keep}\nroutes: []\n"
DOOR = "audiosocket: {enabled: true, host: 127.0.0.1, port: 0}\n"
CALL_TIMEOUT_S = 90.0  # a loaded 2-core runner: Asterisk's call, the decoding of its last seconds
NARROW = uuid.UUID("0a5e0008-0000-4000-8000-000000000001")
WIDE = uuid.UUID("0a5e0016-0000-4000-8000-000000000001")


@pytest.fixture(scope="module")
def asterisk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsteriskPeer]:
    # No SIP call here: the service's SIP port is only a number the templates need.
    peer = AsteriskPeer(asterisk_build(), tmp_path_factory.mktemp("asterisk"), free_port(), DATA / "hotline_seed.wav")
    peer.start()
    try:
        yield peer
    finally:
        peer.stop()


def test_audiosocket_application_at_8_khz_and_channel_at_slin16(
    tmp_path: Path, redis_server: RedisServer, asterisk: AsteriskPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = service_config(tmp_path, redis_server.url, ROUTES, DOOR)
    received: dict[int, set[int]] = {}  # sample rate (Hz) -> frame lengths (samples) the legs got
    submit = PcmLeg.submit

    def recording_submit(leg: PcmLeg, samples: np.ndarray, rate: int) -> None:
        received.setdefault(rate, set()).add(len(samples))
        submit(leg, samples, rate)

    monkeypatch.setattr(PcmLeg, "submit", recording_submit)

    def ended() -> dict[str, str]:
        events = read_valid_events(redis_server.url)
        return {e["source_call_id"]: e["reason"] for e in events if e["event_type"] == "call.ended"}

    async def scenario() -> None:
        service = Service(config)
        await service.start()
        assert service.doors.audiosocket is not None
        address = f"127.0.0.1:{service.doors.audiosocket.port}"
        try:
            await asyncio.to_thread(
                asterisk.rx, f"channel originate Local/play@test application AudioSocket {NARROW},{address}"
            )
            await asyncio.to_thread(
                asterisk.rx, f"channel originate AudioSocket/{address}/{WIDE}/c(slin16) extension play@test"
            )
            await wait_until_async(lambda: len(ended()) == 2, CALL_TIMEOUT_S, "both AudioSocket calls ended")
            await wait_drained(service)
            assert not service.doors.audiosocket.refusals
        finally:
            await service.stop(grace_s=5)

    asyncio.run(scenario())
    events = read_valid_events(redis_server.url)
    for stream in (NARROW, WIDE):
        text = "".join(
            e["text"] for e in events if e["event_type"] == "transcript.final" and e["source_call_id"] == str(stream)
        )
        assert cer(text, SEED_TEXT) <= GOOD_ENOUGH_CER, (stream, text, asterisk.log_tail())
        started = next(e for e in events if e["event_type"] == "call.started" and e["source_call_id"] == str(stream))
        assert started["source"] == "audiosocket"
    # AudioSocket() closes the connection when its channel hangs up: no hangup frame (kind 0x00).
    assert ended()[str(NARROW)] == "peer-closed"
    # 20 ms frames: 320 bytes of 0x10, 640 bytes of 0x12; the last one of a Playback shorter (the file's end).
    assert {rate: max(lengths) for rate, lengths in received.items()} == {8000: 160, 16000: 320}, received
    assert ended()[str(WIDE)] == "peer-closed", ended()
