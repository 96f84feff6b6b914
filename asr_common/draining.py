"""``wait_while_progressing``: wait for finite work to finish, however slow, unless it stalls.

A graceful stop must not drop work already accepted (a call's last chunks, its finals, its
``call.ended``) just because the machine is slow; it may give up only on a component that has
stopped moving. So stop-time waits have no total deadline: they wait while a progress
signature keeps changing, and give up after ``stall_s`` seconds without any change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


def wait_while_progressing(
    done: Callable[[], bool], progress: Callable[[], Hashable], stall_s: float, poll_s: float = 0.05
) -> bool:
    """Block until ``done()``; True then, False when ``progress()`` stayed the same for ``stall_s`` s."""
    last = progress()
    moved_at = time.monotonic()
    while not done():
        time.sleep(poll_s)
        now = time.monotonic()
        current = progress()
        if current != last:
            last, moved_at = current, now
        elif now - moved_at >= stall_s:
            return done()
    return True
