"""The box: N hotline-asr nodes on one machine, each pinned to its own cores, behind Kamailio's
dispatcher (SIP) and HAProxy (the AudioSocket and WebSocket doors).

One node is one Python process whose event loop and events thread are single threads, so a
machine with many cores runs several nodes (deploy/README.md, "Nodes per box"). This module
turns a node count and cores per node into a ``BoxPlan`` (every node's ports, RTP range, CPU
set, state directory), writes the whole box's files from it and checks them:

- ``nodes/nodeN.env``: the node's overlay, ``ASR_*`` variables over the one shared config file
  (``asr_gateway.config`` reads them), loaded by the template unit's ``EnvironmentFile=``;
- ``systemd/hotline-asr@.service`` (instance = node number) and, per node,
  ``systemd/hotline-asr@N.service.d/box.conf`` with its ``CPUAffinity=``;
- ``kamailio/kamailio.cfg`` (the box's defines, then ``include_file`` of
  ``deploy/cluster/kamailio-dispatcher.cfg``) and ``kamailio/dispatcher.list``;
- ``haproxy/haproxy.cfg``: ``balance leastconn``, health from each node's ``/health/ready``;
  AudioSocket in TCP mode, the WebSocket door in HTTP mode up to its upgrade (a handshake
  answered 503 is retried on another node);
- ``box.json``: the plan itself, from which ``check_box`` renders every file again.

``asr-gateway box write|check`` is the command; ``asr_gateway.dev.cluster`` writes the
development cluster's overlays, Kamailio and HAProxy files with the same functions.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asr_common.yamlconf import ConfigError
from asr_gateway.config import load_config

MANIFEST = "box.json"
UNIT_NAME = "hotline-asr@.service"
KAMAILIO_INCLUDE = "hotline-asr-dispatcher.cfg"
DISPATCHER_SOURCE = Path(__file__).resolve().parents[1] / "deploy" / "cluster" / "kamailio-dispatcher.cfg"
"""The dispatcher configuration ``box write`` copies beside the box's ``kamailio.cfg``."""
MAX_NODES = 256
DOOR_CONNECTIONS_PER_NODE = 4096
"""A node's door connections from HAProxy (each door), and HAProxy's ``maxconn`` per node."""
RTP_PORT_CEILING = 60000
"""RTP ranges end below this (ports above are the kernel's ephemeral range on Debian: 32768-60999
overlaps the default 20000-39999 too, and a node's RTP socket simply skips a port in use)."""


class BoxError(ValueError):
    """A box that cannot be planned or written; the message says what to change."""


@dataclass(frozen=True)
class NodePlan:
    """One node's share of the box. ``index`` is the systemd instance (1, 2, ...)."""

    index: int
    host: str
    """Where its SIP, RTP and door sockets listen (Kamailio and HAProxy reach it there)."""
    sip_port: int
    rtp_port_min: int
    rtp_port_max: int
    audiosocket_port: int
    websocket_port: int
    metrics_host: str
    metrics_port: int
    """``/metrics`` and ``/health/ready``, which HAProxy checks."""
    cpus: tuple[int, ...]
    """Cores it is pinned to (``CPUAffinity=``); empty: not pinned."""
    state_dir: str

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def spool_dir(self) -> str:
        return f"{self.state_dir}/spool"

    @property
    def node_id(self) -> str:
        """Its name in the heartbeat (``{prefix}:nodes``, the console): the host name and SIP port."""
        return f"<hostname>:{self.sip_port}"

    def overlay(self, doors: bool, proxy: str) -> dict[str, str]:
        """``ASR_*`` settings over the shared config; the doors only when the box balances them.
        ``proxy``: the address Kamailio sends from, whose ``X-Source-Addr`` the node believes."""
        env = {
            "ASR_SIP_HOST": self.host,
            "ASR_SIP_PORT": str(self.sip_port),
            "ASR_RTP_HOST": self.host,
            "ASR_RTP_PORT_MIN": str(self.rtp_port_min),
            "ASR_RTP_PORT_MAX": str(self.rtp_port_max),
            "ASR_METRICS_HOST": self.metrics_host,
            "ASR_METRICS_PORT": str(self.metrics_port),
            "ASR_REDIS_SPOOL_DIR": self.spool_dir,
        }
        if proxy != "0.0.0.0":
            env["ASR_SIP_TRUSTED_PROXIES"] = f"[{proxy}/32]"
        if doors:
            env |= {
                "ASR_AUDIOSOCKET_ENABLED": "true",
                "ASR_AUDIOSOCKET_HOST": self.host,
                "ASR_AUDIOSOCKET_PORT": str(self.audiosocket_port),
                "ASR_WEBSOCKET_ENABLED": "true",
                "ASR_WEBSOCKET_HOST": self.host,
                "ASR_WEBSOCKET_PORT": str(self.websocket_port),
                # Every connection comes from HAProxy: the per-source cap would count the whole
                # box's calls as one caller's (HAProxy's maxconn bounds them instead).
                "ASR_AUDIOSOCKET_MAX_CONNECTIONS_PER_SOURCE": str(DOOR_CONNECTIONS_PER_NODE),
                "ASR_WEBSOCKET_MAX_CONNECTIONS_PER_SOURCE": str(DOOR_CONNECTIONS_PER_NODE),
            }
        return env


