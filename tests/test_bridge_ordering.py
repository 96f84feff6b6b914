"""``CallBridge``'s worker queue seen from its producers: while the worker is stuck, the event
loop's messages (key presses, the call's end) are queued past the bound at once and an engine
thread's stream end waits for room; once the worker moves, every message is published in the
call's order (``call.started`` first, ``call.ended`` last). A call that ends while it waits for a
join partner and before any transcript is still announced before it ends."""

from __future__ import annotations

import asyncio
import threading

from asr_core.events import Ended
from asr_gateway.bridge import CallBridge
from calls.call import CallInfo, LegInfo
from calls.profile import Profile
from kb_hooks import events as ev
from rtp.dtmf import KeyPress
from tests.bridge_fakes import FakeEngine, RecordingPublisher, bare_processor
from tests.waiting import wait_until


class GatedPublisher(RecordingPublisher):
    """Records events; its first ``submit`` holds the worker until ``gate`` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.holding = threading.Event()

    def submit(self, event: ev.Event, *, audio_end_monotonic: float | None = None) -> None:
        self.holding.set()
        self.gate.wait()
        super().submit(event, audio_end_monotonic=audio_end_monotonic)


def call(call_id: str, profile: Profile, join_key: str | None = None) -> tuple[CallInfo, LegInfo]:
    leg = LegInfo(f"{call_id}-0", None, "caller", "sip:a@b", "PCMU")
    info = CallInfo(call_id, "sip", f"sip-{call_id}", "sip:a@b", None, "sip:r@asr", None,
                    ("127.0.0.1", 5060, "udp"), None, profile, False, (leg,), join_key=join_key)  # fmt: skip
    return info, leg


def test_a_stuck_worker_never_holds_the_loop_and_loses_no_message() -> None:
    engine, publisher = FakeEngine(), GatedPublisher()
    bridge = CallBridge(engine, bare_processor(), publisher, queue_size=1)
    bridge.start()
    info, leg = call("stuck", Profile(dtmf="publish", redaction="keep"))
    try:
        sink = bridge.open_leg(info, leg)  # no event loop: announced at once; the worker sticks in it
        wait_until(publisher.holding.is_set, what="the worker holding call.started")
        for key in "123":
            sink.dtmf(KeyPress(key, 80, 0))  # the loop's messages: queued at once, past the bound of 1
        ending = threading.Thread(target=engine.callbacks[leg.leg_id], args=(Ended(leg.leg_id, 0, "bye", 900),))
        ending.start()  # an engine thread: its stream end waits for room
        wait_until(lambda: bridge.queue.waited == 1, what="the stream end waiting for room")
        bridge.call_ended(info, "bye")  # the loop again: never waits, passes the waiting stream end
        assert len(bridge.queue) == 4 and bridge.queue.over_bound == 3  # the first key press found room
    finally:
        publisher.gate.set()
    ending.join(10)
    bridge.stop()
    kinds = [type(e) for e in publisher.events]
    assert kinds == [ev.CallStarted, ev.Dtmf, ev.Dtmf, ev.Dtmf, ev.CallEnded]
    assert [e.digit for e in publisher.events if isinstance(e, ev.Dtmf)] == ["1", "2", "3"]
    ended = publisher.events[-1]
    assert isinstance(ended, ev.CallEnded) and ended.stats["audio_ms"] == {leg.leg_id: 900}
    assert bridge.active_calls == 0 and bridge.table.empty()


def test_a_call_that_ends_waiting_for_its_partner_is_announced_before_it_ends() -> None:
    engine, publisher = FakeEngine(), RecordingPublisher()
    bridge = CallBridge(engine, bare_processor(), publisher)
    bridge.start()
    info, leg = call("alone", Profile(redaction="keep", join_timeout_s=60), join_key="cucm=1")

    async def scenario() -> None:
        bridge.open_leg(info, leg)  # waits up to 60 s for a partner with the same key
        engine.callbacks[leg.leg_id](Ended(leg.leg_id, 0, "bye", 500))
        bridge.call_ended(info, "bye")

    asyncio.run(scenario())
    bridge.stop()
    assert [type(e) for e in publisher.events] == [ev.CallStarted, ev.CallEnded]
    assert publisher.started == [("alone", ["caller"])] and publisher.ended == ["alone"]
    assert bridge.table.empty(), "the closed join leaves nothing behind"
