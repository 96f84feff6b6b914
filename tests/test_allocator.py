"""The engine's commands run on jemalloc where it is installed (asr_common.allocator), and
memtrim hands jemalloc's kept pages back."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from asr_common import allocator

needs_jemalloc = pytest.mark.skipif(
    not allocator.jemalloc_installed(), reason="libjemalloc.so.2 is not installed (Debian package libjemalloc2)"
)


class Exec:
    """Stands in for os.execv: records the call instead of replacing the process."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, path: str, argv: list[str]) -> None:
        self.calls.append((path, argv))


def test_preloads_jemalloc_and_runs_the_same_command_again() -> None:
    environ = {"LD_PRELOAD": "libother.so"}
    execv = Exec()
    allocator.prefer_jemalloc(
        environ, ["python", "-m", "x", "serve"], execv, loaded=lambda: False, installed=lambda: True
    )
    assert execv.calls == [(sys.executable, ["python", "-m", "x", "serve"])]
    assert environ["LD_PRELOAD"] == f"{allocator.LIBRARY} libother.so"
    assert environ["MALLOC_CONF"] == allocator.CONF


def test_keeps_a_malloc_conf_the_operator_set() -> None:
    environ = {"MALLOC_CONF": "narenas:2"}
    allocator.prefer_jemalloc(environ, ["x"], Exec(), loaded=lambda: False, installed=lambda: True)
    assert environ["MALLOC_CONF"] == "narenas:2"
    assert environ["LD_PRELOAD"] == allocator.LIBRARY


@pytest.mark.parametrize(
    ("environ", "loaded", "installed", "says"),
    [
        ({}, True, True, "jemalloc (libjemalloc.so.2"),
        ({"HOTLINE_ASR_ALLOCATOR": "system"}, False, True, "glibc malloc (HOTLINE_ASR_ALLOCATOR=system)"),
        ({"HOTLINE_ASR_ALLOCATOR": "tcmalloc"}, False, True, "is not one of jemalloc, system"),
        ({}, False, False, "not installed (Debian package libjemalloc2)"),
        # preloaded once already and still not mapped: never execute again (no loop)
        ({"HOTLINE_ASR_ALLOCATOR_TRIED": "1"}, False, True, "the loader refused it"),
    ],
)
def test_runs_on_as_it_is_where_jemalloc_cannot_or_must_not_be_loaded(
    environ: dict[str, str], loaded: bool, installed: bool, says: str
) -> None:
    execv = Exec()
    note = allocator.prefer_jemalloc(dict(environ), ["x"], execv, loaded=lambda: loaded, installed=lambda: installed)
    assert says in note
    assert execv.calls == []
    assert says in allocator.describe(dict(environ), loaded=lambda: loaded, installed=lambda: installed)


def clean_environment() -> dict[str, str]:
    """This environment without any allocator choice the test runner may carry."""
    chosen = ("LD_PRELOAD", "MALLOC_CONF", allocator.CHOICE_ENV, "HOTLINE_ASR_ALLOCATOR_TRIED")
    return {key: value for key, value in os.environ.items() if key not in chosen}


@needs_jemalloc
def test_a_real_command_runs_again_on_jemalloc_in_the_same_process() -> None:
    code = textwrap.dedent(
        """
        import os, sys
        print("pid", os.getpid(), file=sys.stderr, flush=True)
        from asr_common import allocator
        note = allocator.prefer_jemalloc()
        print(os.getpid(), allocator.jemalloc_loaded(), os.environ["MALLOC_CONF"], note, sep="|")
        """
    )
    env = clean_environment()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    pids = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("pid ")]
    pid, loaded, conf, note = done.stdout.strip().split("|")
    assert pids == [pid, pid], "executed again, once, as the same process"
    assert (loaded, conf) == ("True", allocator.CONF)
    assert note.startswith("jemalloc (")


@needs_jemalloc
def test_trim_gives_back_the_pages_jemalloc_keeps() -> None:
    code = textwrap.dedent(
        """
        from asr_common import allocator
        allocator.prefer_jemalloc()
        from asr_core import memtrim
        block = bytearray(300 * 1024 * 1024)  # zero-filled: every page touched
        del block
        kept = memtrim.rss_mb()
        purged = memtrim.trim()
        print(kept, memtrim.rss_mb(), purged)
        """
    )
    env = clean_environment()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    kept, after, purged = done.stdout.split()
    assert purged == "True"
    assert float(kept) - float(after) > 250, f"RSS {kept} MB with the freed block kept, {after} MB after trim"
