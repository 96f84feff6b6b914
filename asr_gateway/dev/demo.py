"""``asr-gateway demo``: the whole pipeline once, on this machine, in well under a minute.

It uses ``--redis URL`` (or ``$ASR_REDIS_URL``) when that Redis answers, else starts a
throwaway ``redis-server`` on a free loopback port; starts the service in this process with
the bundled demo model (or ``--model DIR``) on free loopback ports; places real sipp calls
that stream the bundled 8 kHz hotline recordings over RTP (PCMU, PCMA, and one SIPREC call
with a caller and an agent leg); prints the events as ``asr-gateway tail`` would; then
prints a summary (CER of each leg against its known text, first-partial latency, KB
suggestions, tags) and stops everything it started.

The pieces (``local_redis.LocalRedis``, ``demo_config``, ``EventCollector``, ``summarize``) are reused by
the end-to-end benchmark, the soak command and the tests.

``--console`` (``console_demo``) keeps the service up with the console beside it.

Kept as one module (about 460 lines) because it is one command's script whose reusable
pieces are already separate names the benchmarks import; splitting it would scatter that
one sequence over files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from asr_common.scoring import cer
from asr_core.audio_io import read_wav
from asr_core.model.bundled import DEMO_MODEL_NOTICE, is_demo_model
from asr_core.model.loader import MODEL_FILES
from asr_gateway.config import ServiceConfig
from asr_gateway.dev.local_redis import LocalRedis, LocalRedisError, redis_reachable
from asr_gateway.dev.sipp_calls import PCMA, PCMU, CallResult, place_call, sipp_path
from asr_gateway.logs import configure_logging
from asr_gateway.service import DEMO_MODEL_DIR, Service
from kb_hooks.connection import make_client
from kb_hooks.events import EventType
from kb_hooks.keys import firehose_key, live_channel
from kb_hooks.tail import Printer, analytics_line, workorder_line

DATA_DIR = Path(__file__).resolve().parent / "data"
KEY_PREFIX = "asr"
_READ_BLOCK_MS = 200


@dataclass(frozen=True)
class DemoCall:
    """One call the demo places: ``wav`` on the first (caller) leg, ``second_wav`` on a SIPREC agent leg."""

    tag: str
    wav: str
    payload_type: int
    siprec: bool = False
    second_wav: str | None = None

    @property
    def codec(self) -> str:
        return "PCMU" if self.payload_type == PCMU else "PCMA"

    def reference_key(self, role: str) -> str:
        return self.second_wav if role == "agent" and self.second_wav else self.wav


DEMO_CALLS = (
    DemoCall("demo-1", "hotline_seed", PCMU),
    DemoCall("demo-2", "hotline_1", PCMA),
    DemoCall("demo-3", "hotline_seed", PCMA, siprec=True, second_wav="hotline_2"),
)


class DemoError(RuntimeError):
    """Something the demo needs is missing; the message says what to do."""


# -- the service's config ---------------------------------------------------------------


def demo_config(
    redis_url: str, model_dir: Path, workdir: Path, *, max_streams: int = 16, **engine: Any
) -> ServiceConfig:
    """Loopback-only config on free ports, with the bundled routes, KB, tag and analytics rules and streets."""
    rtp_base = random.randrange(42_000, 60_000, 1_000)
    return ServiceConfig.model_validate(
        {
            "sip": {
                "host": "127.0.0.1",
                "port": 0,
                "transports": ["udp"],
                "rtp_inactivity_timeout_s": 20,
                "invite_burst": 1000,
                "invite_rate_per_s": 1000,
                "trusted_cidrs": ["127.0.0.0/8"],  # the demo's callers: one address, many calls
            },
            "rtp": {"host": "127.0.0.1", "port_min": rtp_base, "port_max": rtp_base + 999},
            "engine": {"model_dir": model_dir, "max_streams": max_streams, "max_batch": max_streams, **engine},
            "redis": {"url": redis_url, "spool_dir": workdir / "spool", "key_prefix": KEY_PREFIX},
            "metrics": {"host": "127.0.0.1", "port": 0},
            "routes": DATA_DIR / "routes.yaml",
            "kb_hooks": {
                "kb_sets": {"hotline": DATA_DIR / "kb.yaml"},
                "tag_rule_sets": {"hotline": DATA_DIR / "tags.yaml"},
                "analytics_rule_sets": {"hotline": DATA_DIR / "analytics.yaml"},
                "street_lists": {"hotline": DATA_DIR / "streets.txt"},
            },
        }
    )


def check_model_dir(model_dir: Path) -> None:
    missing = [name for name in MODEL_FILES if not (model_dir / name).is_file()]
    if missing:
        raise DemoError(f"{model_dir}: not a WeNet model directory (lacks {', '.join(missing)}); pass --model DIR")


def default_model_dir() -> Path:
    if (DEMO_MODEL_DIR / "final.pt").is_file():
        return DEMO_MODEL_DIR
    raise DemoError(f"the bundled demo model is missing ({DEMO_MODEL_DIR}); pass --model DIR of a WeNet U2++ model")


# -- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    event: dict[str, Any]
    at: float  # time.monotonic() when it arrived here


class EventCollector:
    """Reads the firehose (finals, KB, tags, call events) and the partials channel of a Redis.

    Starts after the firehose's newest entry, so an existing Redis's history is skipped.
    ``printer`` (kb_hooks.tail's) shows each event as it arrives.
    """

    def __init__(self, url: str, prefix: str = KEY_PREFIX, printer: Printer | None = None) -> None:
        self.url = url
        self.prefix = prefix
        self.printer = printer
        self.received: list[Received] = []
        self._seen: set[str] = set()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()

    async def start(self) -> None:
        client = make_client(self.url, 2.0, _READ_BLOCK_MS / 1000 + 5.0)
        newest: Any = await client.xrevrange(firehose_key(self.prefix), count=1)
        start_id = newest[0][0].decode() if newest else "0-0"
        pubsub = client.pubsub()
        await pubsub.subscribe(live_channel(self.prefix))
        self._tasks = [
            asyncio.create_task(self._read_firehose(client, start_id)),
            asyncio.create_task(self._read_partials(pubsub)),
        ]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _add(self, event: dict[str, Any]) -> None:
        event_id = str(event.get("event_id"))
        if event_id in self._seen:
            return
        self._seen.add(event_id)
        self.received.append(Received(event, time.monotonic()))
        if self.printer is not None:
            self.printer.show(event)
        self._changed.set()

    async def _read_firehose(self, client: aioredis.Redis, last_id: str) -> None:
        try:
            while not self._stop.is_set():
                try:
                    reply: Any = await client.xread({firehose_key(self.prefix): last_id}, block=_READ_BLOCK_MS)
                except (RedisError, OSError):
                    await asyncio.sleep(0.2)  # Redis restarting: resume from the last entry read
                    continue
                for _, entries in reply or []:
                    for entry_id, fields in entries:
                        last_id = entry_id.decode()
                        self._add(json.loads(fields[b"event"]))
        finally:
            await client.aclose()

    async def _read_partials(self, pubsub: Any) -> None:
        try:
            while not self._stop.is_set():
                try:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=_READ_BLOCK_MS / 1000)
                except (RedisError, OSError):
                    await asyncio.sleep(0.2)
                    continue
                if message is not None:
                    event = json.loads(message["data"])
                    if event.get("event_type") == EventType.TRANSCRIPT_PARTIAL:
                        self._add(event)
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    def events(self, sip_call_prefix: str | None = None) -> list[Received]:
        if sip_call_prefix is None:
            return list(self.received)
        return [r for r in self.received if str(r.event.get("sip_call_id", "")).startswith(sip_call_prefix)]

    def ended_calls(self) -> set[str]:
        return {
            str(r.event.get("sip_call_id")) for r in self.received if r.event.get("event_type") == EventType.CALL_ENDED
        }

    async def wait_for(self, sip_call_prefixes: Sequence[str], timeout_s: float) -> bool:
        """Wait until every prefix has its call.ended; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            ended = self.ended_calls()
            if all(any(cid.startswith(p) for cid in ended) for p in sip_call_prefixes):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))


