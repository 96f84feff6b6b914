"""Throwaway Redis processes on loopback, for ``asr-gateway demo``, the benchmarks and the tests.

``LocalRedis``: one redis-server. Free port (or a given one, so a test can kill it and start it
again on the same port), no persistence unless ``extra_args`` ask for it, files and log in
``workdir``; ``stop()`` always ends the process (``kill=True`` simulates a crash).

``LocalSentinelGroup``: a master, one replica and three sentinels (``redis-server --sentinel``,
which is what Debian's ``redis-sentinel`` runs), with a ``redis+sentinel://`` URL and a way to
fail the master over. ``LocalRedisCluster``: three masters with ``--cluster-enabled yes`` joined
by ``redis-cli --cluster create``, with a ``redis+cluster://`` URL.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import redis
from redis.exceptions import RedisError

REDIS_BINARY = "redis-server"
REDIS_CLI_BINARY = "redis-cli"


class LocalRedisError(RuntimeError):
    """redis-server could not be started; the message says why and what to do."""


class RedisNotInstalled(LocalRedisError):
    """No ``redis-server`` on the PATH."""


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` (default loopback) that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
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


def _redis_client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1.0, socket_timeout=2.0,
                       decode_responses=True)  # fmt: skip


def _wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``check`` (RedisError/OSError count as "not yet") until true; LocalRedisError on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except (RedisError, OSError):
            pass
        if time.monotonic() >= deadline:
            raise LocalRedisError(f"timed out after {timeout_s:.0f} s waiting until {what}")
        time.sleep(0.1)


class LocalSentinelGroup:
    """A master, one replica and three sentinels watching them as ``master_name``.

    Sentinels use a quorum of 2 and declare the master down after ``down_after_ms``, so a killed
    master is replaced within a few seconds. ``kill_master()`` or ``failover()`` then wait until
    every sentinel names the new master; ``master`` and ``replica`` always point at the current
    roles. ``restart_old_master()`` brings the killed one back (sentinels make it a replica).
    """

    def __init__(self, workdir: Path, master_name: str = "mymaster", down_after_ms: int = 1000) -> None:
        self.workdir = workdir
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        self.master = LocalRedis(workdir / "redis-a")
        self.replica = LocalRedis(workdir / "redis-b")
        self.sentinels: list[LocalRedis] = []
        self.killed: LocalRedis | None = None

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL for our config (db 0)."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    @property
    def master_url(self) -> str:
        """Plain URL of the current master, for reading back what was written."""
        return self.master.url

    def start(self, timeout_s: float = 30.0) -> None:
        """Start master, replica and sentinels; return once replication is up and every sentinel
        knows the replica and the two other sentinels (so a failover can be authorised)."""
        try:
            self.master.start()
            self.replica.extra_args = ["--replicaof", "127.0.0.1", str(self.master.port)]
            self.replica.start()
            for index in range(3):
                workdir = self.workdir / f"sentinel-{index}"
                workdir.mkdir(parents=True, exist_ok=True)
                config = workdir / "sentinel.conf"  # sentinels rewrite their config: a file of their own
                config.write_text(
                    f"sentinel monitor {self.master_name} 127.0.0.1 {self.master.port} 2\n"
                    f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.master_name} 10000\n"
                    f"sentinel parallel-syncs {self.master_name} 1\n"
                )
                sentinel = LocalRedis(workdir, extra_args=["--sentinel"], config_file=config)
                self.sentinels.append(sentinel)
                sentinel.start()
            _wait_until("the replica is in sync", self._replica_in_sync, timeout_s)
            _wait_until("every sentinel knows the replica and the other sentinels", self._sentinels_ready, timeout_s)
        except BaseException:
            self.stop()
            raise

    def _replica_in_sync(self) -> bool:
        info = _redis_client(self.replica.port).info("replication")
        return info.get("master_link_status") == "up"

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels:
            client = _redis_client(sentinel.port)
            peers = client.sentinel_sentinels(self.master_name)
            if not isinstance(peers, list) or len(peers) < len(self.sentinels) - 1:
                return False
            if not client.sentinel_slaves(self.master_name):
                return False
        return True

    def master_port_by_sentinels(self) -> set[int]:
        """The master port each reachable sentinel reports (one element once they agree)."""
        ports: set[int] = set()
        for sentinel in self.sentinels:
            try:
                host_port = _redis_client(sentinel.port).sentinel_get_master_addr_by_name(self.master_name)
            except (RedisError, OSError):
                continue
            if isinstance(host_port, tuple):
                ports.add(int(host_port[1]))
        return ports

    def _wait_new_master(self, old: LocalRedis, timeout_s: float) -> None:
        new = self.replica
        _wait_until(
            f"all sentinels report the new master on port {new.port}",
            lambda: (
                self.master_port_by_sentinels() == {new.port}
                and _redis_client(new.port).info("replication").get("role") == "master"
            ),
            timeout_s,
        )
        self.master, self.replica = new, old

    def kill_master(self, timeout_s: float = 30.0) -> None:
        """SIGKILL the master and wait until the sentinels have promoted the replica."""
        old = self.master
        old.stop(kill=True)
        self.killed = old
        self._wait_new_master(old, timeout_s)

    def failover(self, timeout_s: float = 30.0) -> None:
        """``SENTINEL FAILOVER`` (no process dies) and wait until the replica is master."""
        old = self.master
        _redis_client(self.sentinels[0].port).sentinel_failover(self.master_name)
        self._wait_new_master(old, timeout_s)

    def restart_old_master(self, timeout_s: float = 30.0) -> None:
        """Start the killed master again; the sentinels turn it into a replica of the new master."""
        if self.killed is None:
            return
        node, self.killed = self.killed, None
        node.extra_args = ["--replicaof", "127.0.0.1", str(self.master.port)]  # faster than waiting for sentinels
        node.start()
        _wait_until(
            "the old master has become a replica",
            lambda: _redis_client(node.port).info("replication").get("master_link_status") == "up",
            timeout_s,
        )

    def stop(self) -> None:
        for node in [*self.sentinels, self.master, self.replica]:
            node.stop()


class LocalRedisCluster:
    """``masters`` redis-servers (no replicas) with ``--cluster-enabled yes``, joined by
    ``redis-cli --cluster create``; ``start()`` returns once every node says cluster_state:ok."""

    def __init__(self, workdir: Path, masters: int = 3, node_timeout_ms: int = 2000) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.workdir = workdir
        self.nodes: list[LocalRedis] = []
        for index in range(masters):
            bus_port = free_tcp_port()  # set explicitly: the default port+10000 may be taken or > 65535
            args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms), "--cluster-port", str(bus_port)]  # fmt: skip
            self.nodes.append(LocalRedis(workdir / f"node-{index}", extra_args=args))

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL listing every node (any one is enough to discover the rest)."""
        return "redis+cluster://" + ",".join(f"{host}:{port}" for host, port in self.addresses)

    def start(self, timeout_s: float = 30.0) -> None:
        cli = shutil.which(REDIS_CLI_BINARY)
        if cli is None:
            raise RedisNotInstalled("redis-cli not found: install the Debian package redis-tools (redis-server "
                                    "depends on it; make setup installs both)")  # fmt: skip
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"{host}:{port}" for host, port in self.addresses]
            done = subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )  # fmt: skip
            (self.workdir / "cluster-create.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                raise LocalRedisError(f"redis-cli --cluster create failed ({done.returncode}); "
                                      f"see {self.workdir}/cluster-create.log")  # fmt: skip
            _wait_until("every cluster node reports cluster_state:ok", self._cluster_ok, timeout_s)
        except BaseException:
            self.stop()
            raise

    def _cluster_ok(self) -> bool:
        for node in self.nodes:
            info = _redis_client(node.port).execute_command("CLUSTER INFO")  # parsed into a dict
            if info.get("cluster_state") != "ok":
                return False
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
