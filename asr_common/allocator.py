"""The process's memory allocator: jemalloc where it is installed, glibc's malloc otherwise.

Why: the chunk step allocates and frees hundreds of tensors per call, from two or more threads,
in shapes that change every tick. Under glibc's malloc the int8 step spent about 5 % of its time
inside ``posix_memalign``; under jemalloc, with its return of freed pages to the kernel turned
off (``MALLOC_CONF`` below), the same traced steps took 9-14 % less time on an AMX Xeon (2-6 %
with oneDNN capped to AVX2) and the engine's step CPU per second of audio fell 6 % (AISHELL size,
torch-int8, 16-84 streams, docs/BENCHMARKS.md). jemalloc's default, which gives freed pages back
within seconds, was no faster than glibc at 84 streams.

How: an allocator is chosen when the process starts, so the command-line entry points call
:func:`prefer_jemalloc` first: where ``libjemalloc.so.2`` is installed (Debian's
``libjemalloc2``) and not loaded yet, it puts it in ``LD_PRELOAD``, sets ``MALLOC_CONF`` (unless
already set) and executes the same command again, with the same PID and arguments. Child
processes (the finals search) inherit both. The memory that jemalloc then keeps is handed back
by ``asr_core.memtrim.trim`` about once a minute, as glibc's is.

``HOTLINE_ASR_ALLOCATOR=system`` keeps glibc's malloc; where jemalloc is not installed, or the
loader refused it, the process goes on with glibc's, and :func:`prefer_jemalloc` says why.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path

CHOICE_ENV = "HOTLINE_ASR_ALLOCATOR"
"""``jemalloc`` (the default) or ``system``."""
CHOICES = ("jemalloc", "system")
LIBRARY = "libjemalloc.so.2"
CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
"""jemalloc keeps freed pages for reuse instead of returning them over the next seconds."""
_TRIED_ENV = "HOTLINE_ASR_ALLOCATOR_TRIED"  # set before executing again: never loop


def jemalloc_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether jemalloc is mapped into this process (read from ``/proc/self/maps``; False where
    that file does not exist)."""
    try:
        return "libjemalloc" in maps.read_text(encoding="ascii", errors="replace")
    except OSError:
        return False


def jemalloc_installed() -> bool:
    """Whether the dynamic loader can find ``libjemalloc.so.2``."""
    return ctypes.util.find_library("jemalloc") == LIBRARY


def describe(
    environ: MutableMapping[str, str] | None = None,
    loaded: Callable[[], bool] = jemalloc_loaded,
    installed: Callable[[], bool] = jemalloc_installed,
) -> str:
    """Which allocator this process runs on, and why not jemalloc (one line for the log)."""
    return _settled(os.environ if environ is None else environ, loaded, installed) or (
        f"glibc malloc: {LIBRARY} is installed but not loaded (the command did not ask for it)"
    )


def _settled(
    environ: MutableMapping[str, str], loaded: Callable[[], bool], installed: Callable[[], bool]
) -> str | None:
    """:func:`describe`'s line, or None where preloading jemalloc would change it."""
    choice = environ.get(CHOICE_ENV, "jemalloc")
    if choice not in CHOICES:
        return f"glibc malloc: {CHOICE_ENV}={choice!r} is not one of {', '.join(CHOICES)}"
    if choice == "system":
        return f"glibc malloc ({CHOICE_ENV}=system)"
    if loaded():
        return f"jemalloc ({LIBRARY}, MALLOC_CONF={environ.get('MALLOC_CONF', '')!r})"
    if environ.get(_TRIED_ENV):
        return f"glibc malloc: {LIBRARY} was preloaded but is not mapped (the loader refused it)"
    if not installed():
        return f"glibc malloc: {LIBRARY} is not installed (Debian package libjemalloc2)"
    return None


def prefer_jemalloc(
    environ: MutableMapping[str, str] | None = None,
    argv: list[str] | None = None,
    execv: Callable[[str, list[str]], object] = os.execv,
    loaded: Callable[[], bool] = jemalloc_loaded,
    installed: Callable[[], bool] = jemalloc_installed,
) -> str:
    """Run this process on jemalloc where that is possible: return :func:`describe`'s line, or,
    where jemalloc must be loaded first, execute the same command (``sys.orig_argv``) again with
    it preloaded and not return.

    Call it before anything else, from a command's entry point only (never from a library
    call: the process is replaced). The keyword arguments are for tests."""
    environ = os.environ if environ is None else environ
    settled = _settled(environ, loaded, installed)
    if settled is not None:
        return settled
    argv = list(sys.orig_argv) if argv is None else argv
    preload = environ.get("LD_PRELOAD", "")
    environ["LD_PRELOAD"] = f"{LIBRARY} {preload}".strip()
    environ.setdefault("MALLOC_CONF", CONF)
    environ[_TRIED_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    execv(sys.executable, argv)
    return "jemalloc (preloaded; the command runs again)"  # only where execv is a test's stand-in
