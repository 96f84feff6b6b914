"""``asr-bench e2e``: real sipp calls through the whole service; prints one JSON object.

N concurrent calls (half PCMU, half PCMA, started over about a second) each stream S seconds
of the bundled hotline recordings over RTP into the service (in this process), which
publishes to Redis (``--redis`` or a throwaway local redis-server); a subscriber in this
process times every event.

- ``partial_latency_ms``: a chunk's last sample handed from RTP to the engine -> the partial
  delivered by Redis pub/sub (>= the publisher's Redis ack; ``publish_ack_latency_ms`` is
  that ack for all events, from ``Publisher.audio_to_ack_s``).
- ``first_partial_latency_ms``: call.started -> the call's first partial.
- ``final_latency_ms``: the engine's endpoint (or hang-up) -> final decoded (rescoring included).
- ``realtime_ok``: every call completed, at most 1 % of chunks were behind real time, and
  the finals kept up (``finals_ok``: final latency p95 <= 2 s, the engine bench's rule).
- ``rss_mb``, ``cpu_percent``, ``cores_used`` (CPU seconds per wall second): this process
  (service + subscriber) during the calls; the CPU includes the engine's finals process
  (``engine.finalizer: process``), the RSS does not.
- ``cores_by_thread``: the same CPU per wall second by thread (Linux): the engine's scheduler
  threads (``asr-engine-N``), the event loop (``MainThread``: SIP, RTP, the publisher), the
  KB/tags worker (``kb-hooks``), the finals processes (together), and ``other`` (threads without a Python
  name: torch's intra-op pool, executor threads). Shows which thread is at 100 % when the service
  falls behind.
- ``--steady K``: arrivals as a call center sees them instead of all calls within seconds of
  each other: calls start evenly over one call's length, each that ends is replaced,
  ``calls * (K + 1)`` in all, so from the first hang-up on ``calls`` are up at once with their
  sentence ends and hang-ups spread out. The latencies and ``behind_realtime_fraction`` then
  cover only that steady stretch, from the first hang-up to the last call's start as the SIP
  layer counted them (``steady_window_s``; not from the events, whose ``call.ended`` waits for
  the call's last final), and so do the CPU figures (``cpu_percent``, ``cores_used``,
  ``machine_cores_busy``, ``cores_by_thread``): the ramp up and down, with fewer calls up,
  would make the cores per call look fewer. ``whole_run`` then has ``cores_used`` and
  ``machine_cores_busy`` over the whole run, ramp included.
- ``cpu_window``: what the CPU figures cover: ``steady`` (the steady stretch) or ``whole run``
  (without ``--steady``, or when the run had no steady stretch).
- ``machine_cores_busy``: CPU seconds per wall second of the whole machine (Linux
  ``/proc/stat``), of ``machine_cores``: the load generators (sipp, redis-server) run on the
  same machine, so the service alone cannot reach ``machine_cores``.
- ``--service-cpus LIST`` / ``--generator-cpus LIST`` (``taskset -c`` lists, e.g. ``1`` and
  ``0``): the service (this process, its threads and finals processes) and the load generators
  (sipp, the local redis-server) on disjoint cores. ``service_cpus`` / ``generator_cpus``: the
  cores given (``service_cpus`` without the option: all this process may use);
  ``cpus_seen``: the cores each side's threads were found allowed during the run (``/proc``);
  ``service_core_share``: ``cores_used`` / len(``service_cpus``), the share of its cores the
  service used; ``service_cores_busy``: how busy those cores were, whoever used them (the
  kernel's work on them included; ``/proc/stat``); ``service_cores_busy_when_full``: the same
  over the ``full_s`` seconds the engine had no room for another call (behind on its chunks or
  its finals, ``Engine.overloaded``; ``--steady`` only; >= 0.9 expected). The steady stretch
  may hold less: a node that refused calls while its finals caught up then runs under capacity
  for a while.
- ``calls_placed``, ``calls_started`` (call.started seen), ``calls_refused``: calls whose INVITE
  an error response answered (sipp's error file; a full node answers 503, counted by the service
  in ``overload_refusals``, which counts refused OPTIONS probes too), ``refused_statuses``.
- ``finals_missing``: admitted calls that ended (or never ended) without their last final (none
  reaching into the call's last sentence); ``calls_finals_delivered``: the others.
- ``--surge``: ``engine.surge.enabled: true`` (the demo route's streams may move up to 640 ms
  chunks); ``degraded_streams_peak`` (streams at a longer chunk than their route's, sampled each
  second), ``degraded_stream_seconds``, ``chunk_moves`` ([up, down]), ``reduced_finals``
  (finals searched the cheaper way) and ``reduced_finals_saturated`` (those of them reduced
  because the engine was saturated, not because they queued) come from the engine's stats, with
  or without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr_common import allocator
from asr_core import memtrim
from asr_core.audio_io import read_wav
from asr_core.engine import Engine
from asr_core.surge import FinalsReduction
from asr_gateway.dev.demo import (
    DATA_DIR,
    DemoError,
    EventCollector,
    check_model_dir,
    default_model_dir,
    demo_config,
    load_references,
)
from asr_gateway.dev.local_redis import LocalRedis, LocalRedisError, redis_reachable
from asr_gateway.dev.sipp_calls import HANGUP_AFTER_AUDIO_S, PCMA, PCMU, CallResult, place_calls
from asr_gateway.service import Service
from deploy.bench import affinity
from deploy.bench.e2e_cpu import bracket, cores_busy_when_full, cpu_figures, sample_every, steady_window, take_sample
from deploy.bench.e2e_events import calls_admitted, finals_missing, measure, quantiles
from deploy.bench.engine_bench import FINAL_LATENCY_LIMIT_MS
from kb_hooks.events import Event

GAP_S = 1.0  # between sentences: longer than the 800 ms endpoint rule, so each sentence is an utterance
GAP_NOISE_RMS = 30.0  # int16 units: about -60 dBFS
RECORDINGS = ("hotline_seed", "hotline_1", "hotline_2")


def call_sentences(seconds: float, data_dir: Path = DATA_DIR) -> list[tuple[np.ndarray, str]]:
    """The bundled sentences a call of ``seconds`` speaks, in order: (16 kHz samples, reference
    text) each; each is followed by a pause of ``GAP_S`` (``call_audio``)."""
    references = load_references(data_dir)
    sentences: list[tuple[np.ndarray, str]] = []
    total = 0
    while total < seconds * 16000:
        name = RECORDINGS[len(sentences) % len(RECORDINGS)]
        samples = read_wav(data_dir / f"{name}.wav").samples
        sentences.append((samples, references[name]))
        total += samples.shape[0] + int(GAP_S * 16000)
    return sentences


def call_audio(seconds: float, data_dir: Path = DATA_DIR) -> tuple[np.ndarray, str]:
    """Whole bundled sentences with pauses until ``seconds``; (16 kHz samples, reference text).

    The pauses hold a line's idle noise (``GAP_NOISE_RMS``), not digital zeros, which no phone
    line without silence suppression delivers."""
    rng = np.random.default_rng(0)
    pieces: list[np.ndarray] = []
    texts: list[str] = []
    for samples, text in call_sentences(seconds, data_dir):
        pieces += [samples, rng.normal(0.0, GAP_NOISE_RMS, int(GAP_S * 16000)).astype(np.float32)]
        texts.append(text)
    return np.concatenate(pieces), "".join(texts)


def last_sentence_middle_ms(seconds: float, data_dir: Path = DATA_DIR) -> float:
    """The middle of a call's last sentence, in ms from the start of its audio: a call's last
    final reaches past it (``finals_missing``), however much silence its ends are trimmed by."""
    lengths = [samples.shape[0] for samples, _ in call_sentences(seconds, data_dir)]
    start = sum(lengths[:-1]) + (len(lengths) - 1) * int(GAP_S * 16000)  # samples
    return (start + lengths[-1] / 2) / 16.0


def rss_mb() -> float:
    return memtrim.rss_mb() or round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def record_audio_ends(service: Service) -> dict[str, float]:
    """event_id -> the ``time.monotonic()`` its audio was handed to the engine (from the publisher's intake)."""
    audio_end: dict[str, float] = {}
    submit = service.publisher.submit

    def recording(event: Event, *, audio_end_monotonic: float | None = None) -> None:
        if audio_end_monotonic is not None:
            audio_end[event.event_id] = audio_end_monotonic
        submit(event, audio_end_monotonic=audio_end_monotonic)

    service.publisher.submit = recording  # type: ignore[method-assign]
    return audio_end


class Peaks:
    """What the run's once-a-second sampling kept: peak RSS, peak degraded streams and the
    cores the service's and the generators' processes were allowed (``affinity.cpus_seen``)."""

    def __init__(self) -> None:
        self.rss_mb = rss_mb()
        self.degraded_streams = 0
        self.cpus: dict[str, set[int]] = {"service": set(), "generators": set()}

    def take(self, engine: Engine) -> None:
        self.rss_mb = max(self.rss_mb, rss_mb())
        self.degraded_streams = max(self.degraded_streams, engine.degraded_streams)
        for side, cpus in affinity.cpus_seen().items():
            self.cpus[side] |= cpus

    async def every_second(self, engine: Engine) -> None:
        """``take`` each second until cancelled."""
        while True:
            await asyncio.sleep(1.0)
            self.take(engine)


async def run_bench(
    model_dir: Path, redis_url: str, workdir: Path, calls: int, seconds: float, rate_per_s: float = 20.0,
    steady_cycles: int = 0, generator_cpus: frozenset[int] | None = None, **engine: Any,
) -> dict[str, Any]:  # fmt: skip
    """``engine``: settings of the config's engine section other than the service defaults;
    ``steady_cycles`` > 0: steady arrivals (``--steady``); ``generator_cpus``: sipp's cores."""
    pcm, reference = call_audio(seconds)
    if steady_cycles > 0:
        rate_per_s = calls / (pcm.shape[0] / 16000 + HANGUP_AFTER_AUDIO_S)  # one call's length
    # Steady arrivals: a replacement call may arrive before the call it replaces has released
    # its slot (its final still being searched), so the pool is not the limit being measured.
    slots = calls + 2 if steady_cycles == 0 else 2 * calls
    config = demo_config(redis_url, model_dir, workdir, max_streams=slots, **engine)
    service = Service(config)
    audio_end = record_audio_ends(service)
    ports = await service.start()
    assert ports.sip_udp is not None
    sip_port = ports.sip_udp
    collector = EventCollector(redis_url)
    await collector.start()
    run_id = f"{os.getpid()}{random.randrange(10**6):06d}"
    groups = [(f"u{run_id}", PCMU, (calls + 1) // 2), (f"a{run_id}", PCMA, calls // 2)]
    placed_per_call = steady_cycles + 1
    before = take_sample(service)
    peaks = Peaks()
    results: list[CallResult] = []
    sampler = asyncio.create_task(peaks.every_second(service.engine))
    steady_sampler: asyncio.Task[None] | None = None
    samples = [before]  # steady: and one every 0.25 s
    try:
        placed = [
            place_calls(
                workdir / tag,
                sip_port,
                pcm,
                16000,
                n,
                payload_type=pt,
                call_tag=tag,
                total=n * placed_per_call,
                rate_per_s=rate_per_s * n / calls if steady_cycles > 0 else rate_per_s,  # steady: shared evenly
                cpus=generator_cpus,
            )
            for tag, pt, n in groups
            if n
        ]
        steady_sampler = asyncio.create_task(sample_every(service, samples)) if steady_cycles > 0 else None
        results = list(await asyncio.gather(*placed))
        after = take_sample(service)
        tags = [tag for tag, _, count in groups if count]
        refused = [status for r in results for status in r.rejected.values()]
        # a refused call never started, so it never ends
        ended_ok = await wait_for_ended(collector, tags, calls * placed_per_call - len(refused), 30.0)
    finally:
        sampler.cancel()
        if steady_sampler is not None:
            steady_sampler.cancel()
        await service.stop(grace_s=10)
        await collector.stop()
    stats = service.engine.stats
    behind_chunks, chunks = stats.behind_realtime_chunks, stats.chunks
    service_cpus = sorted(os.sched_getaffinity(0))
    cpu = whole_run = cpu_figures(before, after, service_cpus)
    window = steady_window(samples) if steady_cycles > 0 else None
    if window is not None:  # the steady stretch only
        start, end = bracket(samples, window)
        behind_chunks, chunks = end.behind_chunks - start.behind_chunks, end.chunks - start.chunks
        cpu = cpu_figures(start, end, service_cpus)
    if steady_cycles > 0:
        kept = ("cores_used", "machine_cores_busy", "service_cores_busy")
        cpu = {**cpu, "whole_run": {key: whole_run[key] for key in kept}}
    behind = behind_chunks / max(1, chunks)
    busy_when_full, full_s = cores_busy_when_full(samples, service_cpus)
    measured = measure(collector.received, audio_end, reference, window)
    window_final_ms = measured.pop("final_ms")
    final_ms = window_final_ms if window is not None else list(stats.final_latency_ms)
    finals_ok = bool(final_ms) and float(np.percentile(final_ms, 95)) <= FINAL_LATENCY_LIMIT_MS
    admitted = calls_admitted(collector.received)
    missing = finals_missing(collector.received, admitted, last_sentence_middle_ms(seconds))
    return {
        "calls": calls,
        "seconds": round(pcm.shape[0] / 16000, 1),
        "model": str(model_dir),
        "realtime_ok": all(r.returncode == 0 for r in results)
        and ended_ok
        and behind <= 0.01
        and finals_ok
        and (steady_cycles == 0 or window is not None),
        "finals_ok": finals_ok,
        "steady_window_s": round(window[1] - window[0], 1) if window is not None else None,
        "calls_failed": [r.errors[-300:] for r in results if r.returncode != 0],
        "calls_placed": calls * placed_per_call,
        "calls_started": len(admitted),
        "calls_refused": len(refused),
        "refused_statuses": {str(status): refused.count(status) for status in sorted(set(refused))},
        "calls_ended": measured.pop("calls_ended"),
        "finals_missing": missing,
        "calls_finals_delivered": len(admitted) - missing,
        "behind_realtime_fraction": round(behind, 4),
        **measured,
        "final_latency_ms": quantiles(final_ms),
        "publish_ack_latency_ms": quantiles([s * 1000 for s in service.publisher.audio_to_ack_s], (0.5, 0.95, 0.99)),
        "mean_batch_size": round(float(np.mean(stats.batch_sizes.values())), 2) if stats.batch_sizes else None,
        "partials_dropped": service.publisher.partials_dropped + service.bridge.partials_dropped,
        "surge": service.engine.options.surge is not None,
        "degraded_streams_peak": peaks.degraded_streams,
        "degraded_stream_seconds": round(stats.degraded_stream_seconds, 1),
        "chunk_moves": [stats.chunk_moves_up, stats.chunk_moves_down],
        "reduced_finals": stats.reduced_finals,
        "reduced_finals_saturated": stats.reduced_finals_by_reason[FinalsReduction.ENGINE_SATURATED],
        "rss_mb": peaks.rss_mb,
        "cpu_window": "steady" if window is not None else "whole run",
        **cpu,
        "service_cpus": service_cpus,
        "generator_cpus": sorted(generator_cpus) if generator_cpus is not None else None,
        "cpus_seen": {side: sorted(cpus) for side, cpus in peaks.cpus.items()},
        "service_core_share": round(cpu["cores_used"] / len(service_cpus), 3),
        "service_cores_busy_when_full": busy_when_full,
        "full_s": full_s,
        "machine_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "allocator": allocator.describe(),
        "schedulers": len(service.engine.schedulers),
        "finals_niceness": service.engine.options.finals_niceness,
        "finals_workers": service.engine.options.finals_workers,
        "overload_refusals": service.bridge.overload_refusals,
    }


async def wait_for_ended(collector: EventCollector, tags: list[str], calls: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ended = [cid for cid in collector.ended_calls() if any(cid.startswith(tag + "-") for tag in tags)]
        if len(ended) >= calls:
            return True
        await asyncio.sleep(0.2)
    return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=4, help="concurrent calls (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0, help="audio per call in s (default: %(default)s)")
    parser.add_argument("--model", type=Path, help="WeNet model directory (default: the bundled demo model)")
    parser.add_argument(
        "--redis",
        default=os.environ.get("ASR_REDIS_URL"),
        help="Redis URL (default: $ASR_REDIS_URL if it answers, else a local redis-server)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument(
        "--attention-beam", type=int, help="engine.attention_beam (default: the service's); 0 = WeNet's rescoring"
    )
    parser.add_argument(
        "--eager-step",
        action="store_true",
        help="engine.traced_step: false (the chunk step in eager PyTorch, for A/B against the default)",
    )
    parser.add_argument(
        "--eager-rescoring",
        action="store_true",
        help="engine.traced_rescoring: false (the finals' rescoring decoder in eager PyTorch, for A/B)",
    )
    parser.add_argument("--step-threads", type=int, help="engine.step_threads (default: the service's)")
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        help="engine.max_wait_ms, how long a batch waits for more streams (default: the service's)",
    )
    parser.add_argument(
        "--schedulers", type=int, help="engine.schedulers (default: the service's, 0 = one per usable core)"
    )
    parser.add_argument(
        "--steady",
        type=int,
        default=0,
        metavar="K",
        help="steady arrivals: calls start evenly over one call's length and each that ends is replaced, "
        "calls x (K + 1) in all; latencies and CPU over the steady stretch only (default 0: all calls at once)",
    )
    parser.add_argument(
        "--finals-workers", type=int, help="engine.finals_workers (default: the service's); 0 = one per usable core"
    )
    parser.add_argument(
        "--finals-niceness", type=int, help="engine.finals_niceness (default: the service's); 0 = the engine's priority"
    )
    parser.add_argument(
        "--surge",
        action="store_true",
        help="engine.surge.enabled: true (streams move to longer chunks while the engine is behind; admission "
        "follows the measured cost at the longest chunks)",
    )
    parser.add_argument(
        "--service-cpus",
        type=affinity.cpu_list,
        metavar="LIST",
        help="run the service (this process, its threads, the finals processes) on these cores only, e.g. 1 or 2-7",
    )
    parser.add_argument(
        "--generator-cpus",
        type=affinity.cpu_list,
        metavar="LIST",
        help="run sipp and the local redis-server on these cores only, e.g. 0 (disjoint from --service-cpus)",
    )


def run(args: argparse.Namespace) -> int:
    if args.service_cpus is not None and args.generator_cpus is not None and args.service_cpus & args.generator_cpus:
        shared = affinity.format_cpus(args.service_cpus & args.generator_cpus)
        print(json.dumps({"error": f"--service-cpus and --generator-cpus share cores {shared}: make them disjoint"}))
        return 2
    if args.service_cpus is not None:  # before the engine starts its threads and finals processes: they inherit it
        affinity.pin(0, args.service_cpus)
    if args.threads:
        torch.set_num_threads(args.threads)
    local: LocalRedis | None = None
    with tempfile.TemporaryDirectory(prefix="asr-e2e-bench-") as tmp:
        workdir = Path(tmp)
        try:
            model_dir = args.model or default_model_dir()
            check_model_dir(model_dir)
            redis_url = args.redis
            if not redis_url or not redis_reachable(redis_url):
                local = LocalRedis(workdir / "redis")
                local.start()
                if args.generator_cpus is not None:
                    assert local.process is not None
                    affinity.pin(local.process.pid, args.generator_cpus)
                redis_url = local.url
            engine: dict[str, Any] = {} if args.attention_beam is None else {"attention_beam": args.attention_beam}
            if args.eager_step:
                engine["traced_step"] = False
            if args.eager_rescoring:
                engine["traced_rescoring"] = False
            if args.step_threads is not None:
                engine["step_threads"] = args.step_threads
            if args.schedulers is not None:
                engine["schedulers"] = args.schedulers
            if args.max_wait_ms is not None:
                engine["max_wait_ms"] = args.max_wait_ms
            if args.finals_workers is not None:
                engine["finals_workers"] = args.finals_workers
            if args.finals_niceness is not None:
                engine["finals_niceness"] = args.finals_niceness
            if args.threads:
                engine["threads"] = args.threads  # the service sets it (else its own default with its schedulers)
            if args.surge:
                engine["surge"] = {"enabled": True}
            result = asyncio.run(
                run_bench(
                    model_dir,
                    redis_url,
                    workdir,
                    args.calls,
                    args.seconds,
                    steady_cycles=args.steady,
                    generator_cpus=args.generator_cpus,
                    **engine,
                )
            )
        except (DemoError, LocalRedisError, FileNotFoundError) as exc:
            print(json.dumps({"error": str(exc)}))
            return 2
        finally:
            if local is not None:
                local.stop()
    print(json.dumps(result, ensure_ascii=False))
    return 0 if result["realtime_ok"] else 1
