"""The console's command line and transport settings: hash-password, config errors with
file:line, TLS through uvicorn (Secure cookies), and the trusted reverse-proxy header."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from argon2 import PasswordHasher

from tests.certs import self_signed_cert
from tests.console_helpers import running_console, write_configs
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]
REPO = Path(__file__).resolve().parents[1]


def run_console(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console", *args], input=stdin, capture_output=True, text=True,
                          cwd=REPO, timeout=60)  # fmt: skip


def test_hash_password_makes_an_argon2_hash() -> None:
    done = run_console("hash-password", stdin="s3cret pass\n")
    assert done.returncode == 0, done.stderr
    hashed = done.stdout.strip()
    assert hashed.startswith("$argon2id$") and PasswordHasher().verify(hashed, "s3cret pass")
    assert run_console("hash-password", stdin="\n").returncode == 1


def test_bad_console_config_names_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "console.yaml"
    config.write_text("service_config: gw.yaml\nusers_file: users.yaml\nlisten: nowhere\n", encoding="utf-8")
    done = run_console("--config", str(config))
    assert done.returncode == 2
    assert f"{config}:3" in done.stderr and "listen" in done.stderr, done.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls_and_the_trusted_proxy_header(tmp_path: Path, redis_server: RedisServer) -> None:
    console_yaml = write_configs(tmp_path, redis_server.url)
    cert, key = self_signed_cert(tmp_path)
    with console_yaml.open("a", encoding="utf-8") as out:
        out.write(f"tls_certfile: {cert}\ntls_keyfile: {key}\nproxy_header: X-Remote-User\n")
    with (
        running_console(console_yaml) as base,
        httpx.Client(base_url=base, verify=ssl.create_default_context(cafile=str(cert)), timeout=10) as client,
    ):
        assert base.startswith("https://")
        assert client.get("/health").json()["ok"] is True
        cookie = client.get("/login").headers["set-cookie"].lower()
        assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie
        me = client.get("/api/me", headers={"X-Remote-User": "agent1"})
        assert me.status_code == 200 and me.json()["role"] == "agent" and me.json()["agent_id"] == "1001"
        assert client.get("/api/me", headers={"X-Remote-User": "nobody"}).status_code == 401
        # a proxy-authenticated write still needs the CSRF token
        refused = client.post("/api/admin/validate", headers={"X-Remote-User": "admin"}, json={"key": "routes"})
        assert refused.status_code == 403
    # The header is believed only from trusted_proxies.
    text = console_yaml.read_text(encoding="utf-8") + "trusted_proxies: [10.9.9.9/32]\n"
    console_yaml.write_text(text, encoding="utf-8")
    with (
        running_console(console_yaml) as base,
        httpx.Client(base_url=base, verify=ssl.create_default_context(cafile=str(cert)), timeout=10) as client,
    ):
        assert client.get("/api/me", headers={"X-Remote-User": "admin"}).status_code == 401
