"""The whole service on loopback for end-to-end tests: a config next to a test's redis-server,
sipp calls placed through a started ``Service`` until it has drained, and the events read back
from Redis.

``run_calls(config, calls)`` starts the service, places the calls ``calls(sip_port)`` returns
all at once, asserts that each sipp run succeeded, waits until the engine and the bridge are
empty, runs ``after(service, ports)`` (if given) while the service still runs, and stops it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, cast

import jsonschema
import redis

from asr_gateway.config import ServiceConfig, load_config
from asr_gateway.dev.sipp_calls import CallResult
from asr_gateway.service import DEMO_MODEL_DIR, Ports, Service
from kb_hooks import events as ev

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "hotline_8k"
EXAMPLE_ROUTES = REPO / "deploy" / "config" / "routes.example.yaml"
DRAIN_TIMEOUT_S = 60.0  # a slow 2-core runner decodes the calls' last audio seconds after they hang up


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_config(tmp_path: Path, redis_url: str, routes: Path = EXAMPLE_ROUTES) -> Path:
    model_dir = DEMO_MODEL_DIR
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
sip: {{host: 127.0.0.1, port: {free_port()}, transports: [udp], rtp_inactivity_timeout_s: 20}}
rtp: {{host: 127.0.0.1, port_min: 41000, port_max: 41999}}
engine: {{model_dir: {model_dir}, max_streams: 8, max_batch: 8, left_chunks: 8}}
redis: {{url: "{redis_url}", spool_dir: {tmp_path / "spool"}}}
metrics: {{host: 127.0.0.1, port: 0}}
routes: {routes}
kb_hooks:
  kb_sets: {{hotline: {REPO / "deploy" / "config" / "kb.example.yaml"}}}
  tag_rule_sets: {{hotline: {REPO / "deploy" / "config" / "tags.example.yaml"}}}
  analytics_rule_sets: {{hotline: {REPO / "deploy" / "config" / "analytics.example.yaml"}}}
  street_lists: {{hotline: {REPO / "deploy" / "config" / "streets.example.txt"}}}
""",
        encoding="utf-8",
    )
    return config


def service_config(tmp_path: Path, redis_url: str, routes: str | None = None, extra: str = "") -> ServiceConfig:
    """``write_config``'s config, loaded: ``routes`` (YAML text) written as its routes file (the
    example routes when None), ``extra`` (YAML lines: another door, say) appended to it."""
    routes_file = EXAMPLE_ROUTES
    if routes is not None:
        routes_file = tmp_path / "routes.yaml"
        routes_file.write_text(routes, encoding="utf-8")
    config_file = write_config(tmp_path, redis_url, routes_file)
    with config_file.open("a", encoding="utf-8") as out:
        out.write(extra)
    return load_config(config_file, {})


def read_events(url: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    entries = cast("list[tuple[bytes, dict[bytes, bytes]]]", client.xrange("asr:events"))
    events = []
    for _, fields in entries:
        raw = fields.get(b"event") or next(iter(fields.values()))
        events.append(json.loads(raw))
    return events


def read_valid_events(url: str) -> list[dict[str, Any]]:
    """Every event in Redis, each checked against the v1 JSON schema."""
    events = read_events(url)
    for event in events:
        jsonschema.validate(event, ev.schema())
    return events


async def wait_drained(service: Service) -> None:
    """Wait until the engine has no stream and the bridge no call left; fail if that takes too long."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while service.engine.active_streams or service.bridge.active_calls:
        assert time.monotonic() < deadline, (
            f"not drained {DRAIN_TIMEOUT_S:.0f} s after the calls hung up: {service.engine.active_streams} engine "
            f"streams, {service.bridge.active_calls} calls open"
        )
        await asyncio.sleep(0.05)


def run_calls(
    config: ServiceConfig,
    calls: Callable[[int], Iterable[Awaitable[CallResult]]],
    after: Callable[[Service, Ports], Awaitable[None]] | None = None,
) -> list[CallResult]:
    """Start the service, place ``calls(sip_udp_port)`` together, check each succeeded, wait
    until drained, run ``after`` while the service runs, stop it; the calls' results."""

    async def scenario() -> list[CallResult]:
        service = Service(config)
        ports = await service.start()
        assert ports.sip_udp is not None
        try:
            results = await asyncio.gather(*calls(ports.sip_udp))
            for result in results:
                assert result.returncode == 0, result.errors
            await wait_drained(service)
            if after is not None:
                await after(service, ports)
        finally:
            await service.stop(grace_s=5)
        return list(results)

    return asyncio.run(scenario())
