"""The box's generator (``asr_gateway.box``): what ``asr-gateway box write`` plans and writes is
free of collisions, passes ``haproxy -c``, ``kamailio -c`` and ``systemd-analyze verify``, loads
as every node's config, and ``box check`` finds a hand edit or a collision. The box running, with
real nodes, Kamailio and HAProxy: tests/test_box_cluster.py."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from asr_gateway.box import (
    MANIFEST,
    BoxError,
    BoxPlan,
    BoxSpec,
    check_box,
    cpu_list,
    parse_overlay,
    plan_box,
    plan_problems,
    render_unit,
)
from asr_gateway.cli import main as cli_main
from asr_gateway.config import load_config

REPO = Path(__file__).resolve().parents[1]
DISPATCHER_CFG = REPO / "deploy" / "cluster" / "kamailio-dispatcher.cfg"
SHIPPED_TEMPLATE = REPO / "deploy" / "systemd" / "hotline-asr@.service"


def _write(out: Path, *extra: str) -> None:
    argv = ["box", "write", "--nodes", "4", "--cores-per-node", "4", "--first-core", "1", "--out", str(out)]
    assert cli_main([*argv, *extra]) == 0


def test_a_written_box_checks_clean_and_each_node_gets_its_own_share(tmp_path: Path) -> None:
    out = tmp_path / "box"
    _write(out, "--pbx", "10.1.0.0/16")
    assert check_box(out) == []  # collisions, drift, each node's config, haproxy -c, kamailio -c
    assert cli_main(["box", "check", str(out)]) == 0

    plan = BoxPlan.from_json((out / MANIFEST).read_text(encoding="utf-8"))
    nodes = plan.nodes
    assert [n.cpus for n in nodes] == [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15, 16)]
    ports = [p for n in nodes for p in (n.sip_port, n.audiosocket_port, n.websocket_port, n.metrics_port)]
    ports += [plan.sip_port, plan.audiosocket_port, plan.websocket_port]
    assert len(ports) == len(set(ports))
    ranges = sorted((n.rtp_port_min, n.rtp_port_max) for n in nodes)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    assert not [p for p in ports for low, high in ranges if low <= p <= high]
    assert len({n.state_dir for n in nodes}) == 4

    # Each overlay over the shared config is that node's whole config, as `serve` loads it.
    for node in nodes:
        overlay = parse_overlay((out / "nodes" / f"{node.name}.env").read_text(encoding="utf-8"))
        config = load_config(None, environ=overlay)
        assert (config.sip.port, config.rtp.port_min, config.rtp.port_max) == (
            node.sip_port,
            node.rtp_port_min,
            node.rtp_port_max,
        )
        assert (config.audiosocket.enabled, config.audiosocket.port) == (True, node.audiosocket_port)
        assert (config.websocket.enabled, config.websocket.port) == (True, node.websocket_port)
        assert config.metrics.port == node.metrics_port
        assert str(config.redis.spool_dir) == node.spool_dir
        assert [str(cidr) for cidr in config.sip.trusted_proxies] == ["127.0.0.1/32"]  # Kamailio's address
        assert config.audiosocket.max_connections_per_source == config.websocket.max_connections_per_source == 4096
        drop_in = out / "systemd" / f"hotline-asr@{node.index}.service.d" / "box.conf"
        assert f"CPUAffinity={cpu_list(node.cpus)}" in drop_in.read_text(encoding="utf-8").splitlines()

    haproxy = (out / "haproxy" / "haproxy.cfg").read_text(encoding="utf-8")
    for door in ("audiosocket", "websocket"):
        backend = haproxy.split(f"\nbackend {door}_nodes\n")[1].split("\n\n")[0]
        assert "balance leastconn" in backend and "option httpchk GET /health/ready" in backend
        for node in nodes:
            port = node.audiosocket_port if door == "audiosocket" else node.websocket_port
            server = f"server {node.name} {node.host}:{port} maxconn 4096 check addr 127.0.0.1 port {node.metrics_port}"
            assert server in backend
    assert "mode tcp" in haproxy and "option redispatch 1" in haproxy
    websocket = haproxy.split("\nbackend websocket_nodes\n")[1]
    assert "mode http" in websocket and "retry-on 503 conn-failure empty-response" in websocket
    assert "tcp-request connection reject unless pbx" in haproxy and "acl pbx src 10.1.0.0/16" in haproxy
    listed = (out / "kamailio" / "dispatcher.list").read_text(encoding="utf-8").splitlines()
    assert listed == [f"1 sip:127.0.0.1:{n.sip_port};transport=udp 0 0 weight=25" for n in nodes]
    # Kamailio's file is the dispatcher configuration itself, after the box's defines.
    kamailio = (out / "kamailio" / "kamailio.cfg").read_text(encoding="utf-8")
    assert kamailio.rstrip().endswith('include_file "hotline-asr-dispatcher.cfg"')
    assert (out / "kamailio" / "hotline-asr-dispatcher.cfg").read_bytes() == DISPATCHER_CFG.read_bytes()


def test_the_dispatcher_fails_a_refused_call_over_to_a_sibling() -> None:
    """A node full or draining answers an INVITE 503: Kamailio tries the next node, not the caller."""
    text = DISPATCHER_CFG.read_text(encoding="utf-8")
    request_route = text.split("request_route {")[1].split("failure_route[NEXT_NODE]")[0]
    assert 't_on_failure("NEXT_NODE");\n    t_relay();' in request_route
    failure_route = text.split("failure_route[NEXT_NODE] {")[1]
    assert 't_check_status("503|408")' in failure_route
    assert failure_route.index('ds_mark_dst("ip")') < failure_route.index("ds_next_dst()")
    assert failure_route.index("ds_next_dst()") < failure_route.index("t_relay()")


def test_box_check_finds_a_hand_edit_and_a_collision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "box"
    _write(out)
    overlay = out / "nodes" / "node2.env"
    overlay.write_text(overlay.read_text(encoding="utf-8").replace("ASR_SIP_PORT=5102", "ASR_SIP_PORT=5101"))
    assert cli_main(["box", "check", str(out)]) == 1
    assert f"{overlay}: differs from what box.json gives" in capsys.readouterr().err

    plan = BoxPlan.from_json((out / MANIFEST).read_text(encoding="utf-8"))
    first, second, *rest = plan.nodes
    clash = replace(second, sip_port=first.sip_port, cpus=(4, 5, 6, 7, 8), rtp_port_max=second.rtp_port_max + 3000)
    problems = plan_problems(replace(plan, nodes=(first, clash, *rest)), cpu_count=16)
    assert f"node2's SIP port: port {first.sip_port} is already node1's SIP port" in problems
    assert "node1 and node2 are pinned to the same cores [4]" in problems
    assert any(p.startswith("node2 and node3 share RTP ports") for p in problems)
    assert "node4's cores [16] are not on this machine (16 cores)" in problems
    (out / MANIFEST).write_text(replace(plan, nodes=(first, clash, *rest)).to_json(), encoding="utf-8")
    assert any("pinned to the same cores" in p for p in check_box(out, run_tools=False))


def test_plan_box_refuses_what_cannot_fit() -> None:
    with pytest.raises(BoxError, match="no RTP ports left"):
        plan_box(BoxSpec(nodes=200, cores_per_node=1, rtp_port_min=59950))
    with pytest.raises(BoxError, match="node1's AudioSocket port: port 9201 is already HAProxy's AudioSocket port"):
        plan_box(BoxSpec(nodes=2, cores_per_node=1, extra={"audiosocket_port": 9201}))
    unpinned = plan_box(BoxSpec(nodes=3, cores_per_node=0))
    assert [n.cpus for n in unpinned.nodes] == [(), (), ()]
    assert cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_the_shipped_template_unit_is_the_generators_and_passes_systemd_analyze(tmp_path: Path) -> None:
    """The committed ``deploy/systemd/hotline-asr@.service`` is what ``box write`` writes with the
    default paths; an instance with its CPUAffinity drop-in passes ``systemd-analyze verify``
    without a warning (a copy whose one change is the install prefix, as tests/test_deploy_units.py
    explains; ``SYSTEMD_UNIT_PATH`` makes verify read the drop-in)."""
    text = SHIPPED_TEMPLATE.read_text(encoding="utf-8")
    assert text == render_unit(BoxPlan(nodes=()))
    out = tmp_path / "box"
    _write(out)
    assert (out / "systemd" / "hotline-asr@.service").read_text(encoding="utf-8") == text
    units = tmp_path / "units"
    prefix = tmp_path / "opt" / "hotline-asr"
    stub = prefix / "venv" / "bin" / "asr-gateway"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    stub.chmod(0o755)
    shutil.copytree(out / "systemd", units)
    template = units / "hotline-asr@.service"
    template.write_text(text.replace("/opt/hotline-asr/venv/", f"{prefix}/venv/"), encoding="utf-8")
    assert re.search(r"^EnvironmentFile=/etc/hotline-asr/node%i\.env$", text, flags=re.MULTILINE)
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"}
    done = subprocess.run(
        ["systemd-analyze", "verify", "hotline-asr@2.service"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=units,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not done.stderr.strip() and not done.stdout.strip(), done.stdout + done.stderr
