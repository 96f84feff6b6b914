"""``python -m deploy.bench.finals_micro``: the finals' search timed per configuration on the
bundled call audio."""

from __future__ import annotations

import json

import pytest

from deploy.bench import finals_micro


def test_finals_micro_times_each_configuration_on_real_utterances(capsys: pytest.CaptureFixture[str]) -> None:
    assert finals_micro.main(["--streams", "2", "--seconds", "8", "--batch", "3", "--repeat", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["utterances"] >= 2  # two streams, at least one utterance each
    assert report["encoder_frames"] > 0
    names = {"rescore", "reduced", "proposals", "proposals_same_decoder"}
    assert set(report["cpu_ms_min"]) == set(report["per_utterance_ms"]) == names
    assert all(value > 0 for value in report["cpu_ms_min"].values())
    assert report["same_transcripts"]["proposals"] == 1.0
    assert all(0.0 <= share <= 1.0 for share in report["same_transcripts"].values())


def test_finals_micro_refuses_counts_below_one() -> None:
    with pytest.raises(SystemExit) as exc:
        finals_micro.main(["--repeat", "0"])
    assert exc.value.code == 2
