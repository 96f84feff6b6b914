"""The per-route features (``kb_hooks.features``): each declared once, in one registry that config
check, reloading, the processor, the call context and the console's try-it read. A feature
declared here and registered through ``Registry.plus`` runs where the service's run; try-it
runs exactly the service's features with the service's context builder; a route that leaves
``redaction`` unset gets the node's ``default_redaction``."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis.asyncio as aioredis
from pydantic import Field

from asr_core.events import Ended, Final
from asr_gateway.bridge import CallBridge
from asr_gateway.call_context import call_context, profile_context
from asr_gateway.config import ServiceConfig, load_config
from asr_gateway.config_check import check_referenced_files
from calls.call import CallInfo, LegInfo
from calls.profile import Profile
from calls.routing import load_routes
from console.configs import ConfigStore
from kb_hooks import events as ev
from kb_hooks.config import KbHooksSettings
from kb_hooks.features import FEATURES, Feature, FinalStep, NodeDefaults, Registry, RouteSettings
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, RedactionMode, TranscriptUpdate
from tests.bridge_fakes import FakeEngine, RecordingPublisher

EXAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "config"

# Profile keys that are no kb_hooks feature's: the engine's stream, roles, the doors, joins.
CALL_SETTINGS = {
    "name", "chunk_ms", "left_chunks", "transcribe", "attention_beam", "key_prefix", "roles", "srtp", "dtmf",
    "rtp_latch", "metadata_headers", "role", "join_by", "join_timeout_s", "surge", "bearer_token", "send_events",
}  # fmt: skip


# -- a feature defined here, as a real one would be in kb_hooks/features/alert.py ---------------


class AlertProfile(Profile):
    """Stands for the one field a real feature adds to ``calls.profile.Profile``."""

    alert_words: list[str] = Field(default_factory=list)


def _alert_option(route: RouteSettings, node: NodeDefaults) -> object:
    words = route.get("alert_words")
    return tuple(words) if words else None


def _alert_on_final(step: FinalStep) -> list[ev.Event]:
    """A ``tags`` event (kind ``category``, label ``alert``) with each listed word the final says."""
    words = step.ctx.option("alert")
    if not isinstance(words, tuple):
        return []
    (final,) = [e for e in step.events if isinstance(e, ev.TranscriptFinal)]
    hits = tuple(
        ev.Tag("category", "alert", word, None, ev.Span(at, at + len(word)), homophone=False, redacted=False)
        for word in words
        if (at := final.text.find(word)) >= 0
    )
    if not hits:
        return []
    return [ev.Tags(call=step.ctx, participant=final.participant, utterance_id=final.utterance_id,
                    is_partial=False, tags=hits)]  # fmt: skip


ALERT = Feature(
    name="alert",
    route_keys=("alert_words",),
    per_event="finals: a tags event (category alert) naming each of the route's alert words said",
    option=_alert_option,
    on_final=_alert_on_final,
)

# A feature every route has (no key of its own): try-it and the service must both run it.
SEEN = Feature(
    name="seen",
    route_keys=(),
    per_event="finals: a tags event (category seen) with the final's text",
    option=lambda route, node: True,
    on_final=lambda step: [
        ev.Tags(call=step.ctx, participant=step.update.participant, utterance_id=step.update.utterance_id,
                is_partial=False, tags=(ev.Tag("category", "seen", "", None, ev.Span(0, 0), False, False),))
    ],
)  # fmt: skip


def call_of(profile: Profile, route: str = "default") -> CallInfo:
    return CallInfo("c1", "audiosocket", "0b1e3c4d-uuid", "", None, "", None, ("127.0.0.1", 4573, "tcp"), route,
                    profile, False)  # fmt: skip


def final(ctx: CallContext, text: str) -> TranscriptUpdate:
    return TranscriptUpdate(ctx, Participant("caller"), 0, False, text)


def tags_of(events: list[ev.Event], kind: str) -> list[tuple[str, str]]:
    return [(t.label, t.value) for e in events if isinstance(e, ev.Tags) for t in e.tags if t.kind == kind]


# -- the declarations -----------------------------------------------------------------------


def test_every_profile_key_belongs_to_one_feature_or_to_the_call() -> None:
    """A new profile key is either a feature's (declared in its module) or listed as the call's."""
    route_keys = [key for feature in FEATURES for key in feature.route_keys]
    assert len(route_keys) == len(set(route_keys))
    assert not set(route_keys) & CALL_SETTINGS
    assert set(route_keys) | CALL_SETTINGS == set(Profile.model_fields)


def test_every_kb_hooks_setting_is_read_by_a_declared_feature() -> None:
    declared = {name for feature in FEATURES for name in feature.node_settings}
    assert declared == set(KbHooksSettings.model_fields)
    for file_set in FEATURES.file_sets():
        assert file_set.setting in {name for f in FEATURES for name in f.node_settings}
        assert file_set.paths(KbHooksSettings()) == {}


def test_every_feature_says_what_it_does_per_event_and_acts_in_a_working_order() -> None:
    names = [f.name for f in FEATURES]
    built_in = {"redaction", "entities", "itn", "punctuation", "kb", "tags", "analytics", "workorder", "hotwords"}
    assert built_in <= set(names) and all(f.per_event for f in FEATURES)
    assert names.index("itn") < names.index("punctuation")  # punctuation reads the digits
    assert names.index("tags") < names.index("workorder")  # the draft reads the final's tags


def test_a_name_or_a_file_kind_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="feature kb registered twice"):
        FEATURES.plus(replace(ALERT, name="kb"))
    with pytest.raises(ValueError, match="file kind streets registered twice"):
        FEATURES.plus(replace(ALERT, file_sets=(FEATURES.file_set("streets"),)))


# -- a test-only feature through the registry's public API ------------------------------------


def test_a_registered_feature_runs_in_the_processor_for_the_calls_its_route_turns_it_on() -> None:
    features = FEATURES.plus(ALERT)
    processor = TranscriptProcessor.from_settings(KbHooksSettings(), features)
    on = call_context(call_of(AlertProfile(alert_words=["投诉", "经理"])), NodeDefaults(), processor.features)
    off = call_context(call_of(AlertProfile()), NodeDefaults(), processor.features)
    assert on.option("alert") == ("投诉", "经理") and off.option("alert") is None

    assert tags_of(processor.process(final(on, "我要投诉你们")), "category") == [("alert", "投诉")]
    assert tags_of(processor.process(final(off, "我要投诉你们")), "category") == []
    without = TranscriptProcessor.from_settings(KbHooksSettings())
    ctx = call_context(call_of(AlertProfile(alert_words=["投诉"])), NodeDefaults(), without.features)
    assert ctx.options == {} and tags_of(without.process(final(ctx, "我要投诉你们")), "category") == []


# -- try-it is the service ---------------------------------------------------------------------


ROUTES = """profiles:
  everything:
    kb_set: hotline
    tag_rules: hotline
    itn: true
    punctuation: pauses
    analytics_rules: hotline
    workorder: {streets: hotline}
    key_prefix: "asr:x"
  masked: {redaction: mask}
