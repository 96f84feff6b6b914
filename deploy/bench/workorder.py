"""``asr-bench workorder``: field accuracy of the work-order draft on a labelled set; prints one JSON object.

The set (``recipes/testsets/workorder_calls.yaml``, made by ``recipes.workorder_calls``) holds
scripted two-party calls and the fields a careful agent would file from each. Two measures:

- **from the reference text** (default): each call's turns go, as the finals of its caller and
  agent legs, through the real ``TranscriptProcessor`` with the demo's default route (its
  routes file, KB, tag rules and street list); the last draft is compared with the truth. This
  measures the extraction alone.
- **through the whole service** (``--audio DIR``, the calls voiced by ``python -m
  recipes.workorder_calls render --out DIR``): each call is placed as a SIPREC call (caller and
  agent on their own streams, RTP from sipp) into the service with the bundled model and a
  throwaway redis-server; the last ``workorder.updated`` of each call in Redis is compared
  with the truth. ``--concurrency`` calls at a time; ``--heard`` adds the finals of each call
  with a wrong field, to tell recognition errors from extraction errors.

A field counts as right when the draft's normalized form equals the truth: ``category`` (the
label), ``address`` (listed street, house number in digits), ``time`` ("date clock", digits),
``kb_entry`` (the entry id) and ``contact``: its digits where the route keeps numbers
(``--keep-numbers``); under the demo route's ``mask`` the published value has one ``*`` a digit,
so it is right when it is that many stars (a number of the right length was heard, not which).
A field the draft left empty is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import yaml

from asr_common.yamlconf import ConfigError
from asr_core.audio_io import read_pcm16
from asr_gateway.call_context import profile_context
from asr_gateway.dev.cluster import firehose
from asr_gateway.dev.demo import DATA_DIR, KEY_PREFIX, default_model_dir, demo_config
from asr_gateway.dev.local_redis import LocalRedis
from asr_gateway.dev.sipp_calls import PCMU, place_call
from asr_gateway.service import DEMO_MODEL_DIR, Service
from calls.profile import Profile
from calls.roles import Role
from calls.routing import load_routes
from kb_hooks.events import EventType, WorkorderUpdated
from kb_hooks.features import NodeDefaults
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, RedactionMode, TranscriptUpdate

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SET = REPO / "recipes" / "testsets" / "workorder_calls.yaml"
SCORED_FIELDS = ("category", "address", "time", "contact", "kb_entry")
ROLES: tuple[Role, ...] = ("caller", "agent")
MS_PER_CHARACTER = 250  # the finals' made-up times from text: about four characters a second
DRAIN_TIMEOUT_S = 120.0  # a busy 2-core machine decodes a call's last seconds well after the hang-up

Fields = Mapping[str, Mapping[str, Any] | None]
"""A draft's ``fields`` as ``workorder.updated`` carries them in JSON (None: not filled in)."""


@dataclass(frozen=True)
class LabelledCall:
    """One call of the set: its turns (role, text) in the order spoken and its true fields."""

    call_id: str
    turns: tuple[tuple[Role, str], ...]
    truth: Mapping[str, str]


