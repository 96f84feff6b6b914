"""``kb_hooks.event_ids``: uuid4's text, unique within a process, across processes and restarts,
and in a forked child (which must not repeat its parent's sequence)."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import uuid
from multiprocessing.connection import Connection
from pathlib import Path

import jsonschema
import pytest

from kb_hooks import events as ev
from kb_hooks.event_ids import new_event_id
from kb_hooks.types import CallContext

REPO = Path(__file__).resolve().parents[1]
UUID4_HEX = re.compile(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}")
COUNT = 20_000


def ids(count: int = COUNT) -> list[str]:
    return [new_event_id() for _ in range(count)]


def test_an_id_is_what_uuid4_hex_gives() -> None:
    for event_id in ids(2_000):
        assert UUID4_HEX.fullmatch(event_id), event_id
        parsed = uuid.UUID(hex=event_id)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, event_id)


def test_ids_are_unique_within_a_process_and_every_random_bit_varies() -> None:
    made = ids()
    assert len(set(made)) == len(made)
    values = [int(event_id, 16) for event_id in made]
    ones = 0
    zeros = 0
    for value in values:
        ones |= value
        zeros |= ~value
    fixed = (0xF << 76) | (0b11 << 62)  # the version nibble and the variant bits
    assert (ones & zeros) & ((1 << 128) - 1) == ((1 << 128) - 1) & ~fixed


def test_events_carry_fresh_well_formed_ids() -> None:
    call = CallContext("call-1")
    events = [ev.CallEnded(call=call, reason="bye", stats={}) for _ in range(100)]
    assert len({e.event_id for e in events}) == 100
    for event in events:
        jsonschema.validate({**event.to_json(), "seq": 1}, ev.schema())
        assert UUID4_HEX.fullmatch(event.event_id)


def _child_ids(pipe: Connection) -> None:
    pipe.send(ids())
    pipe.close()


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_child_process_does_not_repeat_its_parents_ids(method: str) -> None:
    context = multiprocessing.get_context(method)
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_ids, args=(send,))  # type: ignore[attr-defined]
    child.start()
    send.close()
    parent_after_fork = ids()
    from_child = receive.recv()
    child.join(30)
    assert child.exitcode == 0
    assert len(from_child) == COUNT
    assert not set(from_child) & set(parent_after_fork)
    assert all(UUID4_HEX.fullmatch(event_id) for event_id in from_child)


def test_os_fork_reseeds_the_child() -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first ids, then exit without running the parent's teardown
        try:
            os.write(write_end, "".join(ids(100)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    parent_next = ids(100)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    from_child = [text[i : i + 32] for i in range(0, len(text), 32)]
    assert len(from_child) == 100
    assert not set(from_child) & set(parent_next)


def test_restarts_do_not_repeat_ids() -> None:
    script = "from kb_hooks.event_ids import new_event_id; print(' '.join(new_event_id() for _ in range(5000)))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", script]
    runs = [subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout.split() for _ in "ab"]
    assert all(len(run) == 5000 for run in runs)
    assert not set(runs[0]) & set(runs[1])
