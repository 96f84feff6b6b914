"""``deploy.bench.affinity``: core lists, pinning every thread of a process, and reading back
what this process and the ones it started may use."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from asr_gateway.dev.sipp_calls import pinned
from deploy.bench.affinity import AffinityError, cpus_seen, format_cpus, parse_cpus, pin

USABLE = sorted(os.sched_getaffinity(0))


def started(command: list[str], name: str) -> subprocess.Popen[bytes]:
    """``command`` once its process runs ``name`` (after ``taskset`` has set its cores and exec'd it)."""
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{process.pid}/comm").read_text().strip() != name:
        assert time.monotonic() < deadline, f"{command} did not start {name}"
        time.sleep(0.01)
    return process


def test_core_lists_read_like_tasksets() -> None:
    assert parse_cpus(str(USABLE[0])) == {USABLE[0]}
    assert parse_cpus(f"{USABLE[0]}-{USABLE[-1]}") >= {USABLE[0], USABLE[-1]}
    assert format_cpus({3, 0, 2}) == "0,2,3"
    with pytest.raises(AffinityError, match="not a core list"):
        parse_cpus("one")
    with pytest.raises(AffinityError, match=f"may use only {format_cpus(USABLE)}"):
        parse_cpus(str(USABLE[-1] + 1))


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable cores")
def test_a_pinned_process_keeps_every_thread_and_child_on_its_cores() -> None:
    """``pin`` sets every thread a process has (a thread started before it included); a child
    started under ``pinned`` runs on its own cores, and ``cpus_seen`` reads both back."""
    service, generator = {USABLE[1]}, {USABLE[0]}
    child = started([*pinned(generator), "sleep", "30"], "sleep")
    stop = threading.Event()
    early = threading.Thread(target=stop.wait, name="started-before-pin")
    early.start()
    try:
        pin(0, service)
        assert early.native_id is not None and os.sched_getaffinity(early.native_id) == service
        assert os.sched_getaffinity(child.pid) == generator
        later = started(["sleep", "30"], "sleep")  # inherits the pinned thread's cores
        try:
            assert os.sched_getaffinity(later.pid) == service
            assert cpus_seen()["service"] == service | generator  # both children are "sleep": service side
        finally:
            later.kill()
            later.wait()
    finally:
        stop.set()
        early.join()
        pin(0, USABLE)
        child.kill()
        child.wait()
