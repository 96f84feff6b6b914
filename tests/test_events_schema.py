"""The declared event types (``kb_hooks.events``) against the packaged JSON Schema.

Every schema event type has a declared type and every declared type a schema branch; every
field of a type (the envelope's included) is a property of its event type in the schema, with
a compatible JSON type (records inside checked the same way, recursively), and every field the
schema requires is one the type always writes. Then the steps of docs/events.md "Adding an
event type", followed with a test-only type: declared, given its schema branch, it passes the
same check and goes through the unchanged Publisher, ledger and tail.
"""

from __future__ import annotations

import copy
import io
import json
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import jsonschema

from calls.call import CallSource
from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.ledger import CallLedger
from kb_hooks.publisher import Publisher
from kb_hooks.tail import Printer
from kb_hooks.types import CallContext, Participant

Schema = dict[str, Any]
WRITTEN_BY_TO_JSON = {"schema_version", "event_type"}  # not fields: constants of the type
STAMPED_BY_PUBLISHER = {"seq"}


# -- the check ---------------------------------------------------------------------------


def schema_problems(schema: Schema, declared: Iterable[type[ev.Event]]) -> list[str]:
    """Where the ``declared`` event types and ``schema`` disagree; [] when they agree."""
    problems: list[str] = []
    classes = {str(cls.event_type): cls for cls in declared}
    in_schema = set(schema["properties"]["event_type"]["enum"])
    problems += [f"{name}: in the schema, no declared type" for name in sorted(in_schema - set(classes))]
    problems += [f"{name}: declared, not in the schema" for name in sorted(set(classes) - in_schema)]
    if schema["properties"]["schema_version"].get("const") != ev.SCHEMA_VERSION:
        problems.append(f"schema_version: the schema's is not {ev.SCHEMA_VERSION!r}")
    for name in sorted(in_schema & set(classes)):
        cls = classes[name]
        properties, required = _event_properties(schema, name)
        envelope_extras = WRITTEN_BY_TO_JSON | STAMPED_BY_PUBLISHER
        problems += _record_problems(cls, properties, required - envelope_extras, schema, name)
    return problems


def _event_properties(schema: Schema, event_type: str) -> tuple[dict[str, list[Schema]], set[str]]:
    """Every constraint on each property of ``event_type``: the top level and each allOf branch
    whose ``if`` names it; and the union of their ``required``."""
    properties = {key: [node] for key, node in schema["properties"].items()}
    required = set(schema["required"])
    for branch in schema.get("allOf", []):
        condition = branch["if"]["properties"]["event_type"]
        if condition.get("const") == event_type or event_type in condition.get("enum", ()):
            for key, node in branch["then"].get("properties", {}).items():
                properties.setdefault(key, []).append(node)
            required |= set(branch["then"].get("required", ()))
    return properties, required


def _is_record(annotation: Any) -> bool:
    """A frozen dataclass, or a NamedTuple (``Token``): a JSON object of its fields."""
    return isinstance(annotation, type) and (is_dataclass(annotation) or hasattr(annotation, "_fields"))


def _declared_fields(cls: Any) -> dict[str, bool]:
    """Field name -> whether it is left out of the JSON while None."""
    if is_dataclass(cls):
        return {f.name: bool(f.metadata.get("omit_when_none")) for f in fields(cls)}
    return dict.fromkeys(cls._fields, False)


def _record_problems(
    cls: type, properties: Mapping[str, list[Schema]], required: set[str], schema: Schema, where: str
) -> list[str]:
    hints = get_type_hints(cls)
    declared = _declared_fields(cls)
    problems = [f"{where}.{key}: required by the schema, not declared" for key in sorted(required - set(declared))]
    for key, omit_when_none in declared.items():
        if key not in properties:
            problems.append(f"{where}.{key}: declared, not in the schema")
            continue
        annotation = hints[key]
        if omit_when_none:
            if key in required:
                problems.append(f"{where}.{key}: left out while None, but the schema requires it")
            annotation = _without_none(annotation)
        for node in properties[key]:
            problems += _type_problems(annotation, node, schema, f"{where}.{key}")
    return problems


def _without_none(annotation: Any) -> Any:
    members = [a for a in get_args(annotation) if a is not type(None)]
    return Union[tuple(members)] if members else annotation  # noqa: UP007


def _type_problems(annotation: Any, node: Schema, schema: Schema, where: str) -> list[str]:
    """Every value of ``annotation`` (as ``to_json`` writes it) is valid under ``node``."""
    if annotation is Any:
        return []
    if get_origin(annotation) in (Union, types.UnionType):
        return [p for member in get_args(annotation) for p in _type_problems(member, node, schema, where)]
    alternatives = _alternatives(node, schema)
    if get_origin(annotation) is Literal:
        return [
            f"{where}: {value!r} is not allowed by {node}"
            for value in get_args(annotation)
            if not any(_allows_value(alt, value) for alt in alternatives)
        ]
    reasons = [_alternative_problems(annotation, alt, schema, where) for alt in alternatives]
    if any(not r for r in reasons):
        return []
    return [f"{where}: {annotation} fits none of {alternatives}"] + [p for r in reasons for p in r]


