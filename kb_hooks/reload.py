"""Atomic swapping of a loaded KB or tag rule set when its file changes.

The service calls ``try_reload()`` on SIGHUP or when it sees the file change; readers call
``get()`` per utterance. A file that fails to load leaves the previous version in place and
the errors are returned (file:line) for the log.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from asr_common.yamlconf import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    changed: bool
    content_hash: str
    errors: list[str] = field(default_factory=list)


class ReloadableRef(Generic[T]):
    """Holds the current value loaded from ``path``; ``get()`` is lock-free, swaps are atomic."""

    def __init__(self, path: Path | str, loader: Callable[[Path], T]) -> None:
        self.path = Path(path)
        self._loader = loader
        self._lock = threading.Lock()
        self._value = loader(self.path)  # ConfigError propagates: a service must not start on a broken file
        self._hash = self._file_hash()

    @classmethod
    def fixed(cls, value: T) -> ReloadableRef[T]:
        """A ref that never reloads (tests, in-memory KBs)."""
        ref = cls.__new__(cls)
        ref.path = Path()
        ref._loader = lambda _path: value
        ref._lock = threading.Lock()
        ref._value = value
        ref._hash = ""
        return ref

    def get(self) -> T:
        return self._value

    @property
    def content_hash(self) -> str:
        return self._hash

    def _file_hash(self) -> str:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return ""

    def try_reload(self, force: bool = False) -> ReloadResult:
        """Load the file again if its content changed; keep the previous value on any error."""
        with self._lock:
            if not self.path.name:
                return ReloadResult(True, False, self._hash)
            new_hash = self._file_hash()
            if not new_hash:
                message = f"{self.path}: cannot read; keeping the previous version"
                return ReloadResult(False, False, self._hash, [message])
            if new_hash == self._hash and not force:
                return ReloadResult(True, False, self._hash)
            try:
                value = self._loader(self.path)
            except ConfigError as exc:
                return ReloadResult(False, False, self._hash, exc.errors)
            self._value, self._hash = value, new_hash
            return ReloadResult(True, True, new_hash)
