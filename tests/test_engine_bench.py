"""`asr-bench engine`: one JSON object with the fields issue #4 names, and the CPU split between
the engine's process and the finals process; plus the stream-count search on its own."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from asr_core.frontend import compute_fbank
from asr_core.model.loader import load_wenet_model
from asr_core.offline import encode_streaming
from deploy.bench.bench_input import calibrate_ctc, synthetic_speech
from deploy.bench.engine_bench import _passes, add_arguments, base_trial, largest_passing, meets_latency_rule
from deploy.bench.make_random_model import make_random_model
from tests.bench_json import run_bench_module

pytestmark = pytest.mark.timeout(180)

FIELDS = {
    "streams",
    "chunk_ms",
    "left_chunks",
    "seconds",
    "realtime_ok",
    "latency_rule_ok",
    "cores_used",
    "feed_lag_s",
    "rtf",
    "finals_rtf",
    "batch_size_mean",
    "batch_size_p95",
    "forward_ms_mean",
    "partial_latency_ms",
    "final_latency_ms",
    "kv_bytes_per_stream",
    "peak_rss_mb",
}


def run_bench(*args: str) -> dict[str, Any]:
    return run_bench_module("deploy.bench.engine_bench", "--arch", "small", "--threads", "1", *args, timeout=170)


@pytest.mark.parametrize(
    ("finalizer", "piece_ms", "traced", "lanes"), [("process", 80, True, 2), ("thread", 20, False, 1)]
)
def test_one_trial_reports_fields_and_cpu_split(finalizer: str, piece_ms: int, traced: bool, lanes: int) -> None:
    step = [] if traced else ["--eager-step", "--eager-rescoring"]
    options = ["--finalizer", finalizer, "--piece-ms", str(piece_ms), "--finals-workers", str(lanes), *step]
    report = run_bench("--streams", "3", "--seconds", "2", *options)
    assert set(report) >= FIELDS
    assert report["streams"] == 3 and report["finalizer"] == finalizer and report["piece_ms"] == piece_ms
    assert report["traced_step"] is report["traced_rescoring"] is traced and report["finals_workers"] == lanes
    # Each stream's input ends mid-utterance (a final each); the calibrated random model also
    # endpoints in the synthetic speech's pauses, as a trained model does.
    assert report["finals"] >= 3 and report["final_tokens_per_s"] > 0 and report["rescore_tree_nodes_per_s"] > 0
    assert report["ctc_calibration"]["blank_rate"] == 0.85 and report["ctc_calibration"]["peak"] >= 0.975
    assert report["chunks"] > 0 and report["rtf"] > 0 and report["cores_used"] > 0
    assert set(report["partial_latency_ms"]) == {"p50", "p95", "p99"}
    if finalizer == "process":
        # The finals' CPU is counted once, in both numbers: rtf includes it.
        assert 0 < report["finals_rtf"] < report["rtf"]
    else:
        assert report["finals_rtf"] is None  # finals ran in this process, inside rtf


def test_finals_lanes_default_to_the_services_one_per_core() -> None:
    """Without ``--finals-workers`` the bench runs the service's default (``engine.finals_workers``
    0): a lane per usable core on a CPU, one on a GPU; a count given is kept."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert base_trial(parser.parse_args([])).finals_workers == len(os.sched_getaffinity(0))
    assert base_trial(parser.parse_args(["--device", "cuda:0"])).finals_workers == 1
    assert base_trial(parser.parse_args(["--finals-workers", "3"])).finals_workers == 3


def test_largest_passing_finds_the_boundary() -> None:
    tried: list[int] = []

    def attempt(n: int) -> bool:
        tried.append(n)
        return n <= 37

    found = largest_passing(attempt, start=8)
    assert 34 <= found <= 37  # bisection stops within ~10 %
    assert found in tried
    assert 64 in tried  # doubled past the boundary before bisecting


