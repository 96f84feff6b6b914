"""The console's first start as an operator meets it: the example files of deploy/config start
as copied (check-config says ok, the console serves /health, ASR_REDIS_URL applies), and every
start-up problem is one line naming the file or URL and what to do, exit status 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from asr_gateway.dev.local_redis import free_tcp_port
from console.cli import main
from tests.console_helpers import write_configs
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "deploy" / "config"


def install_examples(etc: Path) -> Path:
    """deploy/config copied as deploy/README.md and the images do; the console's config path."""
    shutil.copytree(EXAMPLES, etc)
    for example, installed in (("example.yaml", "config.yaml"), ("console.example.yaml", "console.yaml"),
                               ("users.example.yaml", "users.yaml")):  # fmt: skip
        shutil.copy(etc / example, etc / installed)
    return etc / "console.yaml"


def console_env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    return {**os.environ, "ASR_REDIS_URL": redis_url, "STATE_DIRECTORY": str(tmp_path / "state"),
            "PYTHONPATH": str(REPO)}  # fmt: skip


def test_the_examples_start_as_copied(tmp_path: Path, redis_server: RedisServer) -> None:
    console_yaml = install_examples(tmp_path / "etc")
    env = console_env(tmp_path, redis_server.url)
    check = subprocess.run([sys.executable, "-m", "console", "check-config", str(console_yaml)], env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (check.returncode, check.stdout, check.stderr) == (0, "ok\n", "")
    port = free_tcp_port()
    command = [sys.executable, "-m", "console", "--config", str(console_yaml), "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        health = None
        while health is None and time.monotonic() < deadline and process.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
            except httpx.TransportError:
                time.sleep(0.2)
        assert health == {"ok": True, "redis": True}, process.communicate()[1] if process.poll() is not None else ""
    finally:
        process.terminate()
        process.wait(20)
    # the example users have no password yet; the state went to the unit's state directory
    assert "password_hash:" not in (tmp_path / "etc" / "users.yaml").read_text(encoding="utf-8").split("users:")[1]
    assert (tmp_path / "state" / "console" / "session.key").is_file()


def start_problem(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line the console prints when it cannot start with ``argv`` (exit status 2)."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_missing_or_unreadable_console_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "console.yaml"
    line = start_problem(capsys, "--config", str(missing))
    assert line.startswith(f"{missing}: file not found") and "deploy/config/console.example.yaml" in line
    line = start_problem(capsys, "--config", str(tmp_path))  # a directory: unreadable as a file
    assert line.startswith(f"{tmp_path}: cannot read"), line


def test_the_gateway_config_given_to_the_console(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gateway = install_examples(tmp_path / "etc").parent / "config.yaml"
    line = start_problem(capsys, "--config", str(gateway))
    assert line.startswith(f"{gateway}: this is a gateway (service) config"), line
    assert "the console wants its own file" in line and "deploy/config/console.example.yaml" in line


def test_missing_service_config_and_users_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    console_yaml = write_configs(tmp_path, "redis://127.0.0.1:1/0")
    conf = console_yaml.parent
    (conf / "gateway.yaml").unlink()
    line = start_problem(capsys, "--config", str(console_yaml))
    assert line.startswith(f"{conf / 'gateway.yaml'}: file not found; set service_config in {console_yaml}"), line
    write_configs(tmp_path, "redis://127.0.0.1:1/0")
    (conf / "users.yaml").unlink()
    line = start_problem(capsys, "--config", str(console_yaml))
    assert line.startswith(f"{conf / 'users.yaml'}: file not found") and "users.example.yaml" in line, line


def test_tls_files_that_do_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The TLS lines of an old docs snippet, active with no such files: each file named."""
    console_yaml = write_configs(tmp_path, "redis://127.0.0.1:1/0")
    with console_yaml.open("a", encoding="utf-8") as out:
        out.write("tls_certfile: console.crt\n")
    line = start_problem(capsys, "--config", str(console_yaml))
    assert line == f"{console_yaml}: tls_certfile and tls_keyfile go together; set both, or neither for plain HTTP"
    with console_yaml.open("a", encoding="utf-8") as out:
        out.write("tls_keyfile: console.key\n")
    assert main(["--config", str(console_yaml)]) == 2
    lines = capsys.readouterr().err.splitlines()
    conf = console_yaml.parent
    assert [line.split(":")[0] for line in lines] == [str(conf / "console.crt"), str(conf / "console.key")]
    assert all("TLS file not found or not readable" in line and str(console_yaml) in line for line in lines)


def test_redis_that_does_not_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://:secret@127.0.0.1:{free_tcp_port()}/0"
    console_yaml = write_configs(tmp_path, url)
    line = start_problem(capsys, "--config", str(console_yaml))
    shown = url.replace(":secret@", ":***@")
    assert line.startswith(f"{shown}: Redis does not answer") and "secret" not in line, line
    assert f"fix redis.url in {console_yaml.parent / 'gateway.yaml'} (ASR_REDIS_URL overrides it)" in line


def test_a_bad_key_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    console_yaml = write_configs(tmp_path, "redis://127.0.0.1:1/0")
    with console_yaml.open("a", encoding="utf-8") as out:
        out.write("agent_key: X-Agent\n")
    line = start_problem(capsys, "--config", str(console_yaml))
    assert line == f"{console_yaml}:5 agent_key: unknown key"
    assert main(["check-config", str(console_yaml)]) == 1
    assert capsys.readouterr().err.strip() == line


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqlite:///nonexistent-dir/sub/archive.db", "unable to open database file"),
        (f"postgresql://archive@127.0.0.1:{free_tcp_port()}/archive", "cannot connect to the archive database"),
    ],
)
def test_an_archive_db_that_does_not_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, says: str
) -> None:
    """An ``archive_db`` that does not open is one line naming the console file, what is wrong
    and what to do, not a traceback at the first search (a URL of the wrong form is refused
    with its file:line by the settings' own check)."""
    console_yaml = write_configs(tmp_path, "redis://127.0.0.1:1/0")
    with console_yaml.open("a", encoding="utf-8") as out:
        out.write(f"archive_db: {url}\n")
    line = start_problem(capsys, "--config", str(console_yaml))
    assert line.startswith(f"{console_yaml}: archive_db: ") and says in line, line
    assert line.endswith("or comment it out to run without the archive"), line
