"""Prometheus ``/metrics`` and the ``/health`` probes on a small HTTP server thread.

Everything is read at scrape time from the components' own counters (no work in the media or
engine hot paths). Latency distributions are histograms of every measurement since start
(``asr_common.latency.Histogram``), so they sum across nodes: the p95 of a cluster is
``histogram_quantile(0.95, sum by (le) (rate(asr_partial_latency_seconds_bucket[5m])))``.
The process collector adds CPU, memory, open files and start time. Metric names and the probes
are documented in docs/operations.md.

Paths: ``/metrics``; ``/health/live`` (200 while the process serves HTTP: restart it only when
this fails); ``/health/ready`` (200 when the node takes new calls, 503 with the reasons when it
is full, draining, not started or cannot publish); ``/health``, the ready probe under its old
name.

What it reads is declared here, not taken from the service: a ``Monitored`` source (the
service) hands over ``NodeFigures`` at each scrape and its readiness reasons at each probe.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.registry import Collector

from asr_common.latency import Histogram
from calls.call import CallSource

JOURNAL_COUNTERS = ("spooled", "replayed", "duplicates_suppressed", "spool_full_dropped", "spool_corrupt_skipped",
                    "spool_torn_records", "calls_ended_on_restart")  # fmt: skip


@dataclass(frozen=True)
class EngineFigures:
    """The engine's gauges, counters and latency histograms (seconds unless named otherwise)."""

    streams: int  # open streams (call legs)
    slots: int  # cache pool slots in total
    used_slots: int
    pool_bytes: int
    chunks: int
    batches: int
    finals: int
    errors: int
    behind_realtime_chunks: int
    endpoints_inside_chunks: int  # utterances a pause ended inside a chunk (engine.endpoint.check_every_frame)
    lag_s: float  # the oldest ready chunk's wait for a step (latest tick)
    finals_lag_s: float  # the oldest ended utterance's wait for its final (0: none waiting)
    overload_refusals: int  # calls and OPTIONS refused while the engine was behind
    degraded_streams: int  # streams at a longer chunk than their route's because the engine was behind
    degraded_stream_seconds: float  # stream-seconds spent so, summed over streams
    reduced_finals: Mapping[str, int]  # finals searched the cheaper way (surge), by reason (asr_core FinalsReduction)
    batch_size: Histogram  # streams per batched chunk step
    step_seconds: Histogram
    partial_latency: Histogram
    final_latency: Histogram


@dataclass(frozen=True)
class RedisFigures:
    """The publisher's: connection, queue, spool (bytes), counters and publish latency."""

    connected: bool
    queue_depth: int
    spool_bytes: int  # journal bytes Redis has not acknowledged
    spool_max_bytes: int
    journal: Mapping[str, int]  # by name, ``JOURNAL_COUNTERS``
    published: int
    errors: int
    publish_latency: Histogram  # a chunk's last sample handed to the engine -> its event acknowledged


@dataclass(frozen=True)
class DoorFigures:
    """One front door's counters besides SIP's: open connections, legs opened, refusals by reason."""

    door: str
    connections: int
    legs: int
    refusals: Mapping[str, int]


@dataclass(frozen=True)
class WorkerFigures:
    """The bridge worker's queue (``asr_gateway.bridge_queue``): items now and at most, the event
    loop's messages queued past its bound, engine threads that waited for room."""

    depth: int
    peak: int
    over_bound: int
    waits: int


@dataclass(frozen=True)
class NodeFigures:
    """Everything ``/metrics`` shows of a node (process metrics aside), read at one scrape."""

    healthy: bool  # ready for new calls
    active_calls: int  # every door's calls in progress (``calls.registry.CallRegistry``)
    calls_by_source: Mapping[CallSource, int]  # the same by door (every door listed, 0 for one without calls)
    partials_dropped: int  # by the bridge and the publisher together
    worker: WorkerFigures
    engine: EngineFigures
    redis: RedisFigures
    sip_counters: Mapping[str, int]  # ``responses.<code>`` and the SIP core's own counters
    rtp_counters: Mapping[str, int]  # over every leg, open or closed
    doors: Sequence[DoorFigures]  # the enabled AudioSocket / WebSocket doors
    config_version: str
    last_reload_ok: bool
    last_reload_at_unix: float
    reloads: int
    reload_failures: int
    unparsable_sources: int = 0  # routing decisions for a source address that did not parse


class Monitored(Protocol):
    """What ``/metrics`` and the probes read of a node."""

    def figures(self) -> NodeFigures: ...

    def not_ready(self) -> list[str]:
        """Why the node should get no new call now (empty: ready)."""
        ...


