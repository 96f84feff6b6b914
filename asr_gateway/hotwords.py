"""The routes' hotword phrase files as context graphs, loaded once and reloaded like KB sets.

A profile names a phrase file (``hotwords: FILE``, relative to the routes file); every call
routed to it biases its finals' CTC search with that file's graph. On SIGHUP or a file change
the graph is rebuilt; a file that fails to load keeps its previous graph (errors name
``file:line``). Graphs are immutable, so streams already open keep the one they started with.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from asr_common.yamlconf import ConfigError
from asr_core.context_graph import ContextGraph, HotwordsError, load_graph
from kb_hooks.reload import ReloadableRef, ReloadResult


class HotwordLists:
    """Context graphs by phrase file, spelled in the model's ``units``."""

    def __init__(self, units: Sequence[str], base: Path) -> None:
        self._units = list(units)
        self._base = base
        self._lock = threading.Lock()
        self._refs: dict[Path, ReloadableRef[ContextGraph]] = {}

    def path(self, name: str) -> Path:
        """A profile's ``hotwords`` value as a file path (relative ones from the routes' folder)."""
        path = Path(name)
        return path if path.is_absolute() else self._base / path

    def _load(self, path: Path) -> ContextGraph:
        try:
            return load_graph(path, self._units)
        except HotwordsError as exc:
            raise ConfigError([str(exc)]) from None

    def sync(self, names: Iterable[str]) -> list[str]:
        """Load the files named that are not loaded yet and forget those no longer named.

        Returns the problems (one line each); on any, nothing changes.
        """
        wanted = {self.path(name) for name in names}
        loaded: dict[Path, ReloadableRef[ContextGraph]] = {}
        problems: list[str] = []
        for path in sorted(wanted - set(self._refs)):
            try:
                loaded[path] = ReloadableRef(path, self._load)
            except ConfigError as exc:
                problems.extend(exc.errors)
        if problems:
            return problems
        with self._lock:
            self._refs = {path: ref for path, ref in {**self._refs, **loaded}.items() if path in wanted}
        return []

    def get(self, name: str | None) -> ContextGraph | None:
        """The current graph of a profile's ``hotwords`` (None: no list, or not loaded)."""
        if name is None:
            return None
        ref = self._refs.get(self.path(name))
        return ref.get() if ref is not None else None

    def files(self) -> list[Path]:
        return list(self._refs)

    def content_hashes(self) -> dict[str, str]:
        """The sha256 of every phrase list in force."""
        return {f"hotwords:{path}": ref.content_hash for path, ref in list(self._refs.items())}

    def reload_all(self) -> dict[str, ReloadResult]:
        """Rebuild the graphs whose files changed; keep the previous graph of a broken file."""
        return {f"hotwords {path}": ref.try_reload() for path, ref in list(self._refs.items())}
