"""``asr-gateway cluster up|status|down``: a real cluster on one machine, all on loopback.

The cluster is a box (``asr_gateway.box``) whose nodes each have their own loopback address
(127.0.0.2, 127.0.0.3, ...: Linux routes all of 127/8 to ``lo``) and free ports: the box's
generator writes the nodes' overlays (``nodes/nodeN.env`` over one shared ``config.yaml``),
Kamailio's ``kamailio/kamailio.cfg`` (the cluster's defines, then ``include_file`` of the very
file ``deploy/cluster/kamailio-dispatcher.cfg``) and ``dispatcher.list``, and, with the doors
(``--doors``), HAProxy's ``haproxy/haproxy.cfg`` in front of every node's AudioSocket and
WebSocket door. Kamailio (the Debian ``kamailio`` package, dispatcher module) and HAProxy run
as children on 127.0.0.1; the nodes publish to Redis Sentinel (a master, a replica and three
sentinels) when ``LocalSentinelGroup`` is available, else to one redis-server.

Everything lives in a state directory: ``cluster.json`` (addresses and process ids, rewritten
after each start, so ``status`` and ``down`` work from another shell and after a crash of the
starting one), one config per node, and one log per component (``kamailio.log``,
``node1/serve.log``, ``redis/...``). Each process runs in its own process group, and ``down``
ends the groups it recorded (SIGTERM, then SIGKILL), checking first that each id still belongs
to the program it started.

``LocalCluster`` is what the command, the tests and ``asr-bench cluster`` use.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.exceptions import RedisError

from asr_gateway.box import BoxPlan, NodePlan, parse_overlay, plan_problems, write_box
from asr_gateway.dev.local_redis import LocalRedis, LocalRedisError, redis_reachable
from kb_hooks.events import EventType

REPO = Path(__file__).resolve().parents[2]
DISPATCHER_CFG = REPO / "deploy" / "cluster" / "kamailio-dispatcher.cfg"
STATE_FILE = "cluster.json"
PROXY_HOST = "127.0.0.1"
SENTINEL_MASTER_NAME = "hotline-asr"
NODE_HOST_BASE = 2  # node i (from 0) listens on 127.0.0.{NODE_HOST_BASE + i}
RTP_PORT_MIN = 42000
RTP_PORTS_PER_NODE = 1000
HAPROXY_CHECK_INTER_MS = 500
"""HAProxy's health checks of the nodes' ``/health/ready`` (the development cluster's, shorter than a box's)."""
PROGRAMS = {"kamailio": "kamailio", "haproxy": "haproxy", "node": "asr_gateway.cli", "redis": "redis-"}
"""What each recorded process's command line contains: a reused process id is never signalled."""


class ClusterError(RuntimeError):
    """The cluster could not be started or found; the message says why and what to do."""


@dataclass
class Proc:
    """One process of the cluster as recorded in ``cluster.json``."""

    kind: str
    name: str
    pid: int
    log: str
    host: str = PROXY_HOST
    port: int = 0
    config: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class ClusterOptions:
    nodes: int = 3
    ping_interval_s: int = 5
    """Kamailio's OPTIONS probe interval (``ds_ping_interval``, whole seconds)."""
    algorithm: int = 4
    """``ds_select_dst`` algorithm: 4 round-robin, 9 weight-based."""
    fr_timer_ms: int = 2000
    """How long Kamailio waits for any answer to an INVITE or a probe before failing over."""
    drain_wait_s: float = 60.0
    max_streams: int = 8
    pbx_cidrs: tuple[str, ...] = ("127.0.0.0/8",)
    """The PBX's addresses: the ``pbx`` trunk of the nodes' routes (behind Kamailio, matched on the
    address Kamailio states in ``X-Source-Addr``); calls from anywhere else get 403."""
    sentinel: bool = True
    """Redis Sentinel when ``LocalSentinelGroup`` exists, else one redis-server."""
    doors: bool = False
    """Also the AudioSocket and WebSocket doors on every node, behind HAProxy on 127.0.0.1."""
    traced: bool = True
    """The engine's TorchScript steps (the service's default); False: a node starts in seconds
    rather than after tracing every chunk shape (about 18 s on a loaded 2-core machine)."""