def load_set(path: Path) -> list[LabelledCall]:
    """The calls of a set file; ConfigError naming the file and the call when one is malformed."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read ({exc.strerror})"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not YAML ({exc})"]) from None
    if not isinstance(data, dict) or not isinstance(data.get("calls"), list):
        raise ConfigError([f"{path}: expected a mapping with a list `calls` (recipes.workorder_calls writes one)"])
    calls = []
    for index, raw in enumerate(data["calls"]):
        try:
            turns = tuple((str(role), str(text)) for turn in raw["turns"] for role, text in turn.items())
            truth = {name: str(raw["truth"][name]) for name in SCORED_FIELDS}
            call_id = str(raw["id"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ConfigError([f"{path}: calls[{index}]: needs id, turns (role: text) and truth ({exc!r})"]) from None
        bad_roles = {role for role, _ in turns} - set(ROLES)
        if bad_roles:
            raise ConfigError(
                [f"{path}: calls[{index}] ({call_id}): unknown roles {sorted(bad_roles)}; use caller, agent"]
            )
        calls.append(LabelledCall(call_id, tuple((cast("Role", role), text) for role, text in turns), truth))
    return calls


def route_context(profile: Profile, call_id: str, keep_numbers: bool) -> CallContext:
    """The context the bridge gives a call of ``profile`` (``asr_gateway.call_context``)."""
    ctx = profile_context(profile, NodeDefaults(), call_id=call_id, route=None)
    return replace(ctx, redaction=RedactionMode.KEEP) if keep_numbers else ctx


def demo_profile() -> Profile:
    """The profile every demo call gets (the bundled routes file's default)."""
    router = load_routes(DATA_DIR / "routes.yaml")
    name = router.routes.default_profile or "default"
    return router.routes.profiles[name]


def draft_from_text(processor: TranscriptProcessor, call: LabelledCall, ctx: CallContext) -> Fields:
    """The last draft of ``call`` with each turn a final of its party's leg."""
    parties = {role: Participant(role, f"sip:{role}@bench.invalid") for role in ROLES}
    utterances = dict.fromkeys(ROLES, 0)
    fields: Fields = {}
    clock_ms = 0
    for role, text in call.turns:
        end_ms = clock_ms + MS_PER_CHARACTER * len(text)
        update = TranscriptUpdate(ctx, parties[role], utterances[role], False, text, (), clock_ms, end_ms)
        utterances[role] += 1
        clock_ms = end_ms + 800
        for event in processor.process(update):
            if isinstance(event, WorkorderUpdated):
                fields = event.to_json()["fields"]
    processor.end_call(ctx.call_id)
    return fields


def field_right(name: str, truth: str, draft: Mapping[str, Any] | None) -> bool:
    if draft is None:
        return False
    if name == "category":
        return bool(draft["value"] == truth)
    if name == "contact" and draft["normalized"] is None:  # masked: as many stars as digits
        return bool(draft["value"] == "*" * len(truth))
    return bool(draft["normalized"] == truth)


def draft_text(draft: Mapping[str, Any] | None) -> str | None:
    if draft is None:
        return None
    return str(draft["normalized"] if draft["normalized"] is not None else draft["value"])


def score(calls: Sequence[LabelledCall], drafts: Mapping[str, Fields]) -> dict[str, Any]:
    """Per-field accuracy over ``calls`` (a call missing from ``drafts``: every field wrong)."""
    right = dict.fromkeys(SCORED_FIELDS, 0)
    whole = 0
    misses = []
    for call in calls:
        fields = drafts.get(call.call_id, {})
        call_right = True
        for name in SCORED_FIELDS:
            draft = fields.get(name)
            if field_right(name, call.truth[name], draft):
                right[name] += 1
            else:
                call_right = False
                misses.append(
                    {"call": call.call_id, "field": name, "truth": call.truth[name], "draft": draft_text(draft)}
                )
        whole += call_right
    count = max(len(calls), 1)
    return {
        "calls": len(calls),
        "accuracy": {name: round(n / count, 4) for name, n in right.items()},
        "right": right,
        "all_fields_right": round(whole / count, 4),
        "misses": misses,
    }


def run_text(calls: Sequence[LabelledCall], keep_numbers: bool) -> dict[str, Fields]:
    profile = demo_profile()
    # Only the demo's kb_hooks settings are taken: nothing connects to that Redis or loads the model.
    settings = demo_config("redis://127.0.0.1:6379/0", DEMO_MODEL_DIR, Path(tempfile.gettempdir())).kb_hooks
    processor = TranscriptProcessor.from_settings(settings)
    return {
        call.call_id: draft_from_text(processor, call, route_context(profile, call.call_id, keep_numbers))
        for call in calls
    }


def _keep_numbers_routes(workdir: Path) -> Path:
    """A copy of the demo's routes file whose default profile keeps numbers (``redaction: keep``)."""
    data = yaml.safe_load((DATA_DIR / "routes.yaml").read_text(encoding="utf-8"))
    data["profiles"][data.get("default_profile") or "default"]["redaction"] = "keep"
    path = workdir / "routes.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Tracks:
    """A voiced call: each party's int16 samples (N,), the same N, at ``rate`` Hz (8000)."""

    caller: np.ndarray
    agent: np.ndarray
    rate: int


def track_path(audio_dir: Path, call: LabelledCall, role: Role) -> Path:
    return audio_dir / f"{call.call_id}.{role}.wav"


def check_voiced(audio_dir: Path, calls: Sequence[LabelledCall]) -> None:
    """ConfigError saying how to voice the set when a call's track is missing."""
    missing = [path for call in calls for role in ROLES if not (path := track_path(audio_dir, call, role)).is_file()]
    if missing:
        raise ConfigError([f"{missing[0]}: missing ({len(missing)} tracks in all); voice the set first: "
                           f"python -m recipes.workorder_calls render --out {audio_dir}"])  # fmt: skip


def read_tracks(audio_dir: Path, call: LabelledCall) -> Tracks:
    """The call's two tracks (``recipes.workorder_calls render`` makes them the same length)."""
    (caller, rate), (agent, agent_rate) = (read_pcm16(track_path(audio_dir, call, role)) for role in ROLES)
    if rate != agent_rate or len(caller) != len(agent):
        raise ConfigError([f"{audio_dir}: {call.call_id}'s tracks differ in rate or length; render them again"])
    return Tracks(caller, agent, rate)


async def _through_service(
    calls: Sequence[LabelledCall], audio_dir: Path, workdir: Path, redis_url: str, keep_numbers: bool, concurrency: int
) -> list[dict[str, Any]]:
    """Place the calls, ``concurrency`` at a time, each batch decoded to its end; every event in Redis."""
    config = demo_config(redis_url, default_model_dir(), workdir)
    if keep_numbers:
        config = config.model_copy(update={"routes": _keep_numbers_routes(workdir)})
    service = Service(config)
    ports = await service.start()
    assert ports.sip_udp is not None
    try:
        for start in range(0, len(calls), concurrency):
            batch = calls[start : start + concurrency]
            placed = []
            for call in batch:
                tracks = read_tracks(audio_dir, call)
                placed.append(place_call(workdir / call.call_id, ports.sip_udp, tracks.caller, tracks.rate,
                                         payload_type=PCMU, siprec=True, second_pcm=tracks.agent,
                                         call_tag=call.call_id))  # fmt: skip
            for call, result in zip(batch, await asyncio.gather(*placed), strict=True):
                if result.returncode != 0:
                    raise RuntimeError(f"sipp failed for {call.call_id}: {result.errors}")
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while service.engine.active_streams or service.bridge.active_calls:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"calls not drained {DRAIN_TIMEOUT_S:.0f} s after they hung up")
                await asyncio.sleep(0.1)
    finally:
        await service.stop(grace_s=5)
    return firehose(redis_url, KEY_PREFIX)


