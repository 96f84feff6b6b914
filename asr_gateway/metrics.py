"""Prometheus ``/metrics`` and ``/health`` on a small HTTP server thread.

Everything is read at scrape time from the components' own counters (no work in the media or
engine hot paths). Latency distributions are exported as summaries with quantiles over the
most recent samples the components keep.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from asr_gateway.service import Service

QUANTILES = (0.5, 0.95, 0.99)


class ServiceCollector(Collector):
    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Any]:
        s = self.service
        engine, pool, sip, publisher, bridge = s.engine, s.engine.pool, s.sip, s.publisher, s.bridge
        yield GaugeMetricFamily("asr_active_calls", "SIP calls in progress", value=sip.active_calls)
        yield GaugeMetricFamily("asr_engine_streams", "engine streams (call legs) open", value=engine.active_streams)
        yield GaugeMetricFamily("asr_kv_pool_slots", "cache pool slots in total", value=pool.num_slots)
        yield GaugeMetricFamily("asr_kv_pool_used_slots", "cache pool slots in use", value=pool.used_slots)
        yield GaugeMetricFamily("asr_kv_pool_bytes", "cache pool memory", value=pool.total_bytes)
        yield GaugeMetricFamily("asr_healthy", "1 while new calls are accepted", value=int(s.healthy))
        stats = engine.stats
        yield CounterMetricFamily("asr_engine_chunks", "stream-chunks decoded", value=stats.chunks)
        yield CounterMetricFamily("asr_engine_batches", "batched forwards run", value=stats.batches)
        yield CounterMetricFamily("asr_engine_finals", "final transcripts produced", value=stats.finals)
        yield CounterMetricFamily("asr_engine_errors", "engine ticks that failed", value=stats.errors)
        yield CounterMetricFamily(
            "asr_engine_behind_realtime_chunks",
            "chunks whose latency exceeded the real-time budget",
            value=stats.behind_realtime_chunks,
        )
        yield GaugeMetricFamily(
            "asr_engine_lag_seconds", "oldest ready chunk's wait for a step (latest tick)", value=engine.lag_ms / 1e3
        )
        yield CounterMetricFamily(
            "asr_engine_overload_refusals",
            "calls and OPTIONS refused (503) while the engine was behind real time",
            value=bridge.overload_refusals,
        )
        yield _quantiles("asr_engine_batch_size", "streams per batched forward (recent)", stats.batch_sizes, 1.0)
        yield _quantiles("asr_engine_forward_seconds", "batched forward time (recent)", stats.forward_ms, 1e-3)
        yield _quantiles(
            "asr_partial_latency_seconds",
            "chunk's last sample handed to the engine -> partial produced (recent)",
            stats.partial_latency_ms,
            1e-3,
        )
        yield _quantiles(
            "asr_final_latency_seconds", "endpoint -> final produced (recent)", stats.final_latency_ms, 1e-3
        )
        yield _quantiles(
            "asr_publish_latency_seconds",
            "chunk's last sample handed to the engine -> acknowledged by Redis (recent)",
            publisher.audio_to_ack_s,
            1.0,
        )
        responses = CounterMetricFamily("asr_sip_responses", "SIP responses sent", labels=["code"])
        for key, value in sorted(sip.counters.items()):
            if key.startswith("responses."):
                responses.add_metric([key.split(".", 1)[1]], value)
        yield responses
        sip_events = CounterMetricFamily("asr_sip_events", "SIP core counters", labels=["event"])
        for key, value in sorted(sip.counters.items()):
            if not key.startswith("responses."):
                sip_events.add_metric([key], value)
        yield sip_events
        rtp = CounterMetricFamily("asr_rtp", "RTP receive counters over all legs", labels=["counter"])
        for key, value in s.rtp_totals.snapshot().items():
            rtp.add_metric([key], value)
        yield rtp
        yield GaugeMetricFamily("asr_redis_connected", "1 while Redis answers", value=int(publisher.connected))
        yield GaugeMetricFamily("asr_redis_queue_depth", "events waiting for Redis", value=publisher.queued())
        yield GaugeMetricFamily("asr_redis_spool_bytes", "journal bytes not yet acknowledged by Redis",
                                value=publisher.spool_pending_bytes())  # fmt: skip
        journal = CounterMetricFamily("asr_redis_journal", "spool journal and replay counters", labels=["counter"])
        for name in ("spooled", "replayed", "duplicates_suppressed", "spool_full_dropped", "spool_corrupt_skipped",
                     "spool_torn_records", "calls_ended_on_restart"):  # fmt: skip
            journal.add_metric([name], getattr(publisher, name))
        yield journal
        yield CounterMetricFamily("asr_redis_published", "events published", value=publisher.published)
        yield CounterMetricFamily("asr_redis_errors", "Redis errors", value=publisher.redis_errors)
        yield CounterMetricFamily(
            "asr_partials_dropped",
            "partials dropped under backpressure",
            value=publisher.partials_dropped + bridge.partials_dropped,
        )


def _quantiles(name: str, doc: str, samples: Iterable[float], scale: float) -> GaugeMetricFamily:
    """Recent-window quantiles as a gauge with a ``quantile`` label (cheap to compute at scrape)."""
    values = np.fromiter(samples, dtype=np.float64)
    family = GaugeMetricFamily(name, doc, labels=["quantile"])
    if values.size:
        for q in QUANTILES:
            family.add_metric([str(q)], float(np.quantile(values, q)) * scale)
    return family


class MetricsServer:
    """Serves ``/metrics`` (Prometheus text format) and ``/health`` (200 ok / 503 unavailable)."""

    def __init__(self, service: Service, host: str, port: int) -> None:
        self.service = service
        self.host = host
        self.port = port
        self.registry = CollectorRegistry()
        self.registry.register(ServiceCollector(service))
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        registry, service = self.registry, self.service

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    body, status, ctype = generate_latest(registry), 200, CONTENT_TYPE_LATEST
                elif self.path.startswith("/health"):
                    ok = service.healthy
                    body = b"ok\n" if ok else b"unavailable\n"
                    status, ctype = (200 if ok else 503), "text/plain"
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