default_profile: everything
"""


@pytest.fixture()
def gateway_yaml(tmp_path: Path) -> Path:
    for name in ("kb.example.yaml", "tags.example.yaml", "analytics.example.yaml", "streets.example.txt"):
        shutil.copy(EXAMPLES / name, tmp_path / name.replace(".example", ""))
    (tmp_path / "routes.yaml").write_text(ROUTES, encoding="utf-8")
    path = tmp_path / "gateway.yaml"
    path.write_text(
        f"""redis: {{spool_dir: {tmp_path / "spool"}}}
routes: routes.yaml
kb_hooks:
  kb_sets: {{hotline: kb.yaml}}
  tag_rule_sets: {{hotline: tags.yaml}}
  analytics_rule_sets: {{hotline: analytics.yaml}}
  street_lists: {{hotline: streets.txt}}
  default_redaction: keep
""",
        encoding="utf-8",
    )
    return path


def service_events(config: ServiceConfig, features: Registry, profile: str, text: str) -> tuple[CallContext, list]:
    """What the service makes of ``text`` as a caller's final: its processor (``Service``) and the
    bridge's context (``CallBridge._context``: ``call_context`` with the processor's features)."""
    assert config.routes is not None
    processor = TranscriptProcessor.from_settings(config.kb_hooks, features)
    call = call_of(load_routes(config.routes).routes.profiles[profile], route=profile)
    ctx = call_context(call, NodeDefaults(config.kb_hooks.default_redaction), processor.features)
    return ctx, processor.process(final(ctx, text))


def comparable(events: list[ev.Event], kinds: set[ev.EventType] | None = None) -> list[dict[str, Any]]:
    """The JSON of the events (of ``kinds`` only, where given) without what differs between any two
    calls: ids (an event's id, where another event names it, becomes its type and its position
    among that type's events), times."""
    own = {"event_id", "ts", "call_id", "sip_call_id", "source_call_id", "workorder_id"}
    kept = [e for e in events if kinds is None or e.event_type in kinds]
    text = json.dumps([{k: v for k, v in e.to_json().items() if k not in own} for e in kept], ensure_ascii=False)
    seen: dict[str, int] = {}
    for event in events:
        seen[event.event_type] = seen.get(event.event_type, 0) + 1
        text = text.replace(event.event_id, f"{event.event_type}#{seen[event.event_type]}")
    out: list[dict[str, Any]] = json.loads(text)
    return out


@pytest.mark.parametrize("features", [FEATURES, FEATURES.plus(SEEN)], ids=["registry", "plus-a-test-feature"])
def test_try_it_runs_exactly_the_features_the_service_runs(gateway_yaml: Path, features: Registry) -> None:
    text = "新华路十二号井盖坏了，我电话幺三八一二三四五六七八"
    store = ConfigStore(gateway_yaml, gateway_yaml.parent / "state", aioredis.Redis(), features)
    tried = store.try_events(text, "everything", {})
    ctx, events = service_events(store.config, features, "everything", text)

    assert tried.ctx == replace(ctx, call_id="try-it", source_call_id=None)
    assert comparable(tried.events) == comparable(events)
    kinds = [e.event_type for e in events]
    assert ev.EventType.WORKORDER_UPDATED in kinds and ev.EventType.KB_SUGGESTION in kinds
    assert ctx.key_prefix == "asr:x" and ctx.analytics_rules == "hotline" and ctx.itn
    assert (tags_of(tried.events, "category") == [("seen", "")]) is (features is not FEATURES)


def test_a_call_through_the_bridge_gets_the_features_try_it_shows(gateway_yaml: Path) -> None:
    """The service's own path: a real CallBridge (the engine and the publisher stand-ins) with the
    processor built from the same registry; its call's features make what try-it showed."""
    features = FEATURES.plus(SEEN)
    text = "新华路十二号井盖坏了，我电话13812345678"
    store = ConfigStore(gateway_yaml, gateway_yaml.parent / "state", aioredis.Redis(), features)
    tried = store.try_events(text, "everything", {})
    config = store.config
    assert config.routes is not None
    engine, publisher = FakeEngine(), RecordingPublisher()
    processor = TranscriptProcessor.from_settings(config.kb_hooks, features)
    bridge = CallBridge(engine, processor, publisher, default_redaction=config.kb_hooks.default_redaction)
    bridge.start()
    profile = load_routes(config.routes).routes.profiles["everything"]
    info = call_of(profile, route="everything")
    bridge.open_leg(info, LegInfo("c1-0", None, "caller", None, "L16"))  # no event loop: announced at once
    engine.callbacks["c1-0"](Final("c1-0", 0, 1, text, (), (), 0, 0, "silence"))
    engine.callbacks["c1-0"](Ended("c1-0", 2, "input_finished", 1000))
    bridge.call_ended(info, "hangup")
    bridge.stop()

    made_by_features = {ev.EventType.KB_SUGGESTION, ev.EventType.TAGS, ev.EventType.WORKORDER_UPDATED}
    made = comparable(publisher.events, made_by_features)
    assert made == comparable(tried.events, made_by_features)
    assert {e["event_type"] for e in made} == made_by_features
    (final,) = [e for e in publisher.events if isinstance(e, ev.TranscriptFinal)]
    (tried_final,) = [e for e in tried.events if isinstance(e, ev.TranscriptFinal)]
    assert (final.text, final.text_raw) == (tried_final.text, tried_final.text_raw)
    assert "13812345678" in final.text  # the node's default_redaction: keep
    assert ("seen", "") in tags_of(publisher.events, "category")


def test_try_it_shows_every_features_events(gateway_yaml: Path) -> None:
    store = ConfigStore(gateway_yaml, gateway_yaml.parent / "state", aioredis.Redis())
    answer = store.try_text("新华路十二号井盖坏了", None, {})
    assert answer["profile"] == "everything"
    assert "workorder.updated" in [e["event_type"] for e in answer["events"]]


# -- default_redaction -------------------------------------------------------------------------


def test_a_route_without_redaction_gets_the_nodes_default_and_one_with_it_its_own() -> None:
    keep = NodeDefaults(RedactionMode.KEEP)
    assert Profile().redaction is None
    assert call_context(call_of(Profile()), keep).redaction is RedactionMode.KEEP
    assert call_context(call_of(Profile()), NodeDefaults()).redaction is RedactionMode.MASK
    assert call_context(call_of(Profile(redaction="mask")), keep).redaction is RedactionMode.MASK
    assert call_context(call_of(Profile(redaction="hash")), keep).redaction is RedactionMode.HASH


def test_a_route_without_key_prefix_publishes_under_the_nodes() -> None:
    """``CallContext.key_prefix`` None: the publisher's ``redis.key_prefix``."""
    assert call_context(call_of(Profile()), NodeDefaults()).key_prefix is None
    assert call_context(call_of(Profile(key_prefix="asr:sales")), NodeDefaults()).key_prefix == "asr:sales"


def test_the_nodes_default_redaction_is_what_try_it_and_the_service_publish(gateway_yaml: Path) -> None:
    text = "我电话13812345678"
    store = ConfigStore(gateway_yaml, gateway_yaml.parent / "state", aioredis.Redis())
    kept = store.try_text(text, "everything", {})
    masked = store.try_text(text, "masked", {})
    assert (kept["redaction"], masked["redaction"]) == ("keep", "mask")
    assert "13812345678" in kept["text"] and "13812345678" not in masked["text"]
    ctx, events = service_events(store.config, FEATURES, "everything", text)
    assert ctx.redaction is RedactionMode.KEEP
    assert "13812345678" in next(e.text for e in events if isinstance(e, ev.TranscriptFinal))


# -- config check and the console's files read the registry -------------------------------------


def test_config_check_loads_every_registered_features_files(gateway_yaml: Path) -> None:
    config = load_config(gateway_yaml)
    assert check_referenced_files(config) == []
    (gateway_yaml.parent / "tags.yaml").write_text("rules:\n  - {label: x, phrases: 3}\n", encoding="utf-8")
    problems = check_referenced_files(config)
    assert problems and all(p.startswith(f"{gateway_yaml.parent / 'tags.yaml'}:") for p in problems)
    assert check_referenced_files(config, Registry(())) == []


def test_the_consoles_files_are_the_registered_features_files(gateway_yaml: Path) -> None:
    store = ConfigStore(gateway_yaml, gateway_yaml.parent / "state", aioredis.Redis())
    assert sorted(store.files()) == ["analytics:hotline", "kb:hotline", "routes", "streets:hotline", "tags:hotline"]
    hotline = [f for f in FEATURES if f.name == "kb"]
    narrow = ConfigStore(gateway_yaml, gateway_yaml.parent / "state", aioredis.Redis(), Registry(tuple(hotline)))
    assert sorted(narrow.files()) == ["kb:hotline", "routes"]


# -- source_call_id ------------------------------------------------------------------------------


def test_every_event_carries_the_doors_call_id_as_source_call_id_and_under_its_first_name() -> None:
    ctx = profile_context(Profile(), NodeDefaults(), call_id="c1", route="r", source_call_id="0b1e3c4d-uuid")
    started = ev.CallStarted(call=ctx, participants=(Participant("mixed"),), metadata={}, source="audiosocket")
    payload = {**started.to_json(), "seq": 1}
    jsonschema.validate(payload, ev.schema())
    assert payload["source_call_id"] == payload["sip_call_id"] == "0b1e3c4d-uuid"
    partial = ev.TranscriptPartial(call=ctx, participant=Participant("mixed"), utterance_id=0, text="",
                                   begin_offset_ms=0, end_offset_ms=0, tokens=(), confidence=None,
                                   latency_ms=None)  # fmt: skip
    assert partial.to_json()["source_call_id"] == "0b1e3c4d-uuid"
    older = {k: v for k, v in payload.items() if k != "source_call_id"}  # written before source_call_id
    jsonschema.validate(older, ev.schema())


def test_a_route_naming_a_file_the_node_lacks_is_a_problem_of_each_feature_that_reads_it() -> None:
    settings = KbHooksSettings(kb_sets={"hotline": Path("kb.yaml")}, street_lists={"district": Path("s.txt")})
    route = Profile.model_validate({"kb_set": "sales", "tag_rules": "t", "workorder": {"streets": "city"}})
    assert FEATURES.route_problems(route.model_dump(), settings) == [
        "kb_set 'sales' is not in kb_hooks.kb_sets (hotline)",
        "tag_rules 't' is not in kb_hooks.tag_rule_sets (none)",
        "workorder.streets 'city' is not in kb_hooks.street_lists (district)",
    ]
    fine = Profile.model_validate({"kb_set": "hotline", "workorder": {}})
    assert FEATURES.route_problems(fine.model_dump(), settings) == []