class NodeCollector(Collector):
    def __init__(self, source: Monitored) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        figures = self.source.figures()
        yield from self._calls_and_engine(figures)
        yield from self._sip_and_rtp(figures)
        yield from self._doors(figures.doors)
        yield from self._redis(figures.redis)
        yield from self._config(figures)

    def _calls_and_engine(self, node: NodeFigures) -> Iterator[Any]:
        engine = node.engine
        yield GaugeMetricFamily("asr_active_calls", "calls in progress, every front door", value=node.active_calls)
        by_source = GaugeMetricFamily(
            "asr_active_calls_by_source",
            "calls in progress by front door: sip, audiosocket, websocket, audio_fork",
            labels=["source"],
        )
        for source, count in node.calls_by_source.items():
            by_source.add_metric([source], count)
        yield by_source
        yield GaugeMetricFamily("asr_engine_streams", "engine streams (call legs) open", value=engine.streams)
        yield GaugeMetricFamily("asr_kv_pool_slots", "cache pool slots in total", value=engine.slots)
        yield GaugeMetricFamily("asr_kv_pool_used_slots", "cache pool slots in use", value=engine.used_slots)
        yield GaugeMetricFamily("asr_kv_pool_bytes", "cache pool memory", value=engine.pool_bytes)
        yield GaugeMetricFamily("asr_healthy", "1 while the node is ready for new calls", value=int(node.healthy))
        yield CounterMetricFamily("asr_engine_chunks", "stream-chunks decoded", value=engine.chunks)
        yield CounterMetricFamily("asr_engine_batches", "batched chunk steps run", value=engine.batches)
        yield CounterMetricFamily("asr_engine_finals", "final transcripts produced", value=engine.finals)
        yield CounterMetricFamily("asr_engine_errors", "engine ticks or final batches that failed", value=engine.errors)
        yield CounterMetricFamily(
            "asr_engine_behind_realtime_chunks",
            "chunks whose latency exceeded the real-time budget",
            value=engine.behind_realtime_chunks,
        )
        yield CounterMetricFamily(
            "asr_engine_endpoints_inside_chunks",
            "utterances a pause ended inside a chunk, whose rest was decoded again (engine.endpoint.check_every_frame)",
            value=engine.endpoints_inside_chunks,
        )
        yield GaugeMetricFamily(
            "asr_engine_lag_seconds", "oldest ready chunk's wait for a step (latest tick)", value=engine.lag_s
        )
        yield GaugeMetricFamily(
            "asr_finals_lag_seconds",
            "oldest ended utterance's wait for its final (0: none waiting)",
            value=engine.finals_lag_s,
        )
        yield CounterMetricFamily(
            "asr_engine_overload_refusals",
            "calls and OPTIONS refused (503) while the engine was behind real time or behind on finals",
            value=engine.overload_refusals,
        )
        yield GaugeMetricFamily(
            "asr_engine_degraded_streams",
            "streams running at a longer chunk than their route's because the engine fell behind (surge)",
            value=engine.degraded_streams,
        )
        yield CounterMetricFamily(
            "asr_engine_degraded_stream_seconds",
            "stream-seconds spent at a longer chunk than the route's (surge), summed over streams",
            value=engine.degraded_stream_seconds,
        )
        reduced = CounterMetricFamily(
            "asr_engine_reduced_finals",
            "finals searched with a narrower beam and no decoder proposals (surge), by reason: finals_queued "
            "(their batch waited finals_reduce_ms), engine_saturated (behind with every stream at its longest chunk)",
            labels=["reason"],
        )
        for reason, count in sorted(engine.reduced_finals.items()):
            reduced.add_metric([reason], count)
        yield reduced
        yield histogram("asr_engine_batch_size", "streams per batched chunk step", engine.batch_size)
        yield histogram("asr_engine_step_seconds", "time of one batched chunk step (forward)", engine.step_seconds)
        yield histogram(
            "asr_partial_latency_seconds",
            "a chunk's last sample handed to the engine -> its partial produced",
            engine.partial_latency,
        )
        yield histogram("asr_final_latency_seconds", "endpoint -> final produced", engine.final_latency)
        yield CounterMetricFamily(
            "asr_partials_dropped", "partials dropped under backpressure", value=node.partials_dropped
        )
        worker = node.worker
        yield GaugeMetricFamily("asr_worker_queue_depth", "messages waiting for the KB worker", value=worker.depth)
        yield GaugeMetricFamily(
            "asr_worker_queue_peak", "most messages ever waiting for the KB worker at once", value=worker.peak
        )
        yield CounterMetricFamily(
            "asr_worker_queue_over_bound",
            "call messages of the event loop queued past the worker queue's bound (never waited, never dropped)",
            value=worker.over_bound,
        )
        yield CounterMetricFamily(
            "asr_worker_queue_waits",
            "finals and stream ends an engine thread held until the worker queue had room",
            value=worker.waits,
        )

    def _sip_and_rtp(self, node: NodeFigures) -> Iterator[Any]:
        responses = CounterMetricFamily("asr_sip_responses", "SIP responses sent", labels=["code"])
        sip_events = CounterMetricFamily("asr_sip_events", "SIP core counters", labels=["event"])
        for key, value in sorted(node.sip_counters.items()):
            if key.startswith("responses."):
                responses.add_metric([key.split(".", 1)[1]], value)
            else:
                sip_events.add_metric([key], value)
        yield responses
        yield sip_events
        yield labelled("asr_rtp", "RTP receive counters over all legs", node.rtp_counters.items())

    def _doors(self, doors: Sequence[DoorFigures]) -> Iterator[Any]:
        connections = GaugeMetricFamily("asr_door_connections", "open connections per front door", labels=["door"])
        legs = CounterMetricFamily("asr_door_legs", "legs opened per front door", labels=["door"])
        refusals = CounterMetricFamily(
            "asr_door_refusals", "connections a front door closed for bad input or a limit", labels=["door", "reason"]
        )
        for door in doors:
            connections.add_metric([door.door], door.connections)
            legs.add_metric([door.door], door.legs)
            for reason, count in sorted(door.refusals.items()):
                refusals.add_metric([door.door, reason], count)
        yield connections
        yield legs
        yield refusals

    def _redis(self, redis: RedisFigures) -> Iterator[Any]:
        yield GaugeMetricFamily("asr_redis_connected", "1 while Redis answers", value=int(redis.connected))
        yield GaugeMetricFamily("asr_redis_queue_depth", "events waiting for Redis", value=redis.queue_depth)
        yield GaugeMetricFamily("asr_redis_spool_bytes", "journal bytes not yet acknowledged by Redis",
                                value=redis.spool_bytes)  # fmt: skip
        yield GaugeMetricFamily("asr_redis_spool_max_bytes", "redis.spool_max_bytes", value=redis.spool_max_bytes)
        yield labelled("asr_redis_journal", "spool journal and replay counters", redis.journal.items())
        yield CounterMetricFamily("asr_redis_published", "events published", value=redis.published)
        yield CounterMetricFamily("asr_redis_errors", "Redis errors", value=redis.errors)
        yield histogram(
            "asr_publish_latency_seconds",
            "a chunk's last sample handed to the engine -> its event acknowledged by Redis",
            redis.publish_latency,
        )

    def _config(self, node: NodeFigures) -> Iterator[Any]:
        yield InfoMetricFamily("asr_config", "version (hash) of the routes, KB, tag and hotword files in force",
                               value={"version": node.config_version})  # fmt: skip
        yield GaugeMetricFamily("asr_config_last_reload_success", "1 if the last config load put every file in force",
                                value=int(node.last_reload_ok))  # fmt: skip
        yield GaugeMetricFamily("asr_config_last_reload_timestamp_seconds", "Unix time of the last config load",
                                value=node.last_reload_at_unix)  # fmt: skip
        yield CounterMetricFamily("asr_config_reloads", "config reloads tried (SIGHUP or a file change)",
                                  value=node.reloads)  # fmt: skip
        yield CounterMetricFamily("asr_config_reload_failures", "config reloads that rejected a file",
                                  value=node.reload_failures)  # fmt: skip
        yield CounterMetricFamily(
            "asr_routing_unparsable_sources",
            "calls routed whose source address did not parse (rules on addresses did not match them)",
            value=node.unparsable_sources,
        )


