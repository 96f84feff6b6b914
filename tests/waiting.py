"""Waiting on a condition with a deadline, instead of sleeping a fixed time before an assert.

A fixed sleep is either too short on a loaded machine (a flaky failure) or longer than needed
(a slow suite); a wait returns as soon as the condition holds and fails, naming what it waited
for, only at the deadline. A sleep that paces a sender, or that gives something a window in
which it must NOT happen, stays a sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.005


def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0, what: str = "") -> None:
    """Return once ``predicate()`` is true; fail after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what or predicate}")
        time.sleep(POLL_S)


async def wait_until_async(predicate: Callable[[], object], timeout_s: float = 10.0, what: str = "") -> None:
    """``wait_until`` for a coroutine: the event loop runs while it waits."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what or predicate}")
        await asyncio.sleep(POLL_S)
