"""`asr-bench media --door`: legs of the AudioSocket and WebSocket doors into counting sinks,
and `--door all` putting RTP and both doors side by side in one JSON (a handful of legs; the
1,000-leg run is the lead's, docs/BENCHMARKS.md)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from deploy.bench.door_load import WS_BINARY, audiosocket_message, tone_frames, ws_client_frame
from tests.bench_json import run_bench_module

pytestmark = pytest.mark.timeout(90)


def test_every_door_beside_rtp_in_one_run() -> None:
    report = run_bench_module(
        "deploy.bench.media_load", "--door", "all", "--calls", "3", "--seconds", "1", "--rate", "50", timeout=80
    )
    assert report["door"] == "all" and report["rtp"]["mode"] == "sip"
    assert report["rtp"]["packets_received"] == report["rtp"]["packets_sent"] == 3 * 50
    for door in ("audiosocket", "websocket"):
        run = report[door]
        assert (run["door"], run["legs_up"], run["setup_failures"], run["refusals"]) == (door, 3, 0, {})
        assert run["frames_sent"] == 3 * 50, run
        assert run["frames_received"] >= 0.9 * 3 * 50, run  # less what the upsampler still holds
        assert run["calls_ended"] == 3 and run["send_errors"] == 0
    per_20ms = report["server_cpu_us_per_20ms"]
    assert per_20ms.keys() == {"rtp", "audiosocket", "websocket"}
    assert all(isinstance(value, float) and value > 0 for value in per_20ms.values())


def test_one_door_at_16_khz() -> None:
    report = run_bench_module(
        "deploy.bench.media_load", "--door", "audiosocket", "--door-rate", "16000", "--calls", "2", "--seconds", "1",
        timeout=60,
    )  # fmt: skip
    assert (report["door"], report["sample_rate"]) == ("audiosocket", 16000)
    assert report["frames_received"] == 2 * 50  # 16 kHz goes to the sinks as sent: nothing held


def test_wire_frames_follow_the_public_descriptions() -> None:
    pcm = tone_frames(8000)
    assert len(pcm) == 50 and {len(frame) for frame in pcm} == {320}  # 20 ms of 16-bit samples
    assert audiosocket_message(0x10, pcm[0])[:3] == b"\x10\x01\x40"  # kind, big-endian length 320
    frame = ws_client_frame(WS_BINARY, pcm[0])
    first, second, length = struct.unpack("!BBH", frame[:4])
    assert (first, second, length) == (0x82, 0x80 | 126, 320)  # final binary, masked, 16-bit length
    mask = np.frombuffer(frame[4:8] * 80, dtype=np.uint8)
    assert (np.frombuffer(frame[8:], dtype=np.uint8) ^ mask).tobytes() == pcm[0]
