"""``/health/ready``'s reasons from a node's state, without a node."""

from __future__ import annotations

from dataclasses import replace

from asr_gateway.readiness import NodeState, not_ready

READY = NodeState(
    draining=False,
    sip_listening=True,
    engine_warm=True,
    engine_slots=8,
    free_engine_slots=3,
    active_calls=5,
    max_calls=100,
    redis_connected=True,
    spool_pending_bytes=0,
    spool_max_bytes=1000,
)


def test_a_serving_node_is_ready() -> None:
    assert not_ready(READY) == []


def test_each_reason_names_what_is_missing() -> None:
    assert not_ready(replace(READY, draining=True)) == ["draining"]
    assert not_ready(replace(READY, sip_listening=False)) == ["SIP not listening"]
    assert not_ready(replace(READY, engine_warm=False)) == ["engine not warmed up"]
    assert not_ready(replace(READY, free_engine_slots=0)) == ["full: all 8 engine slots in use"]
    assert not_ready(replace(READY, active_calls=100)) == ["full: 100 calls, sip.max_calls 100"]
    starting = replace(READY, sip_listening=False, engine_warm=False)
    assert not_ready(starting) == ["SIP not listening", "engine not warmed up"]


def test_redis_down_costs_readiness_only_once_the_spool_is_nearly_full() -> None:
    down = replace(READY, redis_connected=False)
    assert not_ready(replace(down, spool_pending_bytes=899)) == []
    assert not_ready(replace(down, spool_pending_bytes=900)) == [
        "Redis unreachable and the spool 900 of 1000 bytes full"
    ]
    assert not_ready(replace(READY, spool_pending_bytes=1000)) == []  # connected: the spool drains