def _alternatives(node: Schema, schema: Schema) -> list[Schema]:
    """``node`` as a list of alternatives, each of at most one JSON type, ``$ref`` resolved."""
    if "$ref" in node:
        return _alternatives(schema["$defs"][node["$ref"].rsplit("/", 1)[1]], schema)
    for key in ("oneOf", "anyOf"):
        if key in node:
            return [alt for sub in node[key] for alt in _alternatives(sub, schema)]
    if isinstance(node.get("type"), list):
        return [{**node, "type": kind} for kind in node["type"]]
    return [node]


def _json_kind(annotation: Any) -> str:
    origin = get_origin(annotation) or annotation
    if origin is type(None):
        return "null"
    if isinstance(origin, type) and issubclass(origin, bool):
        return "boolean"
    if isinstance(origin, type) and issubclass(origin, int):
        return "integer"
    if origin is float:
        return "number"
    if isinstance(origin, type) and issubclass(origin, str):
        return "string"
    if _is_record(origin) or origin is dict or origin is Mapping:
        return "object"
    if origin is tuple:
        return "array"
    raise AssertionError(f"no JSON type for {annotation}")


def _alternative_problems(annotation: Any, alt: Schema, schema: Schema, where: str) -> list[str]:
    kind = _json_kind(annotation)
    if "const" in alt or "enum" in alt:
        return [f"{where}: {annotation} is wider than {alt}"]
    expected = alt.get("type")
    if expected is not None and expected != kind and not (kind == "integer" and expected == "number"):
        return [f"{where}: {kind} is not {expected}"]
    if kind == "array" and "items" in alt:
        return _type_problems(get_args(annotation)[0], alt["items"], schema, f"{where}[]")
    if kind == "object" and _is_record(annotation):
        nested = {key: [node] for key, node in alt.get("properties", {}).items()}
        return _record_problems(annotation, nested, set(alt.get("required", ())), schema, where)
    if kind == "object" and isinstance(alt.get("additionalProperties"), dict) and get_args(annotation):
        return _type_problems(get_args(annotation)[1], alt["additionalProperties"], schema, f"{where}{{}}")
    return []


def _allows_value(alt: Schema, value: Any) -> bool:
    if "const" in alt:
        return bool(alt["const"] == value and type(alt["const"]) is type(value))
    if "enum" in alt:
        return value in alt["enum"]
    return alt.get("type") in (None, _json_kind(type(value)))


# -- the packaged schema and the declared types --------------------------------------------


def test_declared_types_and_the_packaged_schema_agree() -> None:
    assert set(ev.EVENT_CLASSES) == set(ev.EventType)
    assert all(cls.event_type == name for name, cls in ev.EVENT_CLASSES.items())
    assert schema_problems(ev.schema(), ev.EVENT_CLASSES.values()) == []


def test_the_check_finds_drift_both_ways() -> None:
    drifted = copy.deepcopy(ev.schema())
    drifted["properties"]["event_type"]["enum"].remove("dtmf")
    assert schema_problems(drifted, ev.EVENT_CLASSES.values()) == ["dtmf: declared, not in the schema"]
    fewer = [cls for cls in ev.EVENT_CLASSES.values() if cls is not ev.Tags]
    assert schema_problems(ev.schema(), fewer) == ["tags: in the schema, no declared type"]
    retyped = copy.deepcopy(ev.schema())
    suggestion = next(
        b for b in retyped["allOf"] if b["if"]["properties"]["event_type"].get("const") == "kb.suggestion"
    )
    suggestion["then"]["properties"]["priority"] = {"type": "string"}
    suggestion["then"]["required"].append("reviewed_by")
    assert schema_problems(retyped, ev.EVENT_CLASSES.values()) == [
        "kb.suggestion.reviewed_by: required by the schema, not declared",
        "kb.suggestion.priority: <class 'int'> fits none of [{'type': 'string'}]",
        "kb.suggestion.priority: integer is not string",
    ]
    optional = copy.deepcopy(ev.schema())
    transcript = next(b for b in optional["allOf"] if "enum" in b["if"]["properties"]["event_type"])
    transcript["then"]["required"].append("text_raw")
    assert "transcript.final.text_raw: left out while None, but the schema requires it" in schema_problems(
        optional, ev.EVENT_CLASSES.values()
    )


def test_written_out_records_write_exactly_their_fields() -> None:
    """Token spells its JSON out (a partial carries one per unit); the others are generic."""
    assert list(ev.Token("井", 0, 40).to_json()) == list(ev.Token._fields)
    for record in (ev.Span(3, 5), ev.Alternative("井盖", -1.5)):
        assert list(record.to_json()) == [f.name for f in fields(record)]