@dataclass(frozen=True)
class BoxPlan:
    """The whole box: where the balancers listen, their timing, and every node."""

    nodes: tuple[NodePlan, ...]
    address: str = "127.0.0.1"
    """Where Kamailio and HAProxy listen: the address the PBX reaches."""
    sip_port: int = 5060
    audiosocket_port: int = 9092
    websocket_port: int = 9093
    doors: bool = True
    """Balance the AudioSocket and WebSocket doors with HAProxy (and enable them on the nodes)."""
    ping_interval_s: int = 5
    """Kamailio's OPTIONS probe interval (s)."""
    fr_timer_ms: int = 3000
    ds_alg: int = 9
    kamailio_children: int = 8
    check_inter_ms: int = 1000
    """HAProxy's health check interval: a full or draining node gets no new connection after it."""
    pbx_cidrs: tuple[str, ...] = ()
    """HAProxy takes connections from these only (empty: any); behind it the doors see HAProxy's address."""
    kamailio_include: str = KAMAILIO_INCLUDE
    """The dispatcher configuration ``kamailio.cfg`` includes (relative: beside it)."""
    config: str = "/etc/hotline-asr/config.yaml"
    """The config file every node shares."""
    etc_dir: str = "/etc/hotline-asr"
    prefix: str = "/opt/hotline-asr"

    @property
    def node_names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BoxPlan:
        data = json.loads(text)
        nodes = tuple(NodePlan(**{**node, "cpus": tuple(node["cpus"])}) for node in data.pop("nodes"))
        return cls(nodes=nodes, **{**data, "pbx_cidrs": tuple(data.get("pbx_cidrs", ()))})


# ---- planning -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BoxSpec:
    """What ``box write`` is given; ``plan_box`` does the arithmetic."""

    nodes: int
    cores_per_node: int
    first_core: int = 0
    address: str = "127.0.0.1"
    node_host: str = ""
    """Where the nodes listen; empty: ``address``."""
    sip_port: int = 5060
    node_sip_port: int = 5100
    """Node N's SIP port is this + N (5101, 5102, ...); likewise the door and metrics bases."""
    node_audiosocket_port: int = 9200
    node_websocket_port: int = 9300
    metrics_port: int = 9400
    rtp_port_min: int = 20000
    rtp_ports_per_node: int = 0
    """0: the range up to ``RTP_PORT_CEILING`` split evenly (at most 4000 a node, 2 per call leg)."""
    state_root: str = "/var/lib/hotline-asr"
    extra: dict[str, Any] = field(default_factory=dict)
    """``BoxPlan`` fields to set (ping interval, check interval, pbx_cidrs, ...)."""


