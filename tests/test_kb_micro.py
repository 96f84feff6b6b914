"""``deploy.bench.kb_micro``: the workload is sent as the engine sends it, and a run against a
baseline revision measures both trees and compares what they publish."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from deploy.bench import kb_micro

REPO = Path(__file__).resolve().parents[1]


def test_partials_grow_by_chunks_and_each_utterance_ends_in_its_final() -> None:
    load = kb_micro.workload(calls=2, nbest=5, seed=1)
    assert load["context"]["kb_set"] and load["context"]["workorder"] is not None
    for call in load["calls"]:
        previous: dict[tuple[str, int], str] = {}
        for update in call:
            key = (update["role"], update["utterance_id"])
            if update["partial"]:
                assert update["text"] != previous.get(key)  # the engine sends no unchanged partial
                assert update["text"].startswith(previous.get(key, ""))
                assert len(update["tokens"]) == len(update["text"]) and not update["nbest"]
                previous[key] = update["text"]
            else:
                assert update["text"] == previous.pop(key)  # the last partial showed the whole turn
                assert len(update["nbest"]) == 5 and update["nbest"][0][0] == update["text"]
        assert not previous


def test_a_run_against_a_baseline_measures_both_and_compares_their_events(capsys: pytest.CaptureFixture[str]) -> None:
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, check=False).returncode:
        pytest.skip("not a git checkout")
    assert kb_micro.main(["--baseline", "HEAD", "--calls", "1", "--rounds", "1", "--nbest", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["same_events"] is True
    for tree in ("this", "baseline"):
        assert out[tree]["partial_us"] > 0 and out[tree]["final_us"] > 0
    assert out["workload"]["finals"] > 0 and out["workload"]["partials"] > out["workload"]["finals"]