def missing_programs(sentinel: bool = True, doors: bool = False) -> list[str]:
    """The external programs a cluster needs and this machine lacks (Debian package names)."""
    wanted = {"kamailio": "kamailio", "redis-server": "redis-server"}
    if doors:
        wanted["haproxy"] = "haproxy"
    if sentinel:
        wanted["redis-sentinel"] = "redis-sentinel"
    return [package for binary, package in wanted.items() if shutil.which(binary) is None]


def sip_options(host: str, port: int, timeout_s: float = 1.0, source_host: str = "127.0.0.1") -> int | None:
    """Send one SIP OPTIONS over UDP to ``host:port``; the status code of the answer, None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((source_host, 0))
        sock.settimeout(timeout_s)
        local = sock.getsockname()[1]
        tag = secrets.token_hex(4)
        request = (
            f"OPTIONS sip:{host}:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {source_host}:{local};branch=z9hG4bK{tag}\r\n"
            "Max-Forwards: 70\r\n"
            f"From: <sip:cluster@{source_host}>;tag={tag}\r\n"
            f"To: <sip:{host}:{port}>\r\n"
            f"Call-ID: cluster-{tag}@{source_host}\r\n"
            "CSeq: 1 OPTIONS\r\n"
            "Content-Length: 0\r\n\r\n"
        )
        sock.sendto(request.encode(), (host, port))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65535)
            except OSError:
                return None
            status = data.split(b" ", 2)[1] if data.startswith(b"SIP/2.0 ") else b""
            if status.isdigit() and int(status) >= 200:
                return int(status)
        return None


def free_udp_port(host: str) -> int:
    """A UDP port on ``host`` that was free a moment ago (also free for TCP, which the nodes may open)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind((host, 0))
            port = int(udp.getsockname()[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            try:
                tcp.bind((host, port))
            except OSError:
                continue
        return port
    raise ClusterError(f"no free port on {host}")


def node_host(index: int) -> str:
    return f"127.0.0.{NODE_HOST_BASE + index}"


class LocalCluster:
    """Kamailio + N nodes + Redis on loopback, recorded in ``state_dir/cluster.json``."""

    def __init__(self, state_dir: Path, options: ClusterOptions | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self.options = options or ClusterOptions()
        self.procs: list[Proc] = []
        self.redis_url = ""
        self.proxy_port = 0
        self.plan: BoxPlan | None = None
        self.sentinel_group: Any = None
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # ---- state ----------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def save(self) -> None:
        state = {
            "options": {**asdict(self.options), "pbx_cidrs": list(self.options.pbx_cidrs)},
            "proxy": {"host": PROXY_HOST, "port": self.proxy_port},
            "redis_url": self.redis_url,
            "procs": [asdict(proc) for proc in self.procs],
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2), encoding="utf-8")
        tmp.replace(self.state_file)

    @classmethod
    def load(cls, state_dir: Path) -> LocalCluster:
        """The cluster recorded in ``state_dir`` (raises ClusterError when there is none)."""
        path = state_dir / STATE_FILE
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            message = f"no cluster recorded in {state_dir} (no {STATE_FILE}); start one with `cluster up`"
            raise ClusterError(message) from None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"{path}: unreadable ({exc}); end the processes by hand") from None
        options = ClusterOptions(**{**state["options"], "pbx_cidrs": tuple(state["options"]["pbx_cidrs"])})
        cluster = cls(state_dir, options)
        cluster.proxy_port = int(state["proxy"]["port"])
        cluster.redis_url = state["redis_url"]
        cluster.procs = [Proc(**proc) for proc in state["procs"]]
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            cluster.plan = BoxPlan.from_json((state_dir / "box.json").read_text(encoding="utf-8"))
        return cluster

    @property
    def nodes(self) -> list[Proc]:
        return [proc for proc in self.procs if proc.kind == "node"]

    @property
    def audiosocket_port(self) -> int:
        """HAProxy's AudioSocket port on 127.0.0.1 (with ``doors``)."""
        return self._box().audiosocket_port

    @property
    def websocket_port(self) -> int:
        """HAProxy's WebSocket port on 127.0.0.1 (with ``doors``)."""
        return self._box().websocket_port

    def _box(self) -> BoxPlan:
        if self.plan is None or not self.plan.doors:
            raise ClusterError("this cluster has no doors (start it with `cluster up --doors`)")
        return self.plan

    def node_plan(self, name: str) -> NodePlan:
        if self.plan is None:
            raise ClusterError(f"no box.json in {self.state_dir}")
        for node in self.plan.nodes:
            if node.name == name:
                return node
        raise ClusterError(f"no node {name!r} in {self.state_dir / 'box.json'}")

    def node(self, name: str) -> Proc:
        for proc in self.nodes:
            if proc.name == name:
                return proc
        raise ClusterError(f"no node {name!r} (nodes: {', '.join(p.name for p in self.nodes)})")

    # ---- up -------------------------------------------------------------------------

    def up(self, timeout_s: float = 120.0) -> None:
        """Start Redis, the nodes and Kamailio, each waited for; on any failure everything is stopped again."""
        missing = missing_programs(self.options.sentinel and _sentinel_group_class() is not None, self.options.doors)
        if missing:
            raise ClusterError(f"missing Debian packages: {', '.join(missing)} (make setup installs them)")
        if self.state_file.exists():
            previous = LocalCluster.load(self.state_dir)
            if previous.alive():
                raise ClusterError(f"a cluster is already running from {self.state_dir}; `cluster down` first")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.procs = []
        try:
            self._start_redis()
            self.save()
            self.plan = self._plan()
            self.proxy_port = self.plan.sip_port
            write_box(self.plan, self.state_dir, ds_list=str(self.state_dir / "kamailio" / "dispatcher.list"))
            self._write_base_config()
            for node in self.plan.nodes:
                self._start_node(node)
                self.save()
            deadline = time.monotonic() + timeout_s
            for proc in self.nodes:
                self._wait_sip(proc, deadline)
            self._start_kamailio()
            self.save()
            self._wait_sip(self.procs[-1], deadline)
            if self.options.doors:
                self._start_haproxy()
                self.save()
                self._wait_haproxy(deadline)
        except BaseException:
            self.down()
            raise

    def _start_redis(self) -> None:
        group_class = _sentinel_group_class() if self.options.sentinel else None
        workdir = self.state_dir / "redis"
        if group_class is not None:
            group = group_class(workdir, master_name=SENTINEL_MASTER_NAME)
            group.start()
            self.sentinel_group = group
            self.redis_url = group.url
            servers = [("redis1", group.master), ("redis2", group.replica)]  # roles change on failover
            servers += [(f"sentinel{i + 1}", sentinel) for i, sentinel in enumerate(group.sentinels)]
            for name, server in servers:
                assert server.process is not None
                log = str(server.workdir / "redis.log")
                self.procs.append(Proc("redis", name, server.process.pid, log, port=server.port))
            return
        server = LocalRedis(workdir)
        try:
            server.start()
        except LocalRedisError as exc:
            raise ClusterError(str(exc)) from None
        assert server.process is not None
        self.redis_url = server.url
        self.procs.append(Proc("redis", "redis", server.process.pid, str(workdir / "redis.log"), port=server.port))

    def _plan(self) -> BoxPlan:
        """The cluster as a box: each node on its own loopback address, every port a free one
        (drawn again in the rare case two draws, or a draw and an RTP range, collide)."""
        for _ in range(20):
            plan = self._draw_plan()
            if not plan_problems(plan):
                return plan
        raise ClusterError(f"no collision-free ports found: {'; '.join(plan_problems(plan))}")

    def _draw_plan(self) -> BoxPlan:
        options = self.options
        nodes = []
        for index in range(options.nodes):
            host = node_host(index)
            rtp_min = RTP_PORT_MIN + index * RTP_PORTS_PER_NODE
            nodes.append(
                NodePlan(
                    index=index + 1,
                    host=host,
                    sip_port=free_udp_port(host),
                    rtp_port_min=rtp_min,
                    rtp_port_max=rtp_min + RTP_PORTS_PER_NODE - 1,
                    audiosocket_port=free_udp_port(host),
                    websocket_port=free_udp_port(host),
                    metrics_host=host,
                    metrics_port=free_udp_port(host),
                    cpus=(),
                    state_dir=str(self.state_dir / f"node{index + 1}"),
                )
            )
        return BoxPlan(
            nodes=tuple(nodes),
            address=PROXY_HOST,
            sip_port=free_udp_port(PROXY_HOST),
            audiosocket_port=free_udp_port(PROXY_HOST),
            websocket_port=free_udp_port(PROXY_HOST),
            doors=options.doors,
            ping_interval_s=options.ping_interval_s,
            fr_timer_ms=options.fr_timer_ms,
            ds_alg=options.algorithm,
            kamailio_children=2,
            check_inter_ms=HAPROXY_CHECK_INTER_MS,
            kamailio_include=str(DISPATCHER_CFG),
            config=str(self.state_dir / "config.yaml"),
            etc_dir=str(self.state_dir / "nodes"),
            prefix=str(REPO),
        )

    def _write_base_config(self) -> Path:
        """The one config every node reads; each node's own ports and directories are its overlay."""
        options = self.options
        routes = self.state_dir / "routes.yaml"
        routes.write_text(
            "# The cluster's calls: the PBX's addresses are a trunk; behind Kamailio they are matched on the\n"
            "# address Kamailio states (X-Source-Addr, sip.trusted_proxies). Calls from elsewhere get 403.\n"
            + json.dumps(
                {
                    "profiles": {"default": {"chunk_ms": 320, "left_chunks": 4}},
                    "trunks": {"pbx": list(options.pbx_cidrs)},
                    "routes": [{"name": "pbx", "match": {"trunk": "pbx"}, "profile": "default"}],
                    "default_profile": None,
                    "reject_code": 403,
                },
                indent=2,
            ),
            encoding="utf-8",
        )
        config = {
            "sip": {
                "transports": ["udp"],
                "trusted_proxies": [f"{PROXY_HOST}/32"],
                "drain_wait_s": options.drain_wait_s,
                "drain_linger_s": options.ping_interval_s + options.fr_timer_ms / 1000,
                "rtp_inactivity_timeout_s": 10,
            },
            "engine": {
                "max_streams": options.max_streams,
                "max_batch": options.max_streams,
                "finalizer": "thread",
                "threads": 1,
                "traced_step": options.traced,
                "traced_rescoring": options.traced,
            },
            "redis": {"url": self.redis_url},
            "logging": {"level": "info", "format": "json"},
            "routes": str(routes),
        }
        path = self.state_dir / "config.yaml"
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
        return path

    def _start_node(self, node: NodePlan) -> Proc:
        directory = Path(node.state_dir)
        directory.mkdir(parents=True, exist_ok=True)
        overlay_path = self.state_dir / "nodes" / f"{node.name}.env"
        journal = directory / "journal-audit.log"
        overlay = parse_overlay(overlay_path.read_text(encoding="utf-8"))
        config = self.state_dir / "config.yaml"
        log_path = directory / "serve.log"
        env = {
            **os.environ,
            **overlay,
            "ASR_REDIS_JOURNAL_AUDIT_FILE": str(journal),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        command = [sys.executable, "-m", "asr_gateway.cli", "serve", "--config", str(config)]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=directory, start_new_session=True
            )
        self._children[process.pid] = process
        extra = {"overlay": str(overlay_path), "journal_audit_file": str(journal)}
        proc = Proc(
            "node", node.name, process.pid, str(log_path), host=node.host, port=node.sip_port, config=str(config),
            extra=extra,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def _start_kamailio(self) -> None:
        binary = shutil.which("kamailio")
        if binary is None:
            raise ClusterError("kamailio not found: install the Debian package kamailio (make setup does)")
        directory = self.state_dir / "kamailio"
        log_path = self.state_dir / "kamailio.log"
        command = [
            binary, "-f", str(directory / "kamailio.cfg"), "-DD", "-E", "-Y", str(directory),
            "-P", str(directory / "kamailio.pid"),
        ]  # fmt: skip
        with log_path.open("ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._children[process.pid] = process
        self.procs.append(
            Proc("kamailio", "kamailio", process.pid, str(log_path), host=PROXY_HOST, port=self.proxy_port)
        )

    def _start_haproxy(self) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            raise ClusterError("haproxy not found: install the Debian package haproxy (make setup does)")
        log_path = self.state_dir / "haproxy.log"
        command = [binary, "-f", str(self.state_dir / "haproxy" / "haproxy.cfg"), "-db"]
        with log_path.open("ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._children[process.pid] = process
        plan = self._box()
        extra = {"websocket_port": str(plan.websocket_port)}
        self.procs.append(
            Proc("haproxy", "haproxy", process.pid, str(log_path), PROXY_HOST, plan.audiosocket_port, extra=extra)
        )

    def _wait_haproxy(self, deadline: float) -> None:
        """Until HAProxy accepts on both doors' ports."""
        proc = next(p for p in self.procs if p.kind == "haproxy")
        plan = self._box()
        while time.monotonic() < deadline:
            if not self.alive_proc(proc):
                raise ClusterError(f"haproxy exited while starting; see {proc.log}:\n{_tail(Path(proc.log))}")
            if all(_tcp_accepts(PROXY_HOST, port) for port in (plan.audiosocket_port, plan.websocket_port)):
                return
            time.sleep(0.1)
        raise ClusterError(f"haproxy did not listen in time; see {proc.log}")

    def _wait_sip(self, proc: Proc, deadline: float) -> None:
        """Until ``proc`` answers OPTIONS 200; ClusterError when it exits or the deadline passes."""
        while time.monotonic() < deadline:
            if not self.alive_proc(proc):
                raise ClusterError(f"{proc.name} exited while starting; see {proc.log}:\n{_tail(Path(proc.log))}")
            if sip_options(proc.host, proc.port, timeout_s=0.5) == 200:
                return
            time.sleep(0.2)
        raise ClusterError(f"{proc.name} did not answer SIP OPTIONS in time; see {proc.log}")

    # ---- operations -------------------------------------------------------------------

    def drain_node(self, name: str) -> None:
        """SIGTERM a node: it answers 503 from now on, lets its calls end, then exits."""
        os.kill(self.node(name).pid, signal.SIGTERM)

    def kill_node(self, name: str) -> None:
        """SIGKILL a node (and its process group), as a crash would."""
        _signal(self.node(name), signal.SIGKILL)

    def restart_node(self, name: str, timeout_s: float = 120.0) -> Proc:
        """Start a node again on its address and port (its spool replays what it journaled)."""
        old = self.node(name)
        if self.alive_proc(old):
            raise ClusterError(f"{name} is still running (pid {old.pid})")
        self.procs.remove(old)
        proc = self._start_node(self.node_plan(name))
        self.save()
        self._wait_sip(proc, time.monotonic() + timeout_s)
        return proc

    # ---- status and down ------------------------------------------------------------

    def alive_proc(self, proc: Proc) -> bool:
        """Whether ``proc`` runs: the child's own state when this object started it, else ``/proc``."""
        child = self._children.get(proc.pid)
        if child is not None:
            return child.poll() is None
        return _alive(proc)

    def alive(self) -> bool:
        return any(self.alive_proc(proc) for proc in self.procs)

    def status(self) -> dict[str, Any]:
        """What runs: every process alive or not, what each SIP element answers to OPTIONS, Redis reachable."""
        procs = []
        for proc in self.procs:
            entry: dict[str, Any] = {
                "name": proc.name,
                "kind": proc.kind,
                "pid": proc.pid,
                "alive": self.alive_proc(proc),
            }
            entry["log"] = proc.log
            if proc.kind in ("node", "kamailio"):
                entry["sip"] = f"{proc.host}:{proc.port}"
                entry["options"] = sip_options(proc.host, proc.port, timeout_s=0.5) if entry["alive"] else None
            if proc.kind == "haproxy":
                entry["audiosocket"] = f"{proc.host}:{proc.port}"
                entry["websocket"] = f"{proc.host}:{proc.extra.get('websocket_port', '')}"
            procs.append(entry)
        return {
            "state_dir": str(self.state_dir),
            "proxy": f"sip:{PROXY_HOST}:{self.proxy_port}",
            "redis_url": self.redis_url,
            "redis_master": self.redis_master(),
            "processes": procs,
        }

    def redis_master(self) -> str | None:
        """``host:port`` of the Redis master (as the sentinels name it), None when none answers."""
        if self.redis_url.startswith("redis://"):
            address = self.redis_url.removeprefix("redis://").partition("/")[0]
            return address if redis_reachable(self.redis_url) else None
        for proc in self.procs:
            if proc.name.startswith("sentinel") and self.alive_proc(proc):
                client = redis.Redis(host="127.0.0.1", port=proc.port, socket_timeout=1.0, decode_responses=True)
                try:
                    reply = client.sentinel_get_master_addr_by_name(SENTINEL_MASTER_NAME)
                except (RedisError, OSError):
                    continue
                finally:
                    client.close()
                if isinstance(reply, tuple):
                    master = f"{reply[0]!s}:{reply[1]!s}"
                    return master if redis_reachable(f"redis://{master}/0") else None
        return None

    def down(self, timeout_s: float = 20.0) -> list[str]:
        """End every recorded process group (Kamailio first, then the nodes, Redis last); the names ended."""
        order = {"kamailio": 0, "haproxy": 0, "node": 1, "redis": 2}
        ended = []
        for kind in sorted(order, key=order.__getitem__):
            group = [proc for proc in self.procs if proc.kind == kind and self.alive_proc(proc)]
            for proc in group:
                _signal(proc, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while any(self.alive_proc(proc) for proc in group) and time.monotonic() < deadline:
                time.sleep(0.1)
            for proc in group:
                if self.alive_proc(proc):
                    _signal(proc, signal.SIGKILL)
                ended.append(proc.name)
        if self.sentinel_group is not None:
            self.sentinel_group.stop()
        return ended


@dataclass(frozen=True)
class Selection:
    """One line of Kamailio's log: at ``time`` (epoch s) the INVITE of ``sip_call_id`` went to ``node``."""

    time: float
    sip_call_id: str
    node: str
    failover: bool


def selections(cluster: LocalCluster) -> list[Selection]:
    """Every node choice Kamailio logged (first choices and failovers), in order; ``node`` is a node name."""
    by_address = {f"sip:{p.host}:{p.port};transport=udp": p.name for p in cluster.nodes}
    found = []
    for line in Path(cluster.state_dir / "kamailio.log").read_text(errors="replace").splitlines():
        match = _SELECTION.search(line)
        if match:
            when, call_id, kind, uri = match.groups()
            found.append(Selection(float(when), call_id, by_address.get(uri, uri), kind == "fails over to"))
    return found


_SELECTION = re.compile(r"at (\d+\.\d+) (?:new call|call) (\S+) (to|fails over to) (\S+)$")


def balancer_states(cluster: LocalCluster) -> dict[tuple[str, str], str]:
    """HAProxy's last word on each ``(door, node)``: ``"UP"`` or ``"DOWN"``, from its log (servers
    start up, so a pair it never mentioned is absent)."""
    states = {}
    for line in Path(cluster.state_dir / "haproxy.log").read_text(errors="replace").splitlines():
        match = _SERVER_STATE.search(line)
        if match:
            door, node, state = match.groups()
            states[(door, node)] = state
    return states


_SERVER_STATE = re.compile(r"Server (\w+)_nodes/(\w+) is (UP|DOWN)\b")


def journaled(node: Proc) -> list[tuple[str, str, str]]:
    """``(event_id, call_id, event_type)`` of every durable event ``node`` journaled (its audit file)."""
    path = Path(node.extra.get("journal_audit_file", ""))
    if not path.is_file():
        return []
    rows = [line.split() for line in path.read_text(encoding="utf-8").splitlines()]
    return [(row[0], row[1], row[2]) for row in rows if len(row) >= 3]


def firehose(redis_url: str, key_prefix: str = "asr") -> list[dict[str, Any]]:
    """Every event on ``{key_prefix}:events`` of the plain ``redis://`` URL (the current master)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5.0, decode_responses=True)
    try:
        entries: list[tuple[str, dict[str, str]]] = client.xrange(f"{key_prefix}:events")  # type: ignore[assignment]
        return [json.loads(fields["event"]) for _, fields in entries]
    finally:
        client.close()


def finals_report(cluster: LocalCluster, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Finals each node journaled vs found on the firehose: counts, missing ids, duplicates by event_id."""
    expected = {
        event_id
        for node in cluster.nodes
        for event_id, _, kind in journaled(node)
        if kind == EventType.TRANSCRIPT_FINAL
    }
    counts = Counter(e["event_id"] for e in events if e["event_type"] == EventType.TRANSCRIPT_FINAL)
    return {
        "finals_expected": len(expected),
        "finals_found": len(expected & set(counts)),
        "finals_missing": sorted(expected - set(counts)),
        "finals_duplicated": sorted(event_id for event_id, n in counts.items() if n > 1),
        "finals_unexpected": len(set(counts) - expected),
    }


def _sentinel_group_class() -> Any:
    """``LocalSentinelGroup`` where this version has it, else None."""
    from asr_gateway.dev import local_redis

    return getattr(local_redis, "LocalSentinelGroup", None)


def _alive(proc: Proc) -> bool:
    """Whether ``proc.pid`` is still the program the cluster started (not a reused id, not a zombie)."""
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] == "Z":
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(proc.pid, os.WNOHANG)
        return False
    return PROGRAMS[proc.kind].encode() in cmdline


def _tcp_accepts(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _signal(proc: Proc, signum: int) -> None:
    """Signal ``proc``'s process group (nodes and Kamailio lead their own), or Redis's process alone."""
    with contextlib.suppress(ProcessLookupError):
        if proc.kind == "redis":
            os.kill(proc.pid, signum)
        else:
            os.killpg(proc.pid, signum)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---- command line ---------------------------------------------------------------------

DEFAULT_STATE_DIR = Path("asr-cluster")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="asr-gateway cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "status", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="default: ./asr-cluster")
    parser.add_argument("--nodes", type=int, default=3, help="up: how many asr-gateway nodes (default 3)")
    parser.add_argument("--ping-interval", type=int, default=5, help="up: Kamailio's OPTIONS interval, s")
    parser.add_argument("--max-streams", type=int, default=8, help="up: engine slots per node")
    parser.add_argument("--pbx", action="append", help="up: the PBX's CIDRs (repeatable; default 127.0.0.0/8)")
    parser.add_argument("--doors", action="store_true", help="up: AudioSocket and WebSocket doors behind HAProxy")
    parser.add_argument("--no-trace", action="store_true", help="up: no TorchScript tracing (nodes start in seconds)")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            if not 1 <= args.nodes <= 200:
                parser.error("--nodes must be between 1 and 200")
            options = ClusterOptions(
                nodes=args.nodes,
                ping_interval_s=args.ping_interval,
                max_streams=args.max_streams,
                pbx_cidrs=tuple(args.pbx or ClusterOptions.pbx_cidrs),
                doors=args.doors,
                traced=not args.no_trace,
            )
            cluster = LocalCluster(args.state_dir, options)
            cluster.up()
            print(json.dumps(cluster.status(), indent=2))
            proxy = f"sip:{PROXY_HOST}:{cluster.proxy_port}"
            print(f"calls to {proxy}; `asr-gateway cluster down` ends it", file=sys.stderr)
            return 0
        cluster = LocalCluster.load(args.state_dir)
        if args.action == "status":
            status = cluster.status()
            print(json.dumps(status, indent=2))
            return 0 if all(p["alive"] for p in status["processes"]) else 3
        print(json.dumps({"ended": cluster.down()}))
        return 0
    except ClusterError as exc:
        print(f"asr-gateway cluster {args.action}: {exc}", file=sys.stderr)
        return 1
