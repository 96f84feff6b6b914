"""CallBridge's worker queue carries typed messages, handled in order: a call announced, its key
presses counted and published as ``dtmf`` events, the call ended after its last leg. A message
of a type the worker does not know is an error, never taken for a call that ended."""

from __future__ import annotations

import jsonschema
import pytest

from asr_core.events import Ended
from asr_gateway.bridge import CallBridge
from calls.call import CallInfo, LegInfo
from calls.profile import Profile
from kb_hooks import events as ev
from rtp.dtmf import KeyPress
from tests.bridge_fakes import FakeEngine, RecordingPublisher, bare_processor


def bridge_with_publisher() -> tuple[CallBridge, FakeEngine, RecordingPublisher]:
    engine, publisher = FakeEngine(), RecordingPublisher()
    bridge = CallBridge(engine, bare_processor(), publisher)
    bridge.start()
    return bridge, engine, publisher


def test_key_presses_are_published_in_order_and_counted_in_call_ended() -> None:
    bridge, engine, publisher = bridge_with_publisher()
    info = CallInfo("k1", "sip", "sip-k1", "sip:a@b", None, "sip:r@asr", None, ("127.0.0.1", 5060, "udp"), "keys",
                    Profile(dtmf="publish", redaction="keep"), False)  # fmt: skip
    sink = bridge.open_leg(info, LegInfo("k1-0", None, "caller", "sip:a@b", "PCMU"))  # no loop: announced at once
    sink.dtmf(KeyPress("5", 120, 0))
    sink.dtmf(KeyPress("#", 80, 1600))
    engine.callbacks["k1-0"](Ended("k1-0", 0, "input_finished", 1000))
    bridge.call_ended(info, "bye")
    bridge.stop()

    assert [type(e) for e in publisher.events] == [ev.CallStarted, ev.Dtmf, ev.Dtmf, ev.CallEnded]
    presses = [e for e in publisher.events if isinstance(e, ev.Dtmf)]
    assert [(p.digit, p.index, p.duration_ms) for p in presses] == [("5", 0, 120), ("#", 1, 80)]
    ended = publisher.events[-1]
    assert isinstance(ended, ev.CallEnded) and ended.reason == "bye"
    assert ended.stats == {"audio_ms": {"k1-0": 1000}, "dtmf_events": {"k1-0": 2}}
    for seq, event in enumerate(publisher.events, start=1):
        jsonschema.validate({**event.to_json(), "seq": seq}, ev.schema())
    assert bridge.worker_errors == 0 and bridge.active_calls == 0


@pytest.mark.worker_errors_expected
def test_a_message_of_no_known_type_is_a_worker_error_not_an_ended_call() -> None:
    bridge, _engine, publisher = bridge_with_publisher()
    bridge._queue_put(("ended", "k2", "bye"))  # type: ignore[arg-type]  # the old tuple form
    bridge.stop()
    assert bridge.worker_errors == 1 and publisher.events == []
