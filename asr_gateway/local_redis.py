"""A throwaway redis-server on loopback, for ``asr-gateway demo``, the benchmarks and the tests.

Free port (or a given one, so a test can kill it and start it again on the same port), no
persistence unless ``extra_args`` ask for it, files and log in ``workdir``; ``stop()`` always
ends the process (``kill=True`` simulates a crash).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis
from redis.exceptions import RedisError

REDIS_BINARY = "redis-server"


class LocalRedisError(RuntimeError):
    """redis-server could not be started; the message says why and what to do."""


class RedisNotInstalled(LocalRedisError):
    """No ``redis-server`` on the PATH."""


def free_tcp_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_reachable(url: str, timeout_s: float = 1.0) -> bool:
    """Whether the Redis at ``url`` (credentials included) answers PING within ``timeout_s``."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (RedisError, OSError, ValueError):
        return False


class LocalRedis:
    """One redis-server process; ``start()`` again after ``stop()`` reuses the port."""

    def __init__(
        self, workdir: Path, port: int | None = None, extra_args: Sequence[str] = (), config_file: Path | None = None
    ) -> None:
        self.workdir = workdir
        self.port = port or free_tcp_port()
        self.extra_args = list(extra_args)
        self.config_file = config_file  # must come first on the command line, e.g. for --sentinel
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it answers PING; raises LocalRedisError."""
        binary = shutil.which(REDIS_BINARY)
        if binary is None:
            raise RedisNotInstalled("redis-server not found: install the Debian package redis-server "
                                    "(make setup does), or pass --redis URL of a running Redis")  # fmt: skip
        self.workdir.mkdir(parents=True, exist_ok=True)
        head = [binary] if self.config_file is None else [binary, str(self.config_file)]
        args = [*head, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--daemonize", "no", "--loglevel", "warning", *self.extra_args]  # fmt: skip
        with (self.workdir / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise LocalRedisError(f"redis-server exited with {code}; see {self.workdir}/redis.log")
            if self.ping():
                return
            time.sleep(0.02)
        self.stop()
        raise LocalRedisError(f"redis-server did not answer PING on port {self.port} within {timeout_s:.0f} s")

    def ping(self) -> bool:
        """Whether the server answers a raw PING (a password-protected one counts: -NOAUTH)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        return reply.startswith((b"+PONG", b"-NOAUTH"))

    def stop(self, kill: bool = False) -> None:
        """Terminate (or with ``kill``, SIGKILL) the server and wait for it; no-op when not running."""
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
