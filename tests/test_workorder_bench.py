"""The labelled work-order set and ``asr-bench workorder``: the generator remakes the committed
set exactly, the set parses with true fields the demo's street list and tag rules can give, and
the extraction from the reference text scores the first calls field by field as expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asr_common.yamlconf import ConfigError
from deploy.bench import workorder as bench
from kb_hooks.types import RedactionMode, WorkorderOptions
from kb_hooks.workorder import load_street_list
from recipes import synth, workorder_calls

REPO = Path(__file__).resolve().parents[1]


def test_the_generator_remakes_the_committed_set() -> None:
    seed, calls = workorder_calls.read_set(workorder_calls.DEFAULT_SET)
    made = workorder_calls.make_calls(len(calls), seed)
    assert made == calls
    assert workorder_calls.to_yaml(made, seed) == workorder_calls.DEFAULT_SET.read_text(encoding="utf-8")
    assert workorder_calls.make_calls(3, 7) == workorder_calls.make_calls(3, 7)
    assert workorder_calls.make_calls(3, 7) != workorder_calls.make_calls(3, 8)


def test_the_set_parses_and_its_truth_fits_the_demo_route() -> None:
    calls = bench.load_set(bench.DEFAULT_SET)
    assert len(calls) >= 100 and len({c.call_id for c in calls}) == len(calls)
    streets = load_street_list(REPO / "asr_gateway" / "dev" / "data" / "streets.txt").streets
    assert set(workorder_calls.STREETS) == set(streets)
    for call in calls:
        assert {role for role, _ in call.turns} == {"caller", "agent"}
        assert call.truth["address"].startswith(streets)
        assert call.truth["contact"].isdigit() and len(call.truth["contact"]) == 11


def test_a_malformed_set_names_the_file_and_the_call(tmp_path: Path) -> None:
    path = tmp_path / "set.yaml"
    path.write_text("calls:\n- id: x\n  turns: [{caller: 你好}]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"set\.yaml: calls\[0\]: needs id, turns"):
        bench.load_set(path)


def test_the_text_goes_through_the_demo_routes_settings() -> None:
    ctx = bench.route_context(bench.demo_profile(), "wo-001", keep_numbers=False)
    assert (ctx.kb_set, ctx.tag_rules, ctx.redaction) == ("hotline", ("hotline",), RedactionMode.MASK)
    assert ctx.workorder == WorkorderOptions("hotline")
    assert bench.route_context(bench.demo_profile(), "wo-001", keep_numbers=True).redaction is RedactionMode.KEEP


def test_the_reference_text_of_five_calls_scores_field_by_field() -> None:
    calls = bench.load_set(bench.DEFAULT_SET)[:5]
    result = bench.score(calls, bench.run_text(calls, keep_numbers=False))
    assert result["right"] == {"category": 5, "address": 5, "time": 5, "contact": 5, "kb_entry": 5}
    assert result["misses"] == []
    kept = bench.score(calls, bench.run_text(calls, keep_numbers=True))
    assert kept["right"]["contact"] == 5


def test_a_calls_last_draft_and_finals_in_redis_are_found_by_its_sip_call_id() -> None:
    def updated(sip_call_id: str, revision: int, category: str) -> dict[str, Any]:
        fields: dict[str, Any] = {"category": {"value": category, "normalized": None, "matched": [], "event_ids": []}}
        return {"event_type": "workorder.updated", "sip_call_id": sip_call_id, "revision": revision, "fields": fields}

    final = {"event_type": "transcript.final", "sip_call_id": "wo-001-1-9@h", "participant": {"role": "caller"},
             "text": "新华路的井盖坏了"}  # fmt: skip
    events = [updated("wo-001-1-9@h", 2, "b"), updated("wo-001-1-9@h", 1, "a"), updated("wo-0011-1-9@h", 3, "c"),
              final, {"event_type": "call.ended", "sip_call_id": "wo-001-1-9@h"}]  # fmt: skip
    drafts = bench.last_drafts(events, ["wo-001", "wo-002"])
    assert list(drafts) == ["wo-001"]
    assert drafts["wo-001"]["category"] == events[0]["fields"]["category"]
    assert bench.heard(events, ["wo-001", "wo-002"]) == {"wo-001": ["caller: 新华路的井盖坏了"]}


@pytest.mark.skipif(not synth.espeak_available(), reason="espeak-ng not installed")
def test_a_rendered_call_is_two_tracks_of_one_length_each_party_on_its_own(tmp_path: Path) -> None:
    _, calls = workorder_calls.read_set(workorder_calls.DEFAULT_SET)
    workorder_calls.render_call(calls[0], tmp_path, seed=1)
    tracks = bench.read_tracks(tmp_path, bench.load_set(bench.DEFAULT_SET)[0])
    assert tracks.rate == 8000 and len(tracks.caller) == len(tracks.agent)
    greeting = slice(int(0.5 * 8000), int(1.5 * 8000))  # the agent greets first, after a gap of at most 1.2 s
    loud = np.abs(tracks.agent[greeting].astype(np.int32)).max()
    quiet = np.abs(tracks.caller[greeting].astype(np.int32)).max()
    assert loud > 1000 and quiet < 200