# -- summary ----------------------------------------------------------------------------


def load_references(data_dir: Path = DATA_DIR) -> dict[str, str]:
    lines = (data_dir / "text").read_text(encoding="utf-8").splitlines()
    return dict(line.split(maxsplit=1) for line in lines if line.strip())


@dataclass
class LegSummary:
    role: str
    text: str
    reference: str | None
    cer: float | None


@dataclass
class CallSummary:
    tag: str
    codec: str
    siprec: bool
    sipp_ok: bool
    sipp_errors: str
    call_id: str | None = None
    ended_reason: str | None = None
    legs: list[LegSummary] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    first_partial_ms: float | None = None
    kb: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    workorder: str | None = None  # the last draft in one line
    analytics: str | None = None  # call.analytics in one line

    @property
    def ok(self) -> bool:
        return self.sipp_ok and self.ended_reason is not None


@dataclass
class DemoReport:
    calls: list[CallSummary]
    wall_s: float
    model_dir: str
    redis: str

    @property
    def ok(self) -> bool:
        return all(call.ok for call in self.calls)

    @property
    def model_notice(self) -> str | None:
        """What to say about the bundled synthetic-voices model, when it is the one served."""
        return DEMO_MODEL_NOTICE if is_demo_model(Path(self.model_dir)) else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "model_notice": self.model_notice}


