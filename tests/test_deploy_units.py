"""The shipped systemd units and container files: the gateway's and the console's units pass
``systemd-analyze verify`` without a warning, and both images probe /health/live, keep the
spool in a state volume and carry the console."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from asr_gateway.state_dir import APP, SYSTEM_STATE_DIR

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNIT = DEPLOY / "systemd" / "hotline-asr.service"
CONSOLE_UNIT = DEPLOY / "systemd" / "hotline-asr-console.service"
INSTALL_PREFIX = "/opt/hotline-asr"
MAKEFILE = DEPLOY.parent / "Makefile"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (Debian systemd)")
@pytest.mark.parametrize(
    ("unit", "command"),
    [(UNIT, "asr-gateway serve --config "), (CONSOLE_UNIT, "asr-console --config ")],
    ids=["gateway", "console"],
)
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path, unit: Path, command: str) -> None:
    """``systemd-analyze verify`` fails a unit whose ExecStart= is not an executable file, and
    the unit's /opt/hotline-asr/venv/bin/... exists only on an installed node (verify's
    --root= would need a whole system image). So it checks a copy whose one change is that
    install prefix, pointed at a stub executable under tmp_path; every other byte is the
    shipped file's. Its warnings (unknown keys, values it cannot parse) fail the test too:
    verify still exits 0 on them."""
    text = unit.read_text(encoding="utf-8")
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart={INSTALL_PREFIX}/venv/bin/{command}"), exec_start
    prefix = tmp_path / "opt" / "hotline-asr"
    stub = prefix / "venv" / "bin" / command.split()[0]
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    stub.chmod(0o755)
    copy = tmp_path / unit.name
    copy.write_text(text.replace(f"ExecStart={INSTALL_PREFIX}/", f"ExecStart={prefix}/"), encoding="utf-8")
    done = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not done.stderr.strip() and not done.stdout.strip(), done.stdout + done.stderr


def test_the_unit_gives_the_spool_its_state_directory() -> None:
    keys = dict(re.findall(r"^(\w+)=(.*)$", UNIT.read_text(encoding="utf-8"), flags=re.MULTILINE))
    assert keys["StateDirectory"] == APP  # systemd passes /var/lib/hotline-asr as $STATE_DIRECTORY
    assert keys["ProtectSystem"] == "strict", "the reason the spool cannot live beside the config in /etc"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_the_images_probe_liveness_and_keep_the_state_in_a_volume(name: str) -> None:
    text = (DEPLOY / "container" / name).read_text(encoding="utf-8")
    healthcheck = re.search(r"^HEALTHCHECK (?:.*\\\n)*.*$", text, flags=re.MULTILINE)  # with its continued lines
    assert healthcheck is not None
    probe = healthcheck.group(0)
    assert "/health/live" in probe and "/health'" not in probe, "a full node must not fail its HEALTHCHECK"
    volumes = re.search(r"^VOLUME \[(.*)\]$", text, flags=re.MULTILINE)
    assert volumes is not None and f'"{SYSTEM_STATE_DIR}"' in volumes.group(1)
    assert f"install -d -o {APP} -g {APP}" in text and str(SYSTEM_STATE_DIR) in text
    assert "USER hotline-asr" in text


def test_the_cpu_image_pins_the_torch_the_makefile_installs() -> None:
    pinned = re.search(r"torch==([\w.+]+)", MAKEFILE.read_text(encoding="utf-8"))
    assert pinned is not None
    assert f'"torch=={pinned.group(1)}"' in (DEPLOY / "container" / "Dockerfile.cpu").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_the_images_carry_the_console_and_say_how_to_run_it(name: str) -> None:
    text = (DEPLOY / "container" / name).read_text(encoding="utf-8")
    installed = re.search(r'"hotline-asr\[([\w,]+)\]"', text)
    assert installed is not None and "console" in installed.group(1).split(",")
    assert "cp /etc/hotline-asr/console.example.yaml /etc/hotline-asr/console.yaml" in text
    assert "cp /etc/hotline-asr/users.example.yaml /etc/hotline-asr/users.yaml" in text
    assert re.search(r"^#\s+hotline-asr:[\w.-]+ console --config /etc/hotline-asr/console\.yaml$", text, re.MULTILINE)