def call_of(sip_call_id: str, call_ids: Sequence[str]) -> str | None:
    """The set's call a SIP Call-ID belongs to (the bench tags it ``<call id>-...``)."""
    return next((c for c in call_ids if sip_call_id.startswith(f"{c}-")), None)


def last_drafts(events: Sequence[Mapping[str, Any]], call_ids: Sequence[str]) -> dict[str, Fields]:
    """Each call's draft of highest revision."""
    drafts: dict[str, tuple[int, Fields]] = {}
    for event in events:
        if event.get("event_type") != EventType.WORKORDER_UPDATED:
            continue
        call_id = call_of(str(event.get("sip_call_id", "")), call_ids)
        if call_id is not None and event["revision"] > drafts.get(call_id, (0, {}))[0]:
            drafts[call_id] = (event["revision"], event["fields"])
    return {call_id: fields for call_id, (_, fields) in drafts.items()}


def heard(events: Sequence[Mapping[str, Any]], call_ids: Sequence[str]) -> dict[str, list[str]]:
    """Each call's finals as published, ``role: text`` in order: what the draft was made from."""
    finals: dict[str, list[str]] = {}
    for event in events:
        if event.get("event_type") != EventType.TRANSCRIPT_FINAL:
            continue
        call_id = call_of(str(event.get("sip_call_id", "")), call_ids)
        if call_id is not None:
            finals.setdefault(call_id, []).append(f"{event['participant']['role']}: {event['text']}")
    return finals


def run_audio(
    calls: Sequence[LabelledCall], audio_dir: Path, keep_numbers: bool, concurrency: int, redis_url: str | None
) -> list[dict[str, Any]]:
    """The events of the calls placed through the service (``_through_service``)."""
    with tempfile.TemporaryDirectory(prefix="asr-bench-workorder-") as tmp:
        workdir = Path(tmp)
        if redis_url is not None:
            return asyncio.run(_through_service(calls, audio_dir, workdir, redis_url, keep_numbers, concurrency))
        redis = LocalRedis(workdir / "redis")
        redis.start()
        try:
            return asyncio.run(_through_service(calls, audio_dir, workdir, redis.url, keep_numbers, concurrency))
        finally:
            redis.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-bench workorder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--set", type=Path, default=DEFAULT_SET, help="the labelled set (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N calls")
    parser.add_argument("--keep-numbers", action="store_true",
                        help="the route keeps numbers (redaction: keep): the contact's digits are scored")  # fmt: skip
    voiced = "through the service, the calls voiced in DIR (recipes.workorder_calls render)"
    parser.add_argument("--audio", type=Path, default=None, help=voiced)
    parser.add_argument("--concurrency", type=int, default=2, help="--audio: calls at a time")
    parser.add_argument("--redis", default=None, help="--audio: a Redis URL to use (default: a throwaway redis-server)")
    parser.add_argument(
        "--misses", type=int, default=20, help="wrong fields listed in the output (default: %(default)s)"
    )
    parser.add_argument("--heard", action="store_true", help="--audio: the finals of each call listed in misses")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"asr-bench workorder: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    calls = load_set(args.set)[: args.limit]
    call_ids = [call.call_id for call in calls]
    finals: dict[str, list[str]] = {}
    if args.audio is None:
        drafts = run_text(calls, args.keep_numbers)
    else:
        check_voiced(args.audio, calls)
        events = run_audio(calls, args.audio, args.keep_numbers, max(args.concurrency, 1), args.redis)
        drafts, finals = last_drafts(events, call_ids), heard(events, call_ids)
    result = score(calls, drafts)
    mistakes = result.pop("misses")
    listed = mistakes[: args.misses]
    report = {
        "set": str(args.set),
        "through": "service" if args.audio is not None else "reference text",
        "route": "demo default",
        "contact_scored": "digits" if args.keep_numbers else "masked length",
        **result,
        "wrong_fields": len(mistakes),
        "misses": listed,
    }
    if args.heard and finals:
        missed = dict.fromkeys(miss["call"] for miss in listed)
        report["heard"] = {call_id: finals.get(call_id, []) for call_id in missed}
    print(json.dumps(report, ensure_ascii=False, indent=2))
    return 0
