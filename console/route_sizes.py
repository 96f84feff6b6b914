"""Each route's own chunk size, from the routes file the gateways run, for telling a party that
runs slower than its route (surge: docs/events.md ``chunk_ms``) from one that runs as routed.

The calls index asks on every transcript, so the file is parsed only when it changed (its
modification time, looked at most once per ``CHECK_S``). A file that does not load leaves the
sizes unknown rather than stale: the console then compares with the smallest size each party
reported (console/feeds.py ``PartyPace``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from asr_common.yamlconf import ConfigError
from calls.routing import load_routes

log = logging.getLogger(__name__)

CHECK_S = 1.0


class RouteChunkSizes:
    """``sizes(route)``: the chunk size (ms) of the profile that takes calls of ``route`` (an
    event's ``route``: a rule's name, None for the default profile), or None where unknown."""

    def __init__(self, routes: Path | None) -> None:
        self.routes = routes
        self._mtime_ns: int | None = -1
        self._checked = float("-inf")
        self._sizes: dict[str | None, int] = {}

    def __call__(self, route: str | None) -> int | None:
        now = time.monotonic()
        if self.routes is not None and now - self._checked >= CHECK_S:
            self._checked = now
            self._refresh(self.routes)
        return self._sizes.get(route)

    def _refresh(self, path: Path) -> None:
        try:
            mtime_ns: int | None = path.stat().st_mtime_ns
        except OSError:
            mtime_ns = None  # gone: load_routes below says why, once
        if mtime_ns == self._mtime_ns:
            return
        self._mtime_ns = mtime_ns
        try:
            routes = load_routes(path).routes
        except (OSError, ConfigError) as exc:
            log.warning("routes file %s not read (%s): slowed-down parties are judged by their own reports", path, exc)
            self._sizes = {}
            return
        profiles = routes.profiles
        sizes: dict[str | None, int] = {r.name: profiles[r.profile].chunk_ms for r in routes.routes}
        default = profiles.get(routes.default_profile) if routes.default_profile is not None else None
        if default is not None:
            sizes[None] = default.chunk_ms
        self._sizes = sizes
