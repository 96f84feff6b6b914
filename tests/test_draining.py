"""``wait_while_progressing``: no total deadline while work moves; give up once it stalls."""

from __future__ import annotations

import threading
import time

from asr_common.draining import wait_while_progressing


def test_slow_work_that_keeps_moving_is_waited_for_past_the_stall_limit() -> None:
    done = threading.Event()
    steps = [0]

    def work() -> None:
        for _ in range(10):  # 0.5 s in all, each step well inside the 0.2 s stall limit
            time.sleep(0.05)
            steps[0] += 1
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    assert wait_while_progressing(done.is_set, lambda: steps[0], stall_s=0.2, poll_s=0.01)
    worker.join()
    assert steps[0] == 10


def test_stalled_work_is_given_up_after_the_stall_limit() -> None:
    started = time.monotonic()
    assert not wait_while_progressing(lambda: False, lambda: 0, stall_s=0.2, poll_s=0.01)
    assert time.monotonic() - started >= 0.2


def test_done_at_once_does_not_wait() -> None:
    assert wait_while_progressing(lambda: True, lambda: 0, stall_s=60.0)
