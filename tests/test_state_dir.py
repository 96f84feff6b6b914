"""The spool's default home: a writable state directory, never beside the (read-only) config.

``$STATE_DIRECTORY`` (systemd ``StateDirectory=``) first, then ``/var/lib/hotline-asr`` when
writable (the container's volume), then the user's ``$XDG_STATE_HOME``; a spool directory that
cannot be written stops ``check-config`` and ``serve`` with a clear error, and a service
started without ``redis.spool_dir`` journals into the state directory while Redis is down.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from asr_gateway import state_dir
from asr_gateway.config import load_config
from asr_gateway.dev.demo import DATA_DIR
from asr_gateway.dev.local_redis import free_tcp_port
from asr_gateway.service import DEMO_MODEL_DIR, Service

REPO = Path(__file__).resolve().parents[1]


def uncreatable(tmp_path: Path) -> Path:
    """A directory path nobody can create, root included: its parent is a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n", encoding="utf-8")
    return blocker / "hotline-asr"


def test_systemd_state_directory_comes_first(tmp_path: Path) -> None:
    environ = {"STATE_DIRECTORY": f"{tmp_path / 'state'}:{tmp_path / 'other'}", "XDG_STATE_HOME": "/nowhere"}
    assert load_config(None, environ).redis.spool_dir == tmp_path / "state" / "spool"


def test_system_dir_when_writable_else_the_users_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    monkeypatch.setattr(state_dir, "SYSTEM_STATE_DIR", tmp_path / "var" / "lib" / "hotline-asr")
    assert load_config(None, environ).redis.spool_dir == tmp_path / "var" / "lib" / "hotline-asr" / "spool"
    monkeypatch.setattr(state_dir, "SYSTEM_STATE_DIR", uncreatable(tmp_path))
    assert load_config(None, environ).redis.spool_dir == tmp_path / "xdg" / "hotline-asr" / "spool"
    assert load_config(None, {"HOME": str(tmp_path)}).redis.spool_dir == tmp_path / ".local/state/hotline-asr/spool"


def test_a_spool_dir_set_in_the_config_is_kept(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("redis: {spool_dir: journal}\n", encoding="utf-8")
    assert load_config(config, {"STATE_DIRECTORY": "/elsewhere"}).redis.spool_dir == tmp_path / "journal"


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_an_unwritable_spool_dir_is_a_clear_startup_error(tmp_path: Path, command: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("engine: {max_streams: 2}\n", encoding="utf-8")
    spool = uncreatable(tmp_path) / "spool"
    args = [str(config)] if command == "check-config" else ["--config", str(config)]
    done = subprocess.run(
        [sys.executable, "-m", "asr_gateway.cli", command, *args],
        env={"STATE_DIRECTORY": str(spool.parent), "PATH": "/usr/bin:/bin"},
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"redis.spool_dir {spool} is not writable" in done.stderr, done.stderr
    assert "StateDirectory=hotline-asr" in done.stderr


def test_a_service_without_spool_dir_journals_into_the_state_directory(tmp_path: Path) -> None:
    """Redis is down (nothing listens on its port): the service starts, its spool journal lives
    under $STATE_DIRECTORY, and it is ready for calls: their events wait in the spool."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        f"""
sip: {{host: 127.0.0.1, port: 0, transports: [udp]}}
engine: {{model_dir: {DEMO_MODEL_DIR}, max_streams: 2, max_batch: 2}}
redis: {{url: "redis://127.0.0.1:{free_tcp_port()}/0", connect_timeout_s: 0.2}}
metrics: {{host: 127.0.0.1, port: 0}}
routes: {DATA_DIR / "routes.yaml"}
kb_hooks:
  kb_sets: {{hotline: {DATA_DIR / "kb.yaml"}}}
  tag_rule_sets: {{hotline: {DATA_DIR / "tags.yaml"}}}
  analytics_rule_sets: {{hotline: {DATA_DIR / "analytics.yaml"}}}
  street_lists: {{hotline: {DATA_DIR / "streets.txt"}}}
""",
        encoding="utf-8",
    )
    state = tmp_path / "state"
    config = load_config(config_file, {"STATE_DIRECTORY": str(state)})

    async def scenario() -> tuple[list[str], int, bool]:
        service = Service(config)
        ports = await service.start()
        try:
            url = f"http://127.0.0.1:{ports.metrics}/health/ready"
            ready = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).status)
            return sorted(p.name for p in (state / "spool").iterdir()), ready, service.publisher.connected
        finally:
            await service.stop(grace_s=0.5)

    files, ready, connected = asyncio.run(scenario())
    assert "events.lock" in files, files
    assert ready == 200 and not connected
