"""``asr-gateway serve``: one process wiring SIP + RTP, the engine and the Redis publisher,
and its lifecycle (start, drain, stop).

Threads: the asyncio loop (uvloop when installed) runs SIP, the RTP legs, the publisher and
the health/metrics HTTP server; the engine runs its scheduler thread; KB matching and tagging
run in the bridge's worker thread. Bounded queues sit between them; the event loop never waits
on one (``bridge_queue``).

Signals: SIGTERM/SIGINT drain (new INVITEs and OPTIONS get 503 and every door refuses new
calls; the calls of every door, counted by ``calls.registry.CallRegistry``, may end on their own
for ``sip.drain_wait_s``, then the rest get BYE within the grace period, their finals are
decoded and published, the spool is flushed); SIGHUP reloads the routes, KB, tag and hotword
files (``reloading``: also when they change, and on ``reload`` from the console, see
``heartbeat``); SIGUSR2 logs a memory report (``memory_report``).

The service's other jobs live beside it: ``readiness`` (the reasons of ``/health/ready``),
``rtp_totals`` (RTP counters over all legs) and ``metrics``, which declares the figures it
shows (``NodeFigures``, filled in by ``Service.figures``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from asr_common.audio import SAMPLE_RATE, TELEPHONE_RATE, PcmSink
from asr_common.draining import wait_while_progressing
from asr_common.yamlconf import ConfigError
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions, resolve_dtype
from asr_core.model.bundled import is_demo_model
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_gateway.bridge import CallBridge, stream_config
from asr_gateway.config import ServiceConfig
from asr_gateway.doors import Doors
from asr_gateway.heartbeat import Heartbeat, default_node_id
from asr_gateway.hotwords import HotwordLists
from asr_gateway.memory_report import log_memory_report
from asr_gateway.metrics import (
    JOURNAL_COUNTERS,
    EngineFigures,
    MetricsServer,
    NodeFigures,
    RedisFigures,
    WorkerFigures,
)
from asr_gateway.readiness import NodeState, not_ready
from asr_gateway.reloading import ConfigReloader, routes_hash
from asr_gateway.rtp_totals import CountedRtpLeg, RtpTotals
from calls.registry import CallRegistry
from calls.routing import Router, load_routes
from kb_hooks.features import FEATURES
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.publisher import Publisher
from rtp.leg import RtpLeg
from rtp.poller import FastReceiver
from rtp.ports import PortAllocator
from sip.transport import SipServer

log = logging.getLogger(__name__)

DEMO_MODEL_DIR = Path(__file__).resolve().parents[1] / "asr_core" / "demo_model"
# A stopping node waits for its engine, finalizer and KB worker to finish the work already
# accepted, without a total deadline; it gives up on one that did nothing for this long (s).
DRAIN_STALL_S = 30.0


def model_dir_of(config: ServiceConfig) -> Path:
    """The configured model, else the bundled demo model."""
    if config.engine.model_dir is not None:
        return config.engine.model_dir
    if (DEMO_MODEL_DIR / "final.pt").is_file():
        return DEMO_MODEL_DIR
    raise ConfigError(["engine.model_dir is not set and the bundled demo model is missing; point it at a WeNet model"])


def engine_options(config: ServiceConfig) -> EngineOptions:
    engine = config.engine
    rules = engine.endpoint
    on_gpu = engine.device.startswith("cuda")
    return EngineOptions(
        max_streams=engine.max_streams,
        max_batch=engine.max_batch,
        max_wait_ms=engine.max_wait_ms,
        allowed_chunk_ms=tuple(engine.allowed_chunk_ms),
        max_left_chunks=engine.left_chunks,
        beam=engine.beam,
        ctc_weight=engine.ctc_weight,
        reverse_weight=engine.reverse_weight,
        attention_beam=engine.attention_beam,
        endpoint=EndpointRules(
            rules.blank_threshold,
            rules.trailing_silence_ms,
            rules.leading_silence_ms,
            rules.max_utterance_ms,
            rules.energy_gate_db,
            rules.check_every_frame,
        ),
        device=engine.device,
        dtype=resolve_dtype(engine.dtype, engine.device) if on_gpu or engine.dtype == "bfloat16" else torch.float32,
        backend=engine.resolved_backend,
        finalizer=engine.finalizer,
        traced_step=engine.traced_step,
        traced_rescoring=engine.traced_rescoring,
        step_threads=engine.step_threads,
        schedulers=engine.resolved_schedulers,
        finals_niceness=engine.finals_niceness,
        finals_behind_ms=engine.finals_behind_ms,
        finals_workers=engine.resolved_finals_workers,
        surge=engine.surge.settings(),
    )


def check_profiles(router: Router, config: ServiceConfig, where: str) -> list[str]:
    """Profiles must ask only for what the engine was sized for."""
    problems = []
    for name, profile in router.routes.profiles.items():
        if profile.chunk_ms not in config.engine.allowed_chunk_ms:
            problems.append(
                f"{where}: profile {name!r} chunk_ms {profile.chunk_ms} is not in engine.allowed_chunk_ms "
                f"{config.engine.allowed_chunk_ms}"
            )
        if profile.left_chunks > config.engine.left_chunks:
            problems.append(
                f"{where}: profile {name!r} left_chunks {profile.left_chunks} exceeds engine.left_chunks "
                f"{config.engine.left_chunks} (the cache pool's window)"
            )
        unknown_files = FEATURES.route_problems(profile.model_dump(), config.kb_hooks)  # kb_set, tag_rules ...
        problems += [f"{where}: profile {name!r} {problem}" for problem in unknown_files]
    return problems


def hotword_names(router: Router) -> list[str]:
    """The phrase files the profiles name."""
    return [p.hotwords for p in router.routes.profiles.values() if p.hotwords is not None]


def load_router(config: ServiceConfig) -> Router:
    router = load_routes(config.routes) if config.routes is not None else Router()
    problems = check_profiles(router, config, str(config.routes or "default routes"))
    if problems:
        raise ConfigError(problems)
    return router


@dataclass
class Ports:
    """Where the service actually listens (ports may be chosen by the OS when configured as 0)."""

    sip_udp: int | None
    sip_tcp: int | None
    metrics: int | None


class Service:
    """The running gateway. ``await start()``, ``await run_until_stopped()`` or ``await stop()``."""

    def __init__(self, config: ServiceConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        if config.engine.resolved_threads > 0:
            torch.set_num_threads(config.engine.resolved_threads)
        self.loaded = loaded or load_wenet_model(model_dir_of(config))
        routes_in_force = routes_hash(config)
        self.router = load_router(config)
        base = config.routes.parent if config.routes is not None else Path()
        self.hotwords = HotwordLists(self.loaded.units, base)
        problems = self.hotwords.sync(hotword_names(self.router))
        if problems:
            raise ConfigError(problems)
        if self.loaded.sample_rate not in (TELEPHONE_RATE, SAMPLE_RATE):
            raise ConfigError(
                [f"model {model_dir_of(config)}: front end at {self.loaded.sample_rate} Hz; calls can feed only "
                 f"{TELEPHONE_RATE} Hz (G.711 as is) or {SAMPLE_RATE} Hz (upsampled) models"]
            )  # fmt: skip
        self.processor = TranscriptProcessor.from_settings(config.kb_hooks)
        self.engine = Engine(self.loaded, engine_options(config))
        self.publisher = Publisher(config.redis)
        self.bridge = CallBridge(
            self.engine, self.processor, self.publisher, config.kb_hooks.default_redaction, hotwords=self.hotwords
        )
        rtp = config.rtp
        self.ports_allocator = PortAllocator(rtp.host, rtp.port_min, rtp.port_max)
        max_calls_by_engine = min(config.sip.max_calls, config.engine.max_streams)
        sip_settings = config.sip.model_copy(update={"max_calls": max_calls_by_engine})
        # Every door's calls, counted in one place: drain, readiness, the node's call limit,
        # metrics and the heartbeat read it. The doors hand their calls to it, it to the bridge.
        self.calls = CallRegistry(self.bridge, max_calls_by_engine)
        self.rtp_totals = RtpTotals()
        self.sip = SipServer(
            sip_settings, self.calls, self.ports_allocator, self.router, leg_factory=self._rtp_leg, media_host=None
        )
        self.doors = Doors(config, self.calls, self.bridge, lambda: self.router, self.loaded.sample_rate)
        self.metrics = MetricsServer(self, config.metrics.host, config.metrics.port)
        self.reloader = ConfigReloader(config, self.processor, self.hotwords, self._reload_routes, routes_in_force)
        self._stopping = asyncio.Event()
        self.started_at = 0.0
        self.warm = False  # the engine has run its warm-up and its threads are started
        self.sip_listening = False
        self.heartbeat: Heartbeat | None = None

    def _rtp_leg(self, sink: PcmSink, payload_types: dict[int, str], on_end: Callable[[str], None]) -> RtpLeg:
        sip = self.config.sip
        return CountedRtpLeg(
            self.rtp_totals,
            sink=sink,
            payload_types=payload_types,
            reorder_ms=sip.rtp_reorder_ms,
            inactivity_timeout_s=sip.rtp_inactivity_timeout_s,
            on_end=on_end,
            resample_batch_ms=self.config.rtp.resample_batch_ms,
            poll_interval_ms=self.config.rtp.poll_interval_ms,
            # a model with an 8 kHz front end takes the G.711 audio as it is
            resampler="none" if self.engine.sample_rate == TELEPHONE_RATE else self.config.rtp.resampler,
            fast_path=self.config.rtp.c_receive_path,
            latch=self.config.rtp.latch,
        )

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> Ports:
        self.started_at = time.monotonic()
        await self.publisher.start()
        self.bridge.start()
        # Before SIP listens: the first calls' chunks must not wait for one-time set-up.
        # Each profile's chunk sizes under load too (``Engine.ladder``), so that a surge does not
        # start with tracing graphs.
        profiles = self.router.routes.profiles.values()
        shapes = sorted({shape for p in profiles for shape in self.engine.ladder(stream_config(p))})
        warm_s = await asyncio.get_running_loop().run_in_executor(None, self.engine.warm_up, shapes)
        log.info("engine warmed up in %.1f s", warm_s)
        self.engine.start()
        self.warm = True
        await self.sip.start()
        await self.doors.start()
        self.sip_listening = True
        metrics_port = self.metrics.start() if self.config.metrics.enabled else None
        for warning in self.config.metrics.open_settings():
            log.warning("open setting: %s", warning)
        self.reloader.start()
        transports = self.config.sip.transports
        ports = Ports(
            sip_udp=self.sip.port("udp") if "udp" in transports else None,
            sip_tcp=self.sip.port("tcp") if "tcp" in transports else None,
            metrics=metrics_port,
        )
        redis = self.config.redis
        node_id = default_node_id(ports.sip_udp or ports.sip_tcp)
        self.heartbeat = Heartbeat(redis.url, redis.key_prefix, node_id, self.node_report, self.reloader.reload)
        self.heartbeat.start()
        log.info(
            "hotline-asr serving: sip udp %s tcp %s, metrics %s, engine %d slots (%.1f MB kv), model %s, backend %s, "
            "rtp receive path %s",
            ports.sip_udp,
            ports.sip_tcp,
            ports.metrics,
            self.engine.pool.num_slots,
            self.engine.pool.total_bytes / 2**20,
            self.loaded.config.encoder,
            self.engine.options.backend,
            "c" if FastReceiver is not None and self.config.rtp.c_receive_path else "python",
        )
        return ports

    def request_stop(self) -> None:
        """Start draining now: OPTIONS, new INVITEs, every door's new calls and /health/ready are
        refused from this moment."""
        self.calls.set_draining()
        self.sip.set_draining()
        self.doors.set_draining()
        self._stopping.set()

    async def run_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.reloader.reload)
        loop.add_signal_handler(signal.SIGUSR2, log_memory_report)
        await self._stopping.wait()
        await self.wait_for_calls()
        await self.stop()

    async def wait_for_calls(self) -> None:
        """Draining: let the calls of every door end on their own for up to ``sip.drain_wait_s``, and
        keep answering OPTIONS 503 for at least ``sip.drain_linger_s`` of it, so a dispatcher sees
        the node leave."""
        settings = self.config.sip
        start = time.monotonic()
        linger_s = min(settings.drain_linger_s, settings.drain_wait_s)
        if settings.drain_wait_s > 0:
            log.info("draining: waiting up to %.0f s for %d calls (%s) to end", settings.drain_wait_s,
                     self.calls.active, self._calls_by_source())  # fmt: skip
        while time.monotonic() - start < settings.drain_wait_s:
            if not self.calls.active and time.monotonic() - start >= linger_s:
                break
            await asyncio.sleep(0.1)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Drain: refuse new calls, BYE active ones (they get ``grace_s`` to end), decode the
        audio already received however far behind real time the engine is, publish every
        final and call.ended, flush Redis (what it does not take within ``grace_s`` stays in
        the spool for the next start)."""
        log.info("draining: %d active calls (%s)", self.calls.active, self._calls_by_source())
        self.reloader.stop()
        self._stopping.set()  # not ready from now on (request_stop may not have come first)
        self.calls.set_draining()
        self.sip_listening = False
        await self.doors.stop()
        await self.sip.stop(grace_s)
        await asyncio.to_thread(self._finish_decoding)
        await asyncio.to_thread(self.engine.stop, DRAIN_STALL_S)
        await asyncio.to_thread(self.bridge.stop, DRAIN_STALL_S)
        await self.publisher.stop(flush_timeout_s=grace_s)
        if self.heartbeat is not None:
            await self.heartbeat.stop()
        self.metrics.stop()
        log.info("stopped")

    def _finish_decoding(self) -> None:
        """Every stream's input has ended (SIP has stopped): wait until the engine has decoded
        all of it, as long as it keeps moving, so that a slow machine loses no final."""
        engine, stats = self.engine, self.engine.stats
        behind = engine.active_streams
        started = time.monotonic()
        if not wait_while_progressing(
            lambda: engine.active_streams == 0,
            lambda: (stats.chunks, stats.errors, engine.active_streams),
            DRAIN_STALL_S,
        ):
            log.error("engine decoded nothing for %.0f s with %d streams open; they end with what was decoded",
                      DRAIN_STALL_S, engine.active_streams)  # fmt: skip
        elif behind:
            log.info("decoded the last audio of %d streams in %.1f s", behind, time.monotonic() - started)

    def _calls_by_source(self) -> str:
        """The doors' calls in progress for a log line: ``sip 2, websocket 1`` (``none``: no call)."""
        return ", ".join(f"{door} {n}" for door, n in self.calls.by_source().items() if n) or "none"

    # -- health -----------------------------------------------------------------------

    def not_ready(self) -> list[str]:
        """Why this node should get no new call now (empty: ready): ``/health/ready``."""
        return not_ready(
            NodeState(
                draining=self._stopping.is_set(),
                sip_listening=self.sip_listening,
                engine_warm=self.warm,
                engine_slots=self.engine.pool.num_slots,
                free_engine_slots=self.engine.free_slots,
                active_calls=self.calls.active,
                max_calls=self.calls.max_calls,
                redis_connected=self.publisher.connected,
                spool_pending_bytes=self.publisher.spool_pending_bytes(),
                spool_max_bytes=self.config.redis.spool_max_bytes,
            )
        )

    def figures(self) -> NodeFigures:
        """What ``/metrics`` shows, read from the components now."""
        engine, stats, publisher = self.engine, self.engine.stats, self.publisher
        last = self.reloader.last_reload
        return NodeFigures(
            healthy=not self.not_ready(),
            active_calls=self.calls.active,
            calls_by_source=self.calls.by_source(),
            partials_dropped=publisher.partials_dropped + self.bridge.partials_dropped,
            worker=WorkerFigures(
                depth=len(self.bridge.queue),
                peak=self.bridge.queue.peak,
                over_bound=self.bridge.queue.over_bound,
                waits=self.bridge.queue.waited,
            ),
            engine=EngineFigures(
                streams=engine.active_streams,
                slots=engine.pool.num_slots,
                used_slots=engine.pool.used_slots,
                pool_bytes=engine.pool.total_bytes,
                chunks=stats.chunks,
                batches=stats.batches,
                finals=stats.finals,
                errors=stats.errors,
                behind_realtime_chunks=stats.behind_realtime_chunks,
                endpoints_inside_chunks=stats.endpoints_inside_chunks,
                lag_s=engine.lag_ms / 1e3,
                finals_lag_s=engine.finals_lag_ms / 1e3,
                overload_refusals=self.bridge.overload_refusals,
                degraded_streams=engine.degraded_streams,
                degraded_stream_seconds=stats.degraded_stream_seconds,
                reduced_finals={reason.value: count for reason, count in stats.reduced_finals_by_reason.items()},
                batch_size=stats.batch_size_histogram,
                step_seconds=stats.step_seconds,
                partial_latency=stats.partial_latency_seconds,
                final_latency=stats.final_latency_seconds,
            ),
            redis=RedisFigures(
                connected=publisher.connected,
                queue_depth=publisher.queued(),
                spool_bytes=publisher.spool_pending_bytes(),
                spool_max_bytes=self.config.redis.spool_max_bytes,
                journal={name: getattr(publisher, name) for name in JOURNAL_COUNTERS},
                published=publisher.published,
                errors=publisher.redis_errors,
                publish_latency=publisher.audio_to_ack_histogram,
            ),
            sip_counters=self.sip.counters,
            rtp_counters=self.rtp_totals.snapshot(),
            doors=self.doors.stats(),
            config_version=self.reloader.config_version,
            last_reload_ok=last.ok,
            last_reload_at_unix=last.at_unix,
            reloads=self.reloader.reloads,
            reload_failures=self.reloader.reload_failures,
            unparsable_sources=self.router.unparsable_sources,
        )

    # -- reload -----------------------------------------------------------------------

    def _reload_routes(self) -> None:
        """Load the routes file and put it in force; ``ConfigError`` leaves the previous routes."""
        router = load_router(self.config)
        problems = self.hotwords.sync(hotword_names(router))
        if problems:
            raise ConfigError(problems)
        router.unparsable_sources += self.router.unparsable_sources  # a counter, carried over reloads
        self.sip.core.router = router
        self.router = router

    def node_report(self) -> dict[str, object]:
        """What the heartbeat tells the console: the version in force, the last reload, the load
        (every door's calls, in all and by door; the engine's streams and those of them slowed
        down to longer chunks by surge) and the model it serves (``demo``: the bundled
        synthetic-voices model, which the console's Speak page warns of)."""
        last = self.reloader.last_reload
        model_dir = model_dir_of(self.config)
        return {
            "config_version": self.reloader.config_version,
            "model": {"dir": str(model_dir), "demo": is_demo_model(model_dir)},
            "last_reload": {"at": last.at_unix, "ok": last.ok, "errors": list(last.errors)},
            "active_calls": self.calls.active,
            "active_calls_by_source": dict(self.calls.by_source()),
            "engine_streams": self.engine.active_streams,
            "degraded_streams": self.engine.degraded_streams,
        }


def run_service(config: ServiceConfig) -> int:
    """Blocking entry point of ``asr-gateway serve``."""

    async def main() -> None:
        service = Service(config)
        await service.start()
        # What is alive after start-up (torch, the model, config: ~400k objects) lives as long
        # as the process; left in the collector, every full collection would traverse it again
        # and stall the event loop (~110 ms measured) while the RTP legs' packets queue up.
        gc.collect()
        gc.freeze()
        try:
            await service.run_until_stopped()
        finally:
            gc.unfreeze()  # let interpreter shutdown collect them normally

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a Linux dependency
        asyncio.run(main())
    else:
        uvloop.run(main())
    return 0