def test_written_out_transcripts_equal_the_generic_form_key_order_included() -> None:
    """Partials and finals write their JSON out (the most frequent events); it must stay what the
    generic field loop of ``Event.to_json`` makes of them, optional fields present or not."""
    ctx = CallContext("c1", source_call_id="s1", route="default")
    caller = Participant("caller", "sip:a@b", label="1", name="张三")
    tokens = (ev.Token("井", 0, 40), ev.Token("盖", 40, None))
    common = {"call": ctx, "participant": caller, "utterance_id": 3, "text": "井盖", "begin_offset_ms": 0,
              "end_offset_ms": 80, "tokens": tokens, "confidence": 0.9, "latency_ms": 12.5}  # fmt: skip
    events: list[ev.Transcript] = [
        ev.TranscriptPartial(**common),
        ev.TranscriptPartial(**common, chunk_ms=320),
        ev.TranscriptFinal(**common, nbest=(ev.Alternative("井盖", -1.0),)),
        ev.TranscriptFinal(**common, nbest=(), text_raw="井 盖", chunk_ms=640, reduced_search=True),
        ev.TranscriptFinal(**common, nbest=(), reduced_search=True, reduced_reason="engine_saturated"),
    ]
    for event in events:
        generic = ev.Event.to_json(event)
        assert list(event.to_json().items()) == list(generic.items())


# -- adding an event type, step by step (docs/events.md) ----------------------------------


# Step 1, kb_hooks/events.py: a member of EventType (a stand-in here: the enum cannot grow in a test) ...
class Added(StrEnum):
    CALL_HELD = "call.held"


# ... the type, with its fields ...
@dataclass(frozen=True, slots=True, kw_only=True)
class CallHeld(ev.Event):
    """The agent put the call on hold, or took it off."""

    event_type = Added.CALL_HELD  # type: ignore[assignment]
    participant: Participant
    on_hold: bool
    music: str | None = field(default=None, metadata=ev.OMITTED_WHEN_NONE)


# ... and its place in EVENT_CLASSES.
EVENT_CLASSES = [*ev.EVENT_CLASSES.values(), CallHeld]


def schema_with_call_held() -> Schema:
    """Step 2, kb_hooks/schema/event-v1.schema.json: the name in the event_type enum, a branch."""
    schema = copy.deepcopy(ev.schema())
    schema["properties"]["event_type"]["enum"].append("call.held")
    schema["allOf"].append({
        "if": {"properties": {"event_type": {"const": "call.held"}}},
        "then": {
            "required": ["participant", "on_hold"],
            "properties": {
                "participant": {"$ref": "#/$defs/participant"},
                "on_hold": {"type": "boolean"},
                "music": {"type": "string"},
            },
        },
    })  # fmt: skip
    return schema


def test_an_added_event_type_needs_its_declaration_and_its_schema_branch_only(tmp_path: Path) -> None:
    assert schema_problems(ev.schema(), EVENT_CLASSES) == ["call.held: declared, not in the schema"]
    extended = schema_with_call_held()
    assert schema_problems(extended, EVENT_CLASSES) == []

    # Then it is made where it happens and submitted: nothing else changes.
    call = CallContext("held-1", "h@pbx", "hotline")
    publisher = Publisher(RedisSettings(url="redis://127.0.0.1:1/0", spool_dir=tmp_path / "spool"))
    publisher.call_started(call, [Participant("agent", "sip:1001@pbx")])
    publisher.submit(CallHeld(call=call, participant=Participant("agent", "sip:1001@pbx"), on_hold=True))
    started, held = (item.event for item in publisher._inbox)
    assert held["event_type"] == "call.held" and held["seq"] == 2 and "music" not in held
    for event in (started, held):
        jsonschema.validate(event, extended)
    ledger = CallLedger()
    ledger.note(started, "asr", "1000-1")
    ledger.note(held, "asr", "1001-2")
    assert ledger.open["held-1"].seq == 2
    line = Printer(io.StringIO(), as_json=False, tty=False).format(held)
    assert "call.held" in line and '"on_hold": true' in line


def test_call_started_source_names_every_front_door() -> None:
    """kb_hooks restates the call model's door names (it may not import ``calls``): they must agree,
    and the schema's enum with them."""
    schema = json.loads((Path(ev.__file__).parent / "schema" / "event-v1.schema.json").read_text(encoding="utf-8"))
    started = next(b for b in schema["allOf"] if b["if"]["properties"]["event_type"].get("const") == "call.started")
    assert set(get_args(ev.CallSourceName)) == set(get_args(CallSource))
    assert set(started["then"]["properties"]["source"]["enum"]) == set(get_args(CallSource))
