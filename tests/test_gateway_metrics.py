"""``/metrics`` and the health probes of the running service around a real sipp call.

Counters move (calls, chunks, batches, SIP responses by code, RTP packets, Redis publishes),
the latency histograms fill, process metrics and the config version appear, and
``/health/ready`` (and its old name ``/health``) answers like SIP OPTIONS: 200 normally, 503
when the engine is full or the service drains, while ``/health/live`` stays 200 throughout.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asr_core.audio_io import read_wav
from asr_gateway.dev.demo import DATA_DIR, EventCollector, demo_config
from asr_gateway.dev.sipp_calls import place_call
from asr_gateway.service import DEMO_MODEL_DIR, Service
from calls.routing import CallFacts
from tests.redis_server import RedisServer, redis_server
from tests.tool_marks import needs_redis_server, needs_sipp

__all__ = ["redis_server"]  # the fixture, used by name

REPO = Path(__file__).resolve().parents[1]
FIXTURE_MODEL = REPO.parent / "shared" / "fixtures" / "wenet_u2pp_small" / "model"
MODEL = DEMO_MODEL_DIR if (DEMO_MODEL_DIR / "final.pt").is_file() else FIXTURE_MODEL

pytestmark = [
    needs_sipp,
    needs_redis_server,
    pytest.mark.skipif(not MODEL.is_dir(), reason="neither the demo model nor the WeNet fixture model"),
    pytest.mark.timeout(60),
]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def scrape(port: int) -> Samples:
    status, text = http_get(port, "/metrics")
    assert status == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def options_status(sip_port: int) -> int:
    """Send SIP OPTIONS over UDP and return the response's status code."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5)
        local = sock.getsockname()[1]
        request = (
            f"OPTIONS sip:probe@127.0.0.1:{sip_port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bK{uuid.uuid4().hex}\r\n"
            f"From: <sip:monitor@127.0.0.1>;tag={uuid.uuid4().hex[:8]}\r\n"
            f"To: <sip:probe@127.0.0.1:{sip_port}>\r\n"
            f"Call-ID: {uuid.uuid4().hex}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        )
        sock.sendto(request.encode(), ("127.0.0.1", sip_port))
        reply = sock.recv(65536).decode(errors="replace")
    return int(reply.split(" ", 2)[1])


async def probe(metrics_port: int, sip_port: int) -> tuple[int, int]:
    """(/health/ready status, OPTIONS status), asked off the event loop that serves them;
    /health answers as /health/ready does and /health/live is 200 whatever the load."""
    ready, body = await asyncio.to_thread(http_get, metrics_port, "/health/ready")
    assert (await asyncio.to_thread(http_get, metrics_port, "/health"))[0] == ready
    assert (await asyncio.to_thread(http_get, metrics_port, "/health/live")) == (200, "live\n")
    assert body.startswith("ready" if ready == 200 else "not ready: "), body
    return ready, await asyncio.to_thread(options_status, sip_port)


def test_metrics_move_and_health_mirrors_options(tmp_path: Path, redis_server: RedisServer) -> None:
    async def scenario() -> dict[str, object]:
        config = demo_config(redis_server.url, MODEL, tmp_path, max_streams=1)
        service = Service(config)
        ports = await service.start()
        assert ports.sip_udp is not None and ports.metrics is not None
        sip_port, metrics_port = ports.sip_udp, ports.metrics
        collector = EventCollector(redis_server.url)
        await collector.start()
        seen: dict[str, object] = {}
        try:
            seen["idle"] = await probe(metrics_port, sip_port)
            seen["before"] = await asyncio.to_thread(scrape, metrics_port)
            samples = read_wav(DATA_DIR / "hotline_1.wav").samples
            call = asyncio.create_task(place_call(tmp_path / "call", sip_port, samples, 16000, call_tag="m"))
            while service.engine.active_streams == 0 or service.engine.stats.chunks < 3:
                assert not call.done(), (await call).errors
                await asyncio.sleep(0.05)
            seen["full"] = await probe(metrics_port, sip_port)
            seen["during"] = await asyncio.to_thread(scrape, metrics_port)
            result = await call
            assert result.returncode == 0, result.errors
            assert await collector.wait_for(["m-"], 10)
            seen["chunk_ms"] = {
                r.event.get("chunk_ms") for r in collector.received if r.event["event_type"].startswith("transcript.")
            }
            seen["after"] = await asyncio.to_thread(scrape, metrics_port)
            seen["free"] = await probe(metrics_port, sip_port)
            service.request_stop()
            seen["draining"] = await probe(metrics_port, sip_port)
        finally:
            await service.stop(grace_s=5)
            await collector.stop()
        return seen

    seen = asyncio.run(scenario())
    assert seen["idle"] == (200, 200)
    assert seen["full"] == (503, 503), "one engine slot, in use: full"
    assert seen["free"] == (200, 200)
    assert seen["draining"] == (503, 503)

    before, during, after = (seen[k] for k in ("before", "during", "after"))
    assert isinstance(before, dict) and isinstance(during, dict) and isinstance(after, dict)
    assert value(before, "asr_active_calls") == 0 and value(during, "asr_active_calls") == 1
    assert value(during, "asr_engine_streams") == 1 and value(after, "asr_engine_streams") == 0
    assert value(during, "asr_kv_pool_used_slots") == 1 and value(after, "asr_kv_pool_used_slots") == 0
    assert value(during, "asr_healthy") == 0 and value(after, "asr_healthy") == 1
    for counter in ("asr_engine_chunks_total", "asr_engine_batches_total", "asr_engine_finals_total"):
        assert (value(after, counter) or 0) > (value(before, counter) or 0), counter
    assert (value(after, "asr_engine_chunks_total") or 0) > (value(during, "asr_engine_chunks_total") or 0)
    assert (value(after, "asr_sip_responses_total", code="200") or 0) >= 2  # INVITE, BYE (+ OPTIONS)
    assert (value(after, "asr_sip_responses_total", code="503") or 0) >= 1  # the OPTIONS while full
    assert (value(after, "asr_rtp_total", counter="packets") or 0) >= 190  # 4 s of 20 ms packets
    assert value(after, "asr_rtp_total", counter="lost") is not None
    assert (value(after, "asr_redis_published_total") or 0) > (value(before, "asr_redis_published_total") or 0)
    assert value(after, "asr_redis_connected") == 1
    assert value(after, "asr_engine_lag_seconds") is not None
    assert value(after, "asr_engine_overload_refusals_total") == 0  # one call keeps up
    assert value(after, "asr_engine_endpoints_inside_chunks_total") is not None
    assert (
        value(after, "asr_engine_degraded_streams") == 0
        and value(after, "asr_engine_degraded_stream_seconds_total") == 0
        and value(after, "asr_engine_reduced_finals_total", reason="finals_queued") == 0
        and value(after, "asr_engine_reduced_finals_total", reason="engine_saturated") == 0
    )
    assert seen["chunk_ms"] == {320}, "transcripts carry the route's chunk size (no surge)"
    for name in ("asr_partial_latency_seconds", "asr_final_latency_seconds", "asr_publish_latency_seconds",
                 "asr_engine_step_seconds", "asr_engine_batch_size"):  # fmt: skip
        count = value(after, f"{name}_count") or 0
        assert count > 0 and value(after, f"{name}_bucket", le="+Inf") == count, name
        assert (value(after, f"{name}_sum") or 0) > 0, name
        assert value(before, f"{name}_count") == 0, "no samples before the call"
    buckets = sorted(
        (float(dict(k[1])["le"]), v) for k, v in after.items() if k[0] == "asr_partial_latency_seconds_bucket"
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets), "cumulative buckets"
    assert (value(after, "process_resident_memory_bytes") or 0) > 100e6
    assert (value(after, "process_cpu_seconds_total") or 0) > 0
    version = [dict(k[1]) for k in after if k[0] == "asr_config_info"]
    assert len(version) == 1 and len(version[0]["version"]) == 16, version
    assert value(after, "asr_config_last_reload_success") == 1
    assert value(after, "asr_config_reload_failures_total") == 0
    assert value(after, "asr_routing_unparsable_sources_total") == 0  # sipp calls from 127.0.0.1


def test_unknown_path_is_404(tmp_path: Path, redis_server: RedisServer) -> None:
    async def scenario() -> int:
        service = Service(demo_config(redis_server.url, MODEL, tmp_path))
        ports = await service.start()
        assert ports.metrics is not None
        try:
            return (await asyncio.to_thread(http_get, ports.metrics, "/nope"))[0]
        finally:
            await service.stop(grace_s=1)

    assert asyncio.run(scenario()) == 404


def test_a_rejected_reload_shows_in_metrics_and_the_node_stays_ready(tmp_path: Path, redis_server: RedisServer) -> None:
    """An invalid routes file on reload: the failure is counted, the last-reload gauge drops to
    0, the config version stays that of the files in force, and the node stays ready."""
    routes = tmp_path / "routes.yaml"
    routes.write_text((DATA_DIR / "routes.yaml").read_text(encoding="utf-8"), encoding="utf-8")

    async def scenario() -> tuple[Samples, Samples, int]:
        config = demo_config(redis_server.url, MODEL, tmp_path).model_copy(update={"routes": routes})
        service = Service(config)
        ports = await service.start()
        assert ports.metrics is not None
        try:
            before = await asyncio.to_thread(scrape, ports.metrics)
            routes.write_text("profiles: [not, a, mapping]\n", encoding="utf-8")
            assert not service.reloader.reload()
            after = await asyncio.to_thread(scrape, ports.metrics)
            ready = (await asyncio.to_thread(http_get, ports.metrics, "/health/ready"))[0]
        finally:
            await service.stop(grace_s=1)
        return before, after, ready

    before, after, ready = asyncio.run(scenario())
    assert value(before, "asr_config_last_reload_success") == 1 and value(after, "asr_config_last_reload_success") == 0
    assert value(after, "asr_config_reload_failures_total") == 1 and value(after, "asr_config_reloads_total") == 1
    assert (value(after, "asr_config_last_reload_timestamp_seconds") or 0) >= (
        value(before, "asr_config_last_reload_timestamp_seconds") or 0
    )
    versions = [[dict(k[1])["version"] for k in samples if k[0] == "asr_config_info"] for samples in (before, after)]
    assert versions[0] == versions[1], "the rejected file did not change the version in force"
    assert ready == 200


def test_unparsable_source_addresses_are_counted_across_reloads(tmp_path: Path, redis_server: RedisServer) -> None:
    """A call whose source address does not parse (what a door states from a proxy's header) is
    counted in ``asr_routing_unparsable_sources_total``; a reload of the routes keeps the count."""
    routes = tmp_path / "routes.yaml"
    routes.write_text((DATA_DIR / "routes.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    facts = CallFacts("behind-the-proxy", "12345", "", {}, siprec=False)

    async def scenario() -> tuple[Samples, Samples]:
        config = demo_config(redis_server.url, MODEL, tmp_path).model_copy(update={"routes": routes})
        service = Service(config)
        ports = await service.start()
        assert ports.metrics is not None
        try:
            service.router.decide(facts)
            first = await asyncio.to_thread(scrape, ports.metrics)
            assert service.reloader.reload()
            service.router.decide(facts)
            second = await asyncio.to_thread(scrape, ports.metrics)
        finally:
            await service.stop(grace_s=1)
        return first, second

    first, second = asyncio.run(scenario())
    assert value(first, "asr_routing_unparsable_sources_total") == 1
    assert value(second, "asr_routing_unparsable_sources_total") == 2