def test_largest_passing_when_nothing_passes() -> None:
    assert largest_passing(lambda n: False, start=4) == 0


def test_calibrated_random_ctc_decodes_like_a_trained_model(tmp_path: Path) -> None:
    """After calibration the random model's streaming CTC output has the blank share and peaked
    posteriors asked for, and varied tokens (not one token on every frame)."""
    make_random_model("small", tmp_path, seed=0)
    loaded = load_wenet_model(tmp_path)
    audio = synthetic_speech(12.0, seed=1)
    calibration = calibrate_ctc(loaded, audio, blank_rate=0.8, peak=0.95, chunk_ms=160, left_chunks=8)
    assert calibration.scale > 1.0 and calibration.tokens_per_second > 0
    with torch.inference_mode():
        fbank = torch.from_numpy(compute_fbank(audio[: 16000 * 10]))
        encoder_out, _ = encode_streaming(loaded, fbank, 4, 8)
        top = loaded.model.ctc.log_softmax(encoder_out).max(dim=-1)
    blank_share = float((top.indices == loaded.blank_id).float().mean())
    assert abs(blank_share - 0.8) < 0.02
    assert abs(float(top.values.exp().mean()) - 0.95) < 0.01
    assert abs(calibration.peak - 0.95) < 0.01
    emitted = top.indices[top.indices != loaded.blank_id]
    assert len(set(emitted.tolist())) > 3


def test_a_trial_passes_only_when_partials_and_finals_keep_up() -> None:
    def trial(tail_ms: list[float], final_p95: float) -> dict[str, Any]:
        return {
            "latency_rule_ok": meets_latency_rule(tail_ms, 160),
            "final_latency_ms": {"p50": 1.0, "p95": final_p95},
        }

    on_time = [100.0] * 19 + [250.0]
    assert _passes(trial(on_time, 900.0))
    assert _passes(trial(on_time, float("nan")))  # no final ended during the run
    assert not _passes(trial([100.0] * 19 + [1200.0], 900.0))  # one chunk later than 1 s
    assert not _passes(trial([350.0] * 20, 900.0))  # p95 over 300 ms
    # Partials on time while the finals' backlog grows: past the machine's capacity.
    assert not _passes(trial(on_time, 5000.0))


def test_hotwords_ab_reports_both_finals_cpu_numbers() -> None:
    report = run_bench("--streams", "2", "--seconds", "2", "--finalizer", "process", "--hotwords-ab", "200")
    ab = report["hotwords_ab"]
    assert ab["phrases"] == 200 and ab["graph_nodes"] > 200
    assert len(ab["finals_rtf"]) == 2 and all(v > 0 for v in ab["finals_rtf"])
    assert ab["finals_cpu_extra"] is not None


def test_hotwords_file_ab_uses_that_list(tmp_path: Path) -> None:
    phrases = tmp_path / "streets.txt"
    phrases.write_text("一丁七\n丁丂 :3\n", encoding="utf-8")  # units of the random model
    report = run_bench("--streams", "2", "--seconds", "2", "--finalizer", "process", "--hotwords", str(phrases))
    ab = report["hotwords_ab"]
    assert ab["phrases"] == 2 and ab["file"] == str(phrases) and ab["graph_nodes"] == 6
    assert all(v > 0 for v in ab["finals_rtf"])


def test_surge_ab_reports_fixed_chunks_and_degradation_side_by_side() -> None:
    report = run_bench("--streams", "2", "--seconds", "2", "--surge")
    ab = report["surge_ab"]
    assert report["off"]["surge"] is False and report["on"]["surge"] is True
    for key in ("late_chunk_fraction", "degraded_streams_peak", "degraded_stream_seconds", "chunk_moves", "finals"):
        assert len(ab[key]) == 2, key
    assert ab["degraded_streams_peak"][0] == 0 and ab["chunk_moves"][0] == [0, 0], "nothing moves without surge"
    assert 0.0 <= ab["late_chunk_fraction"][1] <= 1.0
