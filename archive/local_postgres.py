"""A throwaway PostgreSQL server on loopback, for the tests, the benchmark and the demo.

Debian's server binaries (``/usr/lib/postgresql/<major>/bin``: ``initdb``, ``pg_ctl``) on a free
port, its files in a new directory, trust authentication on 127.0.0.1 only. PostgreSQL refuses to
run as root, so as root (CI) the server runs as the ``postgres`` OS user (``runuser``) in a
directory that user owns; ``stop()`` ends it by the postmaster's PID.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PostgresNotInstalled(RuntimeError):
    """No PostgreSQL server binaries; apt-get install postgresql."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise PostgresNotInstalled("no PostgreSQL server (initdb): apt-get install postgresql")
    return Path(initdb).parent


class LocalPostgres:
    """``start()`` initdb + pg_ctl start; ``url`` for the ``archive`` database; ``stop()``."""

    def __init__(self, os_user: str = "postgres") -> None:
        self.port = _free_port()
        self.bin = server_bin_dir()
        self._as_root = os.geteuid() == 0
        self._os_user = os_user
        self.dir = Path(tempfile.mkdtemp(prefix="archive-pg-"))
        self.data = self.dir / "data"
        self.pid: int | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/archive"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", self._os_user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self, timeout_s: float = 60.0) -> None:
        if self._as_root:
            shutil.chown(self.dir, self._os_user)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "log"),
            "-w",
            "-t",
            str(int(timeout_s)),
            "start",
        )
        self.pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "archive")

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGINT)  # fast shutdown
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    os.kill(self.pid, 0)
                    time.sleep(0.05)
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.pid = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
