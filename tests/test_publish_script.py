"""How a batch of events becomes script calls: one on a single Redis, one per shard on a Cluster;
partials per ``partials_to_stream`` / ``partials_to_pubsub``. The journal's line format."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.journal_records import EventRecord, event_line, event_payload, parse_line
from kb_hooks.keys import KeyLayout
from kb_hooks.publish_script import ScriptCall, pack
from kb_hooks.types import CallContext, Participant

FIELDS = 12  # per event, after the 3 leading arguments


@dataclass
class Queued:
    call_id: str
    event_type: str
    event_id: str
    partial: bool = False
    prefix: str = "asr"
    stream_id: str = "1-1"

    def payload(self) -> str:
        return json.dumps({"event_id": self.event_id})


def modes(call: ScriptCall) -> list[Any]:
    return call.args[3::FIELDS]


def test_single_redis_batch_is_one_call_with_shared_keys() -> None:
    batch = [Queued("a", "call.started", "e1"), Queued("a", "transcript.final", "e2"), Queued("b", "call.ended", "e3")]
    [call] = pack(batch, RedisSettings(), KeyLayout())
    assert call.members == [0, 1, 2]
    assert call.keys == ["asr:call:a", "asr:events", "asr:call:a:ids", "asr:call:b", "asr:call:b:ids"]
    assert call.args[:3] == [10_000, 1_000_000, 7 * 86_400]
    assert len(call.args) == 3 + FIELDS * 3
    assert modes(call) == ["s", "s", "s"]
    ttls = call.args[3 + 8 :: FIELDS]
    assert ttls == [0, 0, 86_400]  # only call.ended sets the call's lifetime


def test_cluster_batch_is_one_call_per_shard() -> None:
    layout = KeyLayout(shards=4)
    batch = [Queued(f"call-{n}", "transcript.final", f"e{n}") for n in range(12)]
    calls = pack(batch, RedisSettings(), layout)
    assert sorted(m for call in calls for m in call.members) == list(range(12))
    for call in calls:
        assert len({key.split("}")[0] for key in call.keys}) == 1  # one hash tag: one slot
        assert len({layout.shard_of(batch[m].call_id) for m in call.members}) == 1


@pytest.mark.parametrize(
    ("to_stream", "to_pubsub", "expected"),
    [(False, True, ["p"]), (True, True, ["s"]), (True, False, ["n"]), (False, False, None)],
)
def test_partials_go_where_the_settings_say(to_stream: bool, to_pubsub: bool, expected: list[str] | None) -> None:
    s = RedisSettings(partials_to_stream=to_stream, partials_to_pubsub=to_pubsub)
    calls = pack([Queued("a", "transcript.partial", "e1", partial=True)], s, KeyLayout())
    assert [modes(call) for call in calls] == ([] if expected is None else [expected])
    if calls:
        assert calls[0].args[3 + 3] == 0  # partials have no event-id set
        assert calls[0].keys == ["asr:call:a", "asr:events"]


def test_journal_lines_round_trip_and_checkpoints_are_told_apart() -> None:
    payload = json.dumps({"event_id": "e1", "text": "井盖"}, ensure_ascii=False)
    line = event_line("17-3", "asr", payload)
    assert json.loads(line) == {"id": "17-3", "prefix": "asr", "event": {"event_id": "e1", "text": "井盖"}}
    assert parse_line(line) == EventRecord("17-3", "asr", {"event_id": "e1", "text": "井盖"})
    assert parse_line('{"checkpoint": {"open_calls": {}}}') == {"open_calls": {}}
    for corrupt in ('{"id": "1-1"', '{"id": "1-1", "prefix": "asr"}', "[1, 2]", '"text"'):
        with pytest.raises(ValueError):
            parse_line(corrupt)


def test_event_payload_is_json_dumps_text() -> None:
    """The publisher's one encoder writes what ``json.dumps(event, ensure_ascii=False)`` wrote."""
    call = CallContext("call-1", "sip-1", "hotline")
    caller = Participant("caller", "sip:caller@pbx.local", None, "张三")
    events: list[ev.Event] = [
        ev.TranscriptFinal(call=call, participant=caller, utterance_id=3, text="井盖坏了", begin_offset_ms=0,
                           end_offset_ms=900, tokens=(ev.Token("井", 0, None), ev.Token("盖", 250, 300)),
                           confidence=0.875, latency_ms=1e-05, nbest=(ev.Alternative("井盖坏了", -1.5),),
                           text_raw="井盖 坏了\n\"引号\"", reduced_search=True),
        ev.CallEnded(call=call, reason="bye", stats={"audio_ms": 61_000, "nested": {"a": [1, 2.5, None, True]}}),
    ]  # fmt: skip
    for event in events:
        wire = {**event.to_json(), "seq": 7}
        assert event_payload(wire) == json.dumps(wire, ensure_ascii=False)
