"""Where the service keeps its state (the Redis spool journal) when the config does not say.

A node must be able to spool during a Redis outage in every documented install, and neither
puts a writable directory beside the config: systemd's ``ProtectSystem=strict`` makes /etc
read-only, and a container's /etc belongs to root. So the default is, in order:

1. ``$STATE_DIRECTORY`` (systemd sets it from ``StateDirectory=hotline-asr``; the first one
   when several are listed),
2. ``/var/lib/hotline-asr`` when this user can write there (the container's volume),
3. ``$XDG_STATE_HOME/hotline-asr`` (``~/.local/state/hotline-asr``): a user running it by hand.

``writable_problems`` says, before anything is created, why a directory cannot be used.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from pathlib import Path

APP = "hotline-asr"
SYSTEM_STATE_DIR = Path("/var/lib") / APP


def default_state_dir(environ: Mapping[str, str]) -> Path:
    systemd = environ.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd:
        return Path(systemd)
    if _can_create_or_write(SYSTEM_STATE_DIR):
        return SYSTEM_STATE_DIR
    xdg = environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path(environ.get("HOME") or Path.home()) / ".local" / "state"
    return base / APP


def writable_problems(directory: Path, setting: str) -> list[str]:
    """An error line when ``directory`` is not writable by this process and cannot be created."""
    if _can_create_or_write(directory):
        return []
    user = _user()
    return [
        f"{setting} {directory} is not writable by user {user} (or cannot be created): set {setting} to a "
        f"writable directory on a local disk; under systemd, StateDirectory={APP} provides one (docs/operations.md)"
    ]


def _can_create_or_write(directory: Path) -> bool:
    """Writable if it exists, else its nearest existing ancestor is (without creating anything)."""
    path = directory
    while not path.exists():
        if path.parent == path:
            return False
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"
