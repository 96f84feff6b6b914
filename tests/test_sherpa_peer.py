"""The sherpa-onnx peer benchmark runs end to end on a tiny model and prints one JSON object."""

from __future__ import annotations

import json

import pytest
import torch

from deploy.bench import sherpa_peer

torch.set_num_threads(1)


def test_chunk_ready_sample_matches_sherpa_fbank() -> None:
    # 160 ms chunks (4 frames), subsampling 4, right context 6: chunk 0 needs 19 fbank frames,
    # sherpa-onnx decodes it once the 20th is complete.
    assert sherpa_peer._chunk_ready_sample(0, 4, 4, 6) == 19 * 160 + 280
    assert sherpa_peer._chunk_ready_sample(1, 4, 4, 6) - sherpa_peer._chunk_ready_sample(0, 4, 4, 6) == 16 * 160


def test_peer_benchmark_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    assert sherpa_peer.main(["--arch", "small", "--streams", "2", "--seconds", "1", "--backend", "torch"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sherpa_onnx"]["streams"] == 2
    assert report["sherpa_onnx"]["chunks"] == 2 * 5  # 1 s: full 160 ms chunks with one frame to spare
    assert report["ours_backend"] == "torch" and report["ours"]["rtf"] > 0
    assert report["cpu_per_stream_ratio"] > 0


def test_peer_benchmark_without_rescoring(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    argv = ["--arch", "small", "--streams", "2", "--seconds", "1", "--backend", "torch", "--no-rescore"]
    assert sherpa_peer.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ours_rescore"] is False
    assert report["ours"]["rtf"] > 0


def test_one_latency_rule_for_both_engines() -> None:
    from deploy.bench.engine_bench import meets_latency_rule

    on_time = [100.0] * 95 + [290.0] * 5
    assert meets_latency_rule(on_time, 160)
    assert not meets_latency_rule([100.0] * 90 + [310.0] * 10, 160)  # p95 over 300 ms
    assert not meets_latency_rule([100.0] * 99 + [1001.0], 160)  # one chunk later than 1 s
    assert meets_latency_rule([100.0] * 99 + [1500.0], 640)  # 3 chunks of 640 ms allowed
    assert not meets_latency_rule([], 160)  # nothing judged: fails


def test_best_of_picks_the_largest_first_on_ties() -> None:
    assert sherpa_peer.best_of({"workers=1": 8, "workers=2": 12, "workers=3": 12}) == ("workers=2", 12)
    assert sherpa_peer.best_of({}) == (None, 0)


def test_bad_counts_are_refused() -> None:
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    with pytest.raises(SystemExit):
        sherpa_peer.parse_args(["--workers", "0"])
    assert sherpa_peer.parse_args(["--int8"]).backend == ["torch-int8"]
    assert sherpa_peer.parse_args([]).backend == ["onnxruntime"]


def test_int8_two_workers_and_two_backends(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    argv = ["--arch", "small", "--streams", "3", "--seconds", "1", "--int8", "--workers", "1", "2"]
    assert sherpa_peer.main([*argv, "--backend", "torch-int8", "torch", "--no-rescore"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["int8"] is True and report["sherpa_onnx_model"].endswith(".int8.onnx")
    for workers in (1, 2):
        peer = report[f"sherpa_onnx_workers_{workers}"]
        assert peer["workers"] == workers and peer["chunks"] == 3 * 5 and peer["cores_used"] > 0
    assert report["ours_torch-int8_step_threads_1"]["rtf"] > 0 and report["ours_torch_step_threads_1"]["rtf"] > 0
    assert report["ours_backend"] == "torch-int8" and report["ours"]["cores_used"] > 0


def test_cores_at_reads_the_trial_at_the_maximum() -> None:
    # --find-max reports the cores each engine used at its maximum: the trial of that stream count
    # (bisection may have tried larger counts that failed, with more cores used).
    trials = [
        {"streams": 16, "cores_used": 1.1},
        {"streams": 32, "cores_used": 1.9},
        {"streams": 24, "cores_used": 1.6},
    ]
    assert sherpa_peer.cores_at(trials, 24) == 1.6
    assert sherpa_peer.cores_at(trials, 0) is None  # nothing passed: no trial of 0 streams


def test_max_batch_caps_the_streams_per_decode_call(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    argv = ["--arch", "small", "--streams", "3", "--seconds", "1", "--no-ours", "--max-batch", "1"]
    assert sherpa_peer.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sherpa_onnx_max_batch"] == 1
    peer = report["sherpa_onnx"]
    assert peer["chunks"] == 3 * 5 and peer["decode_calls"] == peer["chunks"]  # one stream per call
    with pytest.raises(SystemExit):
        sherpa_peer.parse_args(["--max-batch", "0"])
    assert sherpa_peer.parse_args([]).max_batch is None  # every ready stream, as before