def summarize(call: DemoCall, result: CallResult, received: list[Received], references: dict[str, str]) -> CallSummary:
    """One call's outcome from its events (all sharing the call's ``sip_call_id``)."""
    summary = CallSummary(call.tag, call.codec, call.siprec, result.returncode == 0, result.errors)
    started_at = None
    finals: dict[str, list[str]] = {}
    for item in received:
        event = item.event
        kind = event.get("event_type")
        summary.call_id = summary.call_id or event.get("call_id")
        if kind == EventType.CALL_STARTED:
            started_at = item.at
            summary.roles = [p.get("role", "?") for p in event.get("participants", [])]
            for role in summary.roles:
                finals.setdefault(role, [])
        elif kind == EventType.TRANSCRIPT_PARTIAL and summary.first_partial_ms is None and started_at is not None:
            summary.first_partial_ms = round((item.at - started_at) * 1000, 1)
        elif kind == EventType.TRANSCRIPT_FINAL:
            role = (event.get("participant") or {}).get("role", "?")
            finals.setdefault(role, []).append(str(event.get("text", "")))
        elif kind == EventType.KB_SUGGESTION and event.get("status") != "withdrawn":
            title = f"{event.get('title')} [{event.get('entry_id')}]"
            if title not in summary.kb:
                summary.kb.append(title)
        elif kind == EventType.TAGS:
            for tag in event.get("tags", []):
                label = f"{tag.get('label')}={tag.get('value')}" if tag.get("value") else str(tag.get("label"))
                if label not in summary.tags:
                    summary.tags.append(label)
        elif kind == EventType.WORKORDER_UPDATED:
            summary.workorder = workorder_line(event)
        elif kind == EventType.CALL_ANALYTICS:
            summary.analytics = analytics_line(event)
        elif kind == EventType.CALL_ENDED:
            summary.ended_reason = str(event.get("reason"))
    for role, texts in finals.items():
        reference = references.get(call.reference_key(role))
        text = "".join(texts)
        score = None if reference is None else round(cer(text, reference), 4)
        summary.legs.append(LegSummary(role, text, reference, score))
    return summary


def print_summary(report: DemoReport, out: TextIO) -> None:
    out.write(f"\n== summary: {len(report.calls)} calls in {report.wall_s:.1f} s, model {report.model_dir} ==\n")
    for call in report.calls:
        kind = "SIPREC" if call.siprec else "plain"
        first = "-" if call.first_partial_ms is None else f"{call.first_partial_ms:.0f} ms"
        status = f"ended: {call.ended_reason}" if call.ended_reason else "NO call.ended"
        out.write(f"{call.tag} {call.codec} {kind:<6} {status}, first partial after {first}, call {call.call_id}\n")
        if not call.sipp_ok:
            out.write(f"  sipp failed: {call.sipp_errors.strip()[-500:]}\n")
        for leg in call.legs:
            score = "" if leg.cer is None else f"CER {leg.cer:6.1%}  "
            out.write(f"  {leg.role:<6} {score}«{leg.text}»\n")
            if leg.reference is not None:
                out.write(f"  {'':<6} {'reference  ' if leg.cer is not None else ''}«{leg.reference}»\n")
        out.write(f"  KB: {', '.join(call.kb) or '-'}\n  tags: {', '.join(call.tags) or '-'}\n")
        out.write(f"  work order: {call.workorder or '-'}\n  analytics: {call.analytics or '-'}\n")
    if report.model_notice is not None:
        note = (
            "note: these calls are synthetic voices speaking its training text, so the CER above says the "
            f"pipeline works, not that a person would be understood. {report.model_notice}"
        )
        out.write(textwrap.fill(note, width=100, subsequent_indent="  ", break_on_hyphens=False) + "\n")
    out.write("demo ok\n" if report.ok else "demo FAILED: see the calls above\n")
    out.flush()


# -- the run ----------------------------------------------------------------------------


