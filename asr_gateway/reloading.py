"""Reloading the routes, the features' files (``kb_hooks.features``: KB, tag, analytics rules,
street lists ...) and the hotword files while calls go on.

A reload runs on SIGHUP, on ``reload`` from the console on ``{prefix}:control`` (``heartbeat``)
and when a watched file changes (polled every ``RELOAD_POLL_S``). An invalid file is rejected,
logged with its errors, and the previous version stays in force. ``config_version`` names the
versions in force, for ``/metrics``, the heartbeat and the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asr_common.yamlconf import ConfigError
from asr_gateway.config import ServiceConfig
from asr_gateway.hotwords import HotwordLists
from kb_hooks.processor import TranscriptProcessor

log = logging.getLogger(__name__)

RELOAD_POLL_S = 2.0


@dataclass(frozen=True)
class ReloadStatus:
    """The outcome of the last configuration load (start-up or reload), for /metrics and the console."""

    at_unix: float
    ok: bool
    errors: tuple[str, ...] = ()


def routes_hash(config: ServiceConfig) -> str:
    """sha256 of the routes file as read now ("" when the built-in default routes are used)."""
    if config.routes is None:
        return ""
    try:
        return hashlib.sha256(Path(config.routes).read_bytes()).hexdigest()
    except OSError:
        return ""


def _files_signature(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with contextlib.suppress(OSError):
            stat = path.stat()
            digest.update(f"{path}:{stat.st_mtime_ns}:{stat.st_size};".encode())
    return digest.hexdigest()


class ConfigReloader:
    """Reloads the files ``config`` names into their holders and watches them for changes.

    ``reload_routes`` loads the routes file and puts it in force, or raises ``ConfigError`` (or
    ``ValueError``) and changes nothing; ``routes_in_force`` is the hash of the routes loaded at
    start (``routes_hash``, read before them).
    """

    def __init__(
        self,
        config: ServiceConfig,
        processor: TranscriptProcessor,
        hotwords: HotwordLists,
        reload_routes: Callable[[], None],
        routes_in_force: str,
    ) -> None:
        self.config = config
        self.processor = processor
        self.hotwords = hotwords
        self._reload_routes = reload_routes
        self._routes_hash = routes_in_force
        self._signature = _files_signature(self._watched_files())
        self._task: asyncio.Task[None] | None = None
        self.last_reload = ReloadStatus(time.time(), True)
        self.reloads = 0  # reloads tried since start (SIGHUP, the console, or a watched file changed)
        self.reload_failures = 0  # of which at least one file was rejected

    def _watched_files(self) -> list[Path]:
        kb_hooks = self.config.kb_hooks
        files = [path for s in self.processor.features.file_sets() for path in s.paths(kb_hooks).values()]
        files += self.hotwords.files()
        if self.config.routes is not None:
            files.append(self.config.routes)
        return files

    @property
    def config_version(self) -> str:
        """A short hash of the routing, KB, tag and hotword files in force.

        It changes exactly when a reload puts a new version of one of them in force (a rejected
        file keeps the previous hash), so operators and the console can see which version each
        node runs.
        """
        parts = {"routes": self._routes_hash, **self.processor.content_hashes(), **self.hotwords.content_hashes()}
        digest = hashlib.sha256()
        for name in sorted(parts):
            digest.update(f"{name}={parts[name]};".encode())
        return digest.hexdigest()[:16]

    def reload(self) -> bool:
        """Reload routes, KB, tag and hotword files; keep the previous version of any invalid one."""
        ok = True
        errors: list[str] = []
        try:
            new_routes_hash = routes_hash(self.config)
            self._reload_routes()
        except (ConfigError, ValueError) as exc:
            ok = False
            errors.extend(exc.errors if isinstance(exc, ConfigError) else [str(exc)])
            log.error("routes reload rejected, previous routes kept: %s", exc)
        else:
            self._routes_hash = new_routes_hash
            log.info("routes reloaded from %s", self.config.routes or "defaults")
        for name, result in {**self.processor.reload_all(), **self.hotwords.reload_all()}.items():
            if not result.ok:
                ok = False
                errors.extend(result.errors)
                log.error("%s reload rejected, previous version kept: %s", name, "; ".join(result.errors))
            elif result.changed:
                log.info("%s reloaded, content hash %s", name, result.content_hash)
        self._signature = _files_signature(self._watched_files())
        self.last_reload = ReloadStatus(time.time(), ok, tuple(errors))
        self.reloads += 1
        self.reload_failures += not ok
        log.info("config version %s", self.config_version)
        return ok

    def start(self) -> None:
        """Watch the files: reload when one of them changes (size or modification time)."""
        self._task = asyncio.create_task(self._watch(), name="config-reload")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_POLL_S)
            if _files_signature(self._watched_files()) != self._signature:
                self.reload()
