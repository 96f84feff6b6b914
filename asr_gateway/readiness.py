"""Whether a node should get new calls: the reasons ``/health/ready`` answers 503 with.

Ready means SIP listens, the engine is warm, events reach Redis or the spool has room for them,
and a new call would be taken (not full, not draining), i.e. what the SIP OPTIONS answer says
and more. A full or draining node is still live: it must not be restarted in the middle of its
calls. Sans-IO: the service reads its components into a ``NodeState`` and asks.
"""

from __future__ import annotations

from dataclasses import dataclass

# While Redis is unreachable a node stays ready until its spool is this full (of redis.spool_max_bytes).
SPOOL_READY_SHARE = 0.9


@dataclass(frozen=True)
class NodeState:
    """What readiness depends on, read at one moment."""

    draining: bool
    sip_listening: bool
    engine_warm: bool  # warm-up done, engine threads started
    engine_slots: int
    free_engine_slots: int
    active_calls: int  # every door's
    max_calls: int  # the node's limit on calls of every door: sip.max_calls, at most engine.max_streams
    redis_connected: bool
    spool_pending_bytes: int  # journal bytes Redis has not acknowledged
    spool_max_bytes: int


def not_ready(state: NodeState) -> list[str]:
    """Why the node should get no new call now, one reason a line; empty: ready."""
    reasons = []
    if state.draining:
        reasons.append("draining")
    if not state.sip_listening:
        reasons.append("SIP not listening")
    if not state.engine_warm:
        reasons.append("engine not warmed up")
    if state.free_engine_slots <= 0:
        reasons.append(f"full: all {state.engine_slots} engine slots in use")
    if state.active_calls >= state.max_calls:
        reasons.append(f"full: {state.active_calls} calls, sip.max_calls {state.max_calls}")
    if not state.redis_connected and state.spool_pending_bytes >= state.spool_max_bytes * SPOOL_READY_SHARE:
        reasons.append(
            f"Redis unreachable and the spool {state.spool_pending_bytes} of {state.spool_max_bytes} bytes full"
        )
    return reasons
