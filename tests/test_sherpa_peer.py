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
