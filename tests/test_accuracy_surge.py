"""``asr-bench accuracy`` at the chunk sizes surge uses: each size at the left chunks that keep
a 160 ms route's attention window, and streams moved from 160 to 640 ms mid-utterance by the
engine's own ``Stream.set_chunk``; the CER difference of two modes with its bootstrap interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asr_core.model.loader import LoadedModel, load_wenet_model
from deploy.bench import accuracy
from deploy.bench.accuracy_report import paired_difference
from deploy.bench.accuracy_streaming import ChunkPlan, PlanError, decode_streaming, surge_left_chunks
from tests.demo_quality import DEMO_MODEL

BUNDLE = Path(__file__).resolve().parent / "data" / "hotline_8k"


@pytest.fixture(scope="module")
def demo() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(DEMO_MODEL)


def test_surge_sizes_keep_the_window_of_a_160_ms_route(demo: LoadedModel) -> None:
    assert surge_left_chunks(demo, 160, 8, (160, 320, 640)) == {160: 8, 320: 4, 640: 2}
    with pytest.raises(PlanError, match=r"\[320, 640\] ms cannot keep the attention window of 160 ms x 3"):
        surge_left_chunks(demo, 160, 3, (160, 320, 640))
    plans = accuracy.chunk_plans(demo, 8, (160, 320, 640), surge_ladder=False, switch_at_s=1.5)
    assert [(p.mode, p.left_chunks) for p in plans] == [("160ms", 8), ("320ms", 4), ("640ms", 2), ("160>640ms", 8)]
    assert [p.left_chunks for p in accuracy.chunk_plans(demo, 8, (160, 640), False, None)] == [8, 8]
    with pytest.raises(PlanError, match="give both in --chunk-ms"):
        accuracy.chunk_plans(demo, 8, (640,), surge_ladder=True, switch_at_s=1.0)


def test_streams_switch_once_mid_utterance_and_a_switch_past_the_audio_changes_nothing(demo: LoadedModel) -> None:
    audio = [samples for _, _, samples in accuracy.read_audio(BUNDLE)]
    fixed = decode_streaming(demo, audio, ChunkPlan(160, 8), "torch-int8", 8)
    assert fixed.switched == 0 and set(fixed.texts) == {"greedy", "rescore"}
    late = decode_streaming(demo, audio, ChunkPlan(160, 8, switch_to=640, switch_at_s=60.0), "torch-int8", 8)
    assert late.switched == 0, "no utterance of the bundle is a minute long"
    assert late.texts == fixed.texts, "a ladder that is never climbed decodes as the fixed size"
    moved = decode_streaming(demo, audio, ChunkPlan(160, 8, switch_to=640, switch_at_s=1.0), "torch-int8", 8)
    assert moved.switched == len(audio), "every stream's final says it ended at 640 ms"
    assert all(text for text in moved.texts["rescore"])


def test_the_report_names_the_plans_and_pairs_each_mode_with_the_first(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--model", str(DEMO_MODEL), "--testset", str(BUNDLE), "--backend", "torch-int8", "--limit", "2"]
    accuracy.main([*common, "--chunk-ms", "640", "160", "--switch-at", "1.0", "--worst", "0"])
    report = json.loads(capsys.readouterr().out)
    assert list(report["cer"]) == ["160ms", "640ms", "160>640ms"]
    assert report["surge"] == {
        "left_chunks": {"160ms": 8, "640ms": 2, "160>640ms": 8},
        "switched": {"160>640ms": 2},
        "switch_at_s": 1.0,
    }
    pairs = [(p["first"], p["second"]) for p in report["paired"]]
    assert pairs == [("160ms", "640ms"), ("160ms", "160>640ms"), ("640ms", "160>640ms")]
    assert {"greedy", "rescore"} <= set(report["paired"][0])

    with pytest.raises(SystemExit) as exited:
        accuracy.main([*common[:4], "--switch-at", "1.0"])
    assert exited.value.code == 2 and "give --backend" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        accuracy.main([*common, "--chunk-ms", "640", "--switch-at", "1.0"])
    assert exited.value.code == 2 and "give both in --chunk-ms" in capsys.readouterr().err


def test_paired_difference_is_the_cer_change_with_an_interval_around_it() -> None:
    refs = ["井盖破损", "路灯不亮", "噪音扰民", "暖气不热"]
    same = paired_difference(refs, refs, list(refs))
    assert same == {"difference": 0.0, "ci95": [0.0, 0.0], "utterances_differ": 0}
    worse = ["井盖破", "路灯不亮", "噪音扰民", "暖气不热"]  # one deletion in 16 characters
    change = paired_difference(refs, refs, worse)
    assert change["difference"] == round(1 / 16, 4) and change["utterances_differ"] == 1
    low, high = change["ci95"]
    assert low == 0.0 and change["difference"] <= high <= 1 / 4, "a resample may miss it, or hold only it"
    assert paired_difference(refs, worse, refs)["difference"] == -change["difference"]
    assert paired_difference(refs, refs, worse) == change, "seeded: the same interval every run"
