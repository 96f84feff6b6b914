"""``asr_gateway.bridge_queue.WorkQueue``, the bridge worker's inbox: one FIFO for every producer;
past its bound the event loop's ``put`` still queues (counted, never waits), an engine thread's
``put_waiting`` waits for room, and ``offer`` (partials) drops."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from asr_gateway.bridge_queue import WorkQueue

DEADLINE_S = 10.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S:.0f} s"
        time.sleep(0.005)


def test_every_way_in_keeps_one_order() -> None:
    queue: WorkQueue[str] = WorkQueue(bound=10)
    queue.put("announce")
    assert queue.offer("partial")
    queue.put_waiting("final")
    queue.put("ended")
    assert [queue.get() for _ in range(4)] == ["announce", "partial", "final", "ended"]
    assert len(queue) == 0 and queue.peak == 4


def test_the_loop_put_never_waits_past_the_bound_and_is_counted() -> None:
    queue: WorkQueue[int] = WorkQueue(bound=2)
    for item in range(5):
        queue.put(item)  # no worker takes anything: it must return at once all the same
    assert len(queue) == 5 and queue.over_bound == 3 and queue.peak == 5
    assert not queue.offer(99), "a partial past the bound is dropped"
    assert [queue.get() for _ in range(5)] == [0, 1, 2, 3, 4]


def test_an_engine_put_waits_for_room_and_loses_nothing() -> None:
    queue: WorkQueue[str] = WorkQueue(bound=1)
    queue.put("first")
    engine = threading.Thread(target=queue.put_waiting, args=("final",))
    engine.start()
    wait_until(lambda: queue.waited == 1, "engine put waiting for room")
    queue.put("ended")  # the loop, meanwhile: queued ahead of the waiting final, never waits
    assert queue.get() == "first"
    assert queue.get() == "ended"
    engine.join(DEADLINE_S)
    assert not engine.is_alive()
    assert queue.get() == "final" and len(queue) == 0


def test_a_waiting_worker_takes_what_comes_from_another_thread() -> None:
    queue: WorkQueue[int] = WorkQueue(bound=4)
    taken: list[int] = []
    worker = threading.Thread(target=lambda: taken.extend(queue.get() for _ in range(20)))
    worker.start()
    for item in range(20):
        queue.put_waiting(item)
    worker.join(DEADLINE_S)
    assert not worker.is_alive() and taken == list(range(20))
