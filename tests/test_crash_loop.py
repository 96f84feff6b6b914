"""``asr-bench crashloop`` in short: the service SIGKILLed twice (once during a Redis outage)
and restarted; every durable event it journaled is in Redis exactly once, every call ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_gateway.service import DEMO_MODEL_DIR
from deploy.bench import crash_loop
from tests.tool_marks import needs_redis_server, needs_sipp

pytestmark = [
    needs_sipp,
    needs_redis_server,
    pytest.mark.skipif(not (DEMO_MODEL_DIR / "final.pt").is_file(), reason="the bundled demo model is missing"),
    pytest.mark.timeout(300),
]


def test_two_sigkills_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    args = crash_loop.build_parser().parse_args(["--kills", "2", "--calls", "2", "--min-kill-s", "3",
                                                 "--max-kill-s", "7", "--seed", "7"])  # fmt: skip
    result = crash_loop.run(args, tmp_path)
    assert result["kills"] == 2 and result["kills_with_redis_down"] == 1
    assert result["events_made"] >= 4, result
    assert result["missing"] == 0 and result["duplicates"] == 0 and result["call_stream_duplicates"] == 0, result
    assert result["calls_left_open"] == 0 and result["calls_out_of_seq_order"] == 0, result
    assert result["calls_ended_by_reason"].get("node_restart", 0) >= 1, result
    assert result["final_stop_exit_code"] == 0