def plan_box(spec: BoxSpec) -> BoxPlan:
    """Every node's ports, RTP range and cores from the bases; raises BoxError when they cannot fit."""
    if not 1 <= spec.nodes <= MAX_NODES:
        raise BoxError(f"--nodes {spec.nodes}: between 1 and {MAX_NODES}")
    if spec.cores_per_node < 0:
        raise BoxError(f"--cores-per-node {spec.cores_per_node}: 0 (not pinned) or more")
    per_node = spec.rtp_ports_per_node or min(4000, (RTP_PORT_CEILING - spec.rtp_port_min) // spec.nodes)
    per_node -= per_node % 2  # RTP on even ports, RTCP beside
    if per_node < 2:
        raise BoxError(f"no RTP ports left for {spec.nodes} nodes above {spec.rtp_port_min}")
    host = spec.node_host or spec.address
    nodes = []
    for index in range(1, spec.nodes + 1):
        rtp_min = spec.rtp_port_min + (index - 1) * per_node
        first = spec.first_core + (index - 1) * spec.cores_per_node
        nodes.append(
            NodePlan(
                index=index,
                host=host,
                sip_port=spec.node_sip_port + index,
                rtp_port_min=rtp_min,
                rtp_port_max=rtp_min + per_node - 1,
                audiosocket_port=spec.node_audiosocket_port + index,
                websocket_port=spec.node_websocket_port + index,
                metrics_host="127.0.0.1",
                metrics_port=spec.metrics_port + index,
                cpus=tuple(range(first, first + spec.cores_per_node)),
                state_dir=f"{spec.state_root}/node{index}",
            )
        )
    plan = BoxPlan(nodes=tuple(nodes), address=spec.address, sip_port=spec.sip_port, **spec.extra)
    problems = plan_problems(plan)
    if problems:
        raise BoxError("; ".join(problems))
    return plan


def plan_problems(plan: BoxPlan, cpu_count: int | None = None) -> list[str]:
    """What would collide: a port two sockets share, overlapping RTP ranges, a core two nodes
    are pinned to, a shared state directory (the spool journal is locked by one process)."""
    problems = []
    taken: dict[tuple[str, int], str] = {}

    def claim(host: str, port: int, what: str) -> None:
        if not 1 <= port <= 65535:
            problems.append(f"{what}: port {port} out of range")
            return
        holder = next((w for (h, p), w in taken.items() if p == port and _same_host(h, host)), None)
        if holder is not None:
            problems.append(f"{what}: port {port} is already {holder}")
            return
        taken[(host, port)] = what

    claim(plan.address, plan.sip_port, "Kamailio's SIP port")
    if plan.doors:
        claim(plan.address, plan.audiosocket_port, "HAProxy's AudioSocket port")
        claim(plan.address, plan.websocket_port, "HAProxy's WebSocket port")
    for node in plan.nodes:
        claim(node.host, node.sip_port, f"{node.name}'s SIP port")
        claim(node.metrics_host, node.metrics_port, f"{node.name}'s metrics port")
        if plan.doors:
            claim(node.host, node.audiosocket_port, f"{node.name}'s AudioSocket port")
            claim(node.host, node.websocket_port, f"{node.name}'s WebSocket port")
    for node in plan.nodes:
        if node.rtp_port_min > node.rtp_port_max:
            problems.append(f"{node.name}'s RTP range {node.rtp_port_min}-{node.rtp_port_max} is empty")
        for (host, port), what in taken.items():
            if _same_host(host, node.host) and node.rtp_port_min <= port <= node.rtp_port_max:
                problems.append(f"{node.name}'s RTP range {node.rtp_port_min}-{node.rtp_port_max} holds {what}")
    for a, b in itertools.combinations(plan.nodes, 2):
        if _same_host(a.host, b.host) and a.rtp_port_min <= b.rtp_port_max and b.rtp_port_min <= a.rtp_port_max:
            problems.append(f"{a.name} and {b.name} share RTP ports ({_range(a)} and {_range(b)})")
        shared = sorted(set(a.cpus) & set(b.cpus))
        if shared:
            problems.append(f"{a.name} and {b.name} are pinned to the same cores {shared}")
        if a.state_dir == b.state_dir:
            problems.append(f"{a.name} and {b.name} share the state directory {a.state_dir}")
    for node in plan.nodes:
        beyond = [cpu for cpu in node.cpus if cpu < 0 or (cpu_count is not None and cpu >= cpu_count)]
        if beyond:
            problems.append(f"{node.name}'s cores {beyond} are not on this machine ({cpu_count} cores)")
    return problems


def _same_host(a: str, b: str) -> bool:
    return a == b or "0.0.0.0" in (a, b)


def _range(node: NodePlan) -> str:
    return f"{node.rtp_port_min}-{node.rtp_port_max}"


def cpu_list(cpus: Iterable[int]) -> str:
    """``0-3,8`` for systemd's ``CPUAffinity=`` and taskset."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(runs)


# ---- rendering --------------------------------------------------------------------------------


def render_overlay(plan: BoxPlan, node: NodePlan) -> str:
    lines = [
        f"# {node.name} of a box of {len(plan.nodes)}: written by `asr-gateway box write`; `box check` compares it.",
        f"# Over {plan.config}; heartbeat node id {node.node_id}; cores {cpu_list(node.cpus) or 'any'}.",
    ]
    lines += [f"{key}={value}" for key, value in node.overlay(plan.doors, plan.address).items()]
    return "\n".join(lines) + "\n"


def parse_overlay(text: str) -> dict[str, str]:
    """The ``KEY=value`` lines of an overlay (systemd's EnvironmentFile syntax, without quoting)."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            if sep:
                env[key.strip()] = value.strip()
    return env


def render_dispatcher_list(plan: BoxPlan) -> str:
    weight = max(1, 100 // len(plan.nodes))
    return "".join(f"1 sip:{n.host}:{n.sip_port};transport=udp 0 0 weight={weight}\n" for n in plan.nodes)


def render_kamailio(plan: BoxPlan, ds_list: str) -> str:
    """The box's defines, then the dispatcher configuration itself: no copy is edited. ``-A``
    still overrides any of them (each is guarded by ``#!ifndef``)."""
    defines = {
        "LISTEN_ADDR": f"udp:{plan.address}:{plan.sip_port}",
        "DS_LIST": f'"{ds_list}"',
        "DS_PING_INTERVAL": str(plan.ping_interval_s),
        "DS_ALG": f'"{plan.ds_alg}"',
        "FR_TIMER_MS": str(plan.fr_timer_ms),
        "CHILDREN": str(plan.kamailio_children),
    }
    lines = ["#!KAMAILIO", "# The box's Kamailio: written by `asr-gateway box write` (deploy/cluster/README.md)."]
    for name, value in defines.items():
        lines += [f"#!ifndef {name}", f"#!define {name} {value}", "#!endif"]
    lines.append(f'include_file "{plan.kamailio_include}"')
    return "\n".join(lines) + "\n"


def render_haproxy(plan: BoxPlan) -> str:
    """Balancing of the two doors. A node is checked by ``GET /health/ready`` on its metrics port
    every ``check_inter_ms``: one 503 (full, draining, Redis gone with the spool full) or no
    answer takes it out for new connections, two 200s bring it back; connections it holds go on.
    A refused connect (a killed node) is retried, on another node (``option redispatch 1``).
    AudioSocket is plain TCP. The WebSocket door is balanced in HTTP mode up to its upgrade, so
    that a handshake a node answers 503 (it began to drain within the last check interval) is
    retried on another node (``retry-on 503``); after the upgrade it is a tunnel."""
    inter = plan.check_inter_ms
    lines = [
        "# The box's HAProxy (AudioSocket, WebSocket): written by `asr-gateway box write`; `haproxy -c -f` checks it.",
        "global",
        "    # No maxconn: HAProxy sizes it from its file limit (LimitNOFILE); each node takes at most its own.",
        "    log stdout format raw local0 info",
        "",
        "defaults",
        "    mode tcp",
        "    log global",
        "    option tcplog",
        "    option dontlognull",
        "    timeout connect 1s",
        "    # A call lasts as long as it lasts; the doors' own idle timeouts close silent connections.",
        "    timeout client 4h",
        "    timeout server 4h",
        f"    timeout check {max(200, inter)}ms",
        "    # A node that refuses the connection (killed, not yet listening): try again, on another node.",
        "    retries 2",
        "    option redispatch 1",
        "",
    ]
    pbx = list(plan.pbx_cidrs)
    for door, port, node_port in (
        ("audiosocket", plan.audiosocket_port, "audiosocket_port"),
        ("websocket", plan.websocket_port, "websocket_port"),
    ):
        http = door == "websocket"
        lines += ["frontend " + door, f"    bind {plan.address}:{port}"]
        if http:
            lines += ["    mode http", "    option httplog", "    timeout http-request 5s"]
        if pbx:
            lines += [f"    acl pbx src {' '.join(pbx)}", "    tcp-request connection reject unless pbx"]
        lines += [f"    default_backend {door}_nodes", "", f"backend {door}_nodes", "    balance leastconn"]
        if http:
            lines += ["    mode http", "    retry-on 503 conn-failure empty-response", "    timeout tunnel 4h"]
        lines += ["    option httpchk GET /health/ready", "    http-check expect status 200"]
        lines.append(f"    default-server inter {inter}ms fastinter {inter}ms downinter {inter}ms fall 1 rise 2")
        for node in plan.nodes:
            lines.append(
                f"    server {node.name} {node.host}:{getattr(node, node_port)} maxconn {DOOR_CONNECTIONS_PER_NODE}"
                f" check addr {node.metrics_host} port {node.metrics_port}"
            )
        lines.append("")
    return "\n".join(lines)


def render_unit(plan: BoxPlan) -> str:
    return _UNIT.format(prefix=plan.prefix, etc=plan.etc_dir, config=plan.config)


def render_affinity(node: NodePlan) -> str:
    return (
        f"# {node.name}'s cores: written by `asr-gateway box write`. The node sizes its threads from them.\n"
        f"[Service]\nCPUAffinity={cpu_list(node.cpus)}\n"
    )


_UNIT = """\
# hotline-asr node %i of a box: several nodes on one machine, each pinned to its own cores,
# behind Kamailio (SIP) and HAProxy (AudioSocket, WebSocket). Written by `asr-gateway box write`
# (deploy/cluster/README.md); the single-node unit hotline-asr.service is its model.
# Every node reads the one config {config}; its own ports, RTP range, spool and metrics
# port come from {etc}/node%i.env (ASR_* variables), its cores from the drop-in
# hotline-asr@%i.service.d/box.conf (CPUAffinity=).
#   systemctl daemon-reload && systemctl enable --now hotline-asr@1 hotline-asr@2 ...
# Stop drains: SIGTERM makes the node answer OPTIONS, new INVITEs and /health/ready with 503, so
# Kamailio and HAProxy send it nothing new while its calls finish (up to TimeoutStopSec).
# Rolling restart: `systemctl restart hotline-asr@1`, wait until it is ready, then the next.
[Unit]
Description=hotline-asr streaming speech recognition, box node %i
Documentation=file://{prefix}/deploy/cluster/README.md
After=network-online.target redis-server.service
Wants=network-online.target

[Service]
Type=simple
User=hotline-asr
Group=hotline-asr
EnvironmentFile={etc}/node%i.env
ExecStart={prefix}/venv/bin/asr-gateway serve --config {config}
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=2s
TimeoutStopSec=90s
KillSignal=SIGTERM
LimitNOFILE=262144
LimitMEMLOCK=infinity
Environment=PYTHONUNBUFFERED=1
Environment=XDG_CACHE_HOME=/var/cache/hotline-asr
Environment=MALLOC_ARENA_MAX=2
CacheDirectory=hotline-asr
# /var/lib/hotline-asr/node%i: this node's spool journal (one process per journal: it is locked).
StateDirectory=hotline-asr/node%i
StateDirectoryMode=0750
ConfigurationDirectory=hotline-asr
LogsDirectory=hotline-asr

NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK
CapabilityBoundingSet=
AmbientCapabilities=
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
UMask=0027
ReadOnlyPaths=/srv/hotline-asr/models
DeviceAllow=/dev/nvidiactl rw
DeviceAllow=/dev/nvidia-uvm rw
DeviceAllow=char-nvidia-frontend rw
DeviceAllow=char-nvidia-uvm rw

[Install]
WantedBy=multi-user.target
"""


def box_files(plan: BoxPlan, ds_list: str = "/etc/kamailio/dispatcher.list") -> dict[str, str]:
    """Every generated file of the box, relative path -> text (``box.json`` included)."""
    files = {MANIFEST: plan.to_json()}
    for node in plan.nodes:
        files[f"nodes/{node.name}.env"] = render_overlay(plan, node)
        if node.cpus:
            files[f"systemd/hotline-asr@{node.index}.service.d/box.conf"] = render_affinity(node)
    files[f"systemd/{UNIT_NAME}"] = render_unit(plan)
    files["kamailio/dispatcher.list"] = render_dispatcher_list(plan)
    files["kamailio/kamailio.cfg"] = render_kamailio(plan, ds_list)
    if plan.doors:
        files["haproxy/haproxy.cfg"] = render_haproxy(plan)
    return files


def write_box(plan: BoxPlan, out: Path, ds_list: str = "/etc/kamailio/dispatcher.list") -> list[Path]:
    """Write every file of ``box_files`` under ``out`` (and the dispatcher configuration beside
    ``kamailio.cfg`` when it includes it by a relative name); the paths written."""
    problems = plan_problems(plan)
    if problems:
        raise BoxError("; ".join(problems))
    written = []
    for relative, text in box_files(plan, ds_list).items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    if not Path(plan.kamailio_include).is_absolute():
        include = out / "kamailio" / plan.kamailio_include
        shutil.copyfile(DISPATCHER_SOURCE, include)
        written.append(include)
    return written


# ---- checking ---------------------------------------------------------------------------------


def check_box(out: Path, config: Path | None = None, run_tools: bool = True) -> list[str]:
    """Problems with the box written in ``out``, one a line; empty: sound. Checks the plan for
    collisions, every file against what the plan renders (a hand edit is drift: rewrite), each
    node's config (``config``, else the plan's when it exists, else the defaults, with the
    node's overlay) as ``serve`` would load it, and runs ``haproxy -c`` and ``kamailio -c``."""
    try:
        plan = BoxPlan.from_json((out / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"{out / MANIFEST}: missing; write the box with `asr-gateway box write`"]
    except (ValueError, TypeError, KeyError) as exc:
        return [f"{out / MANIFEST}: unreadable ({exc})"]
    problems = [f"{MANIFEST}: {p}" for p in plan_problems(plan)]
    ds_list = _written_ds_list(out)
    for relative, text in box_files(plan, ds_list).items():
        path = out / relative
        if not path.exists():
            problems.append(f"{path}: missing; rewrite with `asr-gateway box write`")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: differs from what {MANIFEST} gives; rewrite with `asr-gateway box write`")
    base = config if config is not None else Path(plan.config)
    for node in plan.nodes:
        overlay = parse_overlay(_read(out / "nodes" / f"{node.name}.env"))
        try:
            load_config(base if base.exists() else None, environ=overlay)
        except ConfigError as exc:
            problems += [f"{node.name}: {line}" for line in exc.errors]
    if run_tools:
        problems += _tool_problems(plan, out, ds_list)
    return problems


def _written_ds_list(out: Path) -> str:
    """The ``DS_LIST`` the written ``kamailio.cfg`` names (the development cluster's is its own)."""
    for line in _read(out / "kamailio" / "kamailio.cfg").splitlines():
        if line.startswith("#!define DS_LIST "):
            return line.removeprefix("#!define DS_LIST ").strip('"')
    return "/etc/kamailio/dispatcher.list"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def _tool_problems(plan: BoxPlan, out: Path, ds_list: str) -> list[str]:
    problems = []
    haproxy = shutil.which("haproxy")
    if plan.doors and haproxy is not None:
        done = subprocess.run(
            [haproxy, "-c", "-f", str(out / "haproxy" / "haproxy.cfg")], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0 or "[WARNING]" in done.stdout + done.stderr:
            problems.append(f"haproxy -c: {(done.stdout + done.stderr).strip()[-1500:]}")
    kamailio = shutil.which("kamailio")
    if kamailio is not None:
        listed = out / "kamailio" / "dispatcher.list"
        command = [kamailio, "-c", "-f", str(out / "kamailio" / "kamailio.cfg"), "-A", f'DS_LIST="{listed}"']
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=out / "kamailio")
        if done.returncode != 0:
            problems.append(f"kamailio -c: {(done.stdout + done.stderr).strip()[-1500:]}")
    return problems


# ---- command line -------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="asr-gateway box", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    write = sub.add_parser("write", help="plan the box and write its files")
    write.add_argument("--nodes", type=int, required=True)
    write.add_argument("--cores-per-node", type=int, required=True, help="0: nodes not pinned")
    write.add_argument("--out", type=Path, required=True)
    write.add_argument("--first-core", type=int, default=0, help="node 1's first core (leave core 0 to the OS: 1)")
    write.add_argument("--address", default="127.0.0.1", help="where Kamailio and HAProxy listen (the PBX's view)")
    write.add_argument("--node-host", default="", help="where the nodes listen (default: --address)")
    write.add_argument("--sip-port", type=int, default=5060, help="Kamailio's port")
    write.add_argument("--node-sip-port", type=int, default=5100, help="node N listens on this + N")
    write.add_argument("--audiosocket-port", type=int, default=9092, help="HAProxy's AudioSocket port")
    write.add_argument("--websocket-port", type=int, default=9093, help="HAProxy's WebSocket port")
    write.add_argument("--node-audiosocket-port", type=int, default=9200, help="node N: this + N")
    write.add_argument("--node-websocket-port", type=int, default=9300, help="node N: this + N")
    write.add_argument("--metrics-port", type=int, default=9400, help="node N's /metrics: this + N, on 127.0.0.1")
    write.add_argument("--rtp-port-min", type=int, default=20000)
    write.add_argument("--rtp-ports-per-node", type=int, default=0, help="0: split evenly up to 60000")
    write.add_argument("--state-root", default="/var/lib/hotline-asr")
    write.add_argument("--no-doors", action="store_true", help="SIP only: no HAProxy, doors left as configured")
    write.add_argument("--check-interval-ms", type=int, default=1000, help="HAProxy's health check interval")
    write.add_argument("--ping-interval", type=int, default=5, help="Kamailio's OPTIONS interval, s")
    write.add_argument("--pbx", action="append", default=[], help="HAProxy takes connections from these CIDRs only")
    check = sub.add_parser("check", help="check a written box: collisions, drift, each node's config, the tools")
    check.add_argument("dir", type=Path)
    check.add_argument("--config", type=Path, help="the shared config to check the overlays over")
    args = parser.parse_args(argv)
    if args.action == "check":
        problems = check_box(args.dir, args.config)
        for line in problems:
            print(line, file=sys.stderr)
        if not problems:
            print("ok")
        return 1 if problems else 0
    for cidr in args.pbx:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            parser.error(f"--pbx {cidr}: not a CIDR")
    spec = BoxSpec(
        nodes=args.nodes,
        cores_per_node=args.cores_per_node,
        first_core=args.first_core,
        address=args.address,
        node_host=args.node_host,
        sip_port=args.sip_port,
        node_sip_port=args.node_sip_port,
        node_audiosocket_port=args.node_audiosocket_port,
        node_websocket_port=args.node_websocket_port,
        metrics_port=args.metrics_port,
        rtp_port_min=args.rtp_port_min,
        rtp_ports_per_node=args.rtp_ports_per_node,
        state_root=args.state_root,
        extra={
            "audiosocket_port": args.audiosocket_port,
            "websocket_port": args.websocket_port,
            "doors": not args.no_doors,
            "check_inter_ms": args.check_interval_ms,
            "ping_interval_s": args.ping_interval,
            "pbx_cidrs": tuple(args.pbx),
        },
    )
    try:
        plan = plan_box(spec)
        written = write_box(plan, args.out)
    except BoxError as exc:
        print(f"asr-gateway box write: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"written": [str(p) for p in written], "install": install_map(plan)}, indent=2))
    return 0


def install_map(plan: BoxPlan) -> Mapping[str, str]:
    """Where each written file goes on the box."""
    where = {
        f"systemd/{UNIT_NAME}": f"/etc/systemd/system/{UNIT_NAME}",
        "kamailio/kamailio.cfg": "/etc/kamailio/kamailio.cfg",
        f"kamailio/{KAMAILIO_INCLUDE}": f"/etc/kamailio/{KAMAILIO_INCLUDE}",
        "kamailio/dispatcher.list": "/etc/kamailio/dispatcher.list",
        "haproxy/haproxy.cfg": "/etc/haproxy/haproxy.cfg",
    }
    for node in plan.nodes:
        where[f"nodes/{node.name}.env"] = f"{plan.etc_dir}/{node.name}.env"
        if node.cpus:
            drop_in = f"hotline-asr@{node.index}.service.d/box.conf"
            where[f"systemd/{drop_in}"] = f"/etc/systemd/system/{drop_in}"
    return where