async def run_demo(
    model_dir: Path,
    redis_url: str,
    workdir: Path,
    out: TextIO | None,
    calls: Sequence[DemoCall] = DEMO_CALLS,
    data_dir: Path = DATA_DIR,
    timeout_s: float = 30.0,
) -> DemoReport:
    """Start the service, place ``calls`` concurrently, collect and summarize their events."""
    began = time.monotonic()
    config = demo_config(redis_url, model_dir, workdir)
    service = Service(config)
    ports = await service.start()
    printer = Printer(out, as_json=False, tty=out.isatty()) if out is not None else None
    collector = EventCollector(redis_url, printer=printer)
    results: list[CallResult] = []
    try:
        await collector.start()
        if ports.sip_udp is None:
            raise DemoError("the service opened no UDP SIP port")
        run_id = f"{os.getpid()}{random.randrange(10**6):06d}"
        tags = [f"{call.tag}-{run_id}" for call in calls]
        sip_port = ports.sip_udp
        results = await asyncio.gather(
            *(place_demo_call(call, tag, workdir, sip_port, data_dir) for call, tag in zip(calls, tags, strict=True))
        )
        await collector.wait_for([tag + "-" for tag in tags], timeout_s)
    finally:
        await service.stop(grace_s=5.0)
        await collector.stop()
    references = load_references(data_dir)
    summaries = [
        summarize(call, result, collector.events(tag + "-"), references)
        for call, result, tag in zip(calls, results, tags, strict=True)
    ]
    return DemoReport(summaries, time.monotonic() - began, str(model_dir), redis_url.split("@")[-1])


async def place_demo_call(
    call: DemoCall, tag: str, workdir: Path, sip_port: int, data_dir: Path = DATA_DIR, extra_headers: str = ""
) -> CallResult:
    """Stream ``call``'s recordings from sipp to ``sip_port``; its SIP Call-ID starts with ``tag``;
    ``extra_headers`` (``X-Agent-Id: 1001``) go into the INVITE."""
    audio = read_wav(data_dir / f"{call.wav}.wav")
    second = read_wav(data_dir / f"{call.second_wav}.wav").samples if call.second_wav else None
    if second is not None and second.shape[0] != audio.samples.shape[0]:
        length = max(second.shape[0], audio.samples.shape[0])
        second = np.pad(second, (0, length - second.shape[0]))
    return await place_call(workdir / tag, sip_port, audio.samples, audio.sample_rate, payload_type=call.payload_type,
                            siprec=call.siprec, second_pcm=second, call_tag=tag,
                            extra_headers=extra_headers)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-gateway demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="WeNet model directory (default: the bundled demo model)")
    parser.add_argument(
        "--redis",
        default=os.environ.get("ASR_REDIS_URL"),
        help="Redis URL to use if it answers (default: $ASR_REDIS_URL; else a local redis-server)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--quiet", action="store_true", help="do not print the live events")
    console = parser.add_argument_group("the console (asr_gateway/dev/console_demo.py)")
    console.add_argument("--console", action="store_true",
                         help="also start the console with an agent, a supervisor and an admin, and keep placing "
                              "the demo calls for the agent until Ctrl-C")  # fmt: skip
    console.add_argument("--listen", default="127.0.0.1:8088", metavar="HOST:PORT", help="the console's address")
    console.add_argument("--rounds", type=int, default=0, help="with --console: stop after this many rounds of calls")
    return parser


@contextlib.contextmanager
def model_and_redis(args: argparse.Namespace) -> Iterator[tuple[Path, str, Path]]:
    """What every demo needs first: sipp, the model (checked), a Redis that answers (``--redis``,
    else a local redis-server, stopped on the way out) and a working directory; yields (model
    directory, Redis URL, working directory)."""
    sipp_path()
    model_dir: Path = args.model or default_model_dir()
    check_model_dir(model_dir)
    with tempfile.TemporaryDirectory(prefix="asr-demo-") as tmp:
        workdir = Path(tmp)
        redis_url = args.redis
        if redis_url and redis_reachable(redis_url):
            yield model_dir, redis_url, workdir
            return
        if redis_url:
            print(f"asr-gateway demo: {redis_url.split('@')[-1]} does not answer; starting a local redis-server",
                  file=sys.stderr)  # fmt: skip
        local = LocalRedis(workdir / "redis")
        local.start()
        try:
            yield model_dir, local.url, workdir
        finally:
            local.stop()


DEMO_ERRORS = (DemoError, LocalRedisError, FileNotFoundError)
"""The problems a demo reports in one line (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    """``asr-gateway demo``; with ``--console`` the command line runs ``console_demo.main`` instead."""
    args = build_parser().parse_args(argv)
    configure_logging("warning", "console")
    try:
        with model_and_redis(args) as (model_dir, redis_url, workdir):
            out = None if args.quiet or args.json else sys.stdout
            report = asyncio.run(run_demo(model_dir, redis_url, workdir, out))
    except DEMO_ERRORS as exc:
        print(f"asr-gateway demo: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False))
    else:
        print_summary(report, sys.stdout)
    if not report.ok:
        print("asr-gateway demo: a call failed (see the summary)", file=sys.stderr)
        return 1
    return 0
