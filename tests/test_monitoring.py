"""deploy/monitoring/: the alert rules pass ``promtool check rules`` and their unit tests
(``promtool test rules``), every Grafana panel query is valid PromQL, and every metric the
rules and the dashboard use is one a running service exports."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from asr_gateway.dev.demo import demo_config
from asr_gateway.service import DEMO_MODEL_DIR, Service
from tests.redis_server import RedisServer, redis_server
from tests.tool_marks import needs_redis_server

__all__ = ["redis_server"]  # the fixture, used by name

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
# Grafana's variables, as a query would read with the dashboard's defaults.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$job": "hotline-asr", "$instance": ".*"}
METRIC_NAME = re.compile(r"\b((?:asr|process)_[a-z0-9_]+)\b")


def promtool(*args: str | Path, cwd: Path = MONITORING) -> str:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def panel_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            query = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                query = query.replace(name, value)
            queries.append(query)
    return queries


def rule_queries() -> list[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [str(rule["expr"]) for group in groups for rule in group["rules"]]


@needs_promtool
def test_alert_rules_pass_promtool_check() -> None:
    assert "SUCCESS" in promtool("check", "rules", RULES)


@needs_promtool
def test_alert_rules_unit_tests_pass() -> None:
    assert "SUCCESS" in promtool("test", "rules", "alerts_test.yml")


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each panel query as a recording rule's expression."""
    queries = panel_queries()
    assert len(queries) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"panel:query{i}", "expr": q}
                                                        for i, q in enumerate(queries)]}]}  # fmt: skip
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    assert f"SUCCESS: {len(queries)} rules found" in promtool("check", "rules", path, cwd=tmp_path)


def test_the_dashboard_shows_what_operators_asked_for() -> None:
    text = "\n".join(panel_queries())
    for needed in ("asr_partial_latency_seconds_bucket", "asr_final_latency_seconds_bucket", "asr_active_calls",
                   "asr_engine_behind_realtime_chunks_total", "asr_redis_spool_bytes",
                   "asr_config_reload_failures_total"):  # fmt: skip
        assert needed in text, needed
    assert "sum by (le)" in text, "a latency p95 across all nodes, from the summed histograms"


@needs_redis_server
def test_every_metric_the_rules_and_dashboard_use_is_exported(tmp_path: Path, redis_server: RedisServer) -> None:
    async def scrape() -> set[str]:
        service = Service(demo_config(redis_server.url, DEMO_MODEL_DIR, tmp_path, max_streams=2))
        ports = await service.start()
        try:
            url = f"http://127.0.0.1:{ports.metrics}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        finally:
            await service.stop(grace_s=1)
        names: set[str] = set()
        for family in text_string_to_metric_families(text):
            names.update(sample.name for sample in family.samples)
            if family.type == "counter":  # a labelled counter has no sample before its first event
                names.add(f"{family.name}_total")
        return names

    exported = asyncio.run(scrape())
    used = {name for query in panel_queries() + rule_queries() for name in METRIC_NAME.findall(query)}
    assert used, "no metric names found in the monitoring files"
    assert not used - exported, f"used by deploy/monitoring but not exported: {sorted(used - exported)}"