def histogram(name: str, doc: str, source: Histogram) -> HistogramMetricFamily:
    buckets = source.cumulative()
    bounds = [("+Inf" if bound == float("inf") else repr(bound), count) for bound, count in buckets]
    return HistogramMetricFamily(name, doc, buckets=bounds, sum_value=source.sum)


def labelled(name: str, doc: str, values: Iterable[tuple[str, int]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["counter"])
    for key, value in values:
        family.add_metric([key], value)
    return family


def health_app(source: Monitored, metrics: Callable[..., Any]) -> Callable[..., Any]:
    """WSGI app: the probes, and prometheus_client's own exposition under ``/metrics``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics" or path.startswith("/metrics/"):
            result: list[bytes] = metrics(environ, start_response)
            return result
        if path == "/health/live":
            status, body = "200 OK", "live\n"
        elif path in ("/health/ready", "/health"):
            reasons = source.not_ready()
            status = "503 Service Unavailable" if reasons else "200 OK"
            body = f"not ready: {'; '.join(reasons)}\n" if reasons else "ready\n"
        else:
            status, body = "404 Not Found", "not found: /metrics, /health/live, /health/ready\n"
        data = body.encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))])
        return [data]

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


class MetricsServer:
    """Serves ``/metrics`` (prometheus_client) and the health probes on ``host:port``."""

    def __init__(self, source: Monitored, host: str, port: int) -> None:
        self.source = source
        self.host = host
        self.port = port
        self.registry = CollectorRegistry()
        self.registry.register(NodeCollector(source))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Listen and serve in a thread; returns the port (chosen by the OS when configured as 0)."""
        server_class = type("Server", (_ThreadingServer,), {"address_family": _family(self.host)})
        app = health_app(self.source, make_wsgi_app(self.registry))
        self._server = make_server(self.host, self.port, app, server_class, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _family(host: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 address (``::1``, ``::``), else IPv4."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET
