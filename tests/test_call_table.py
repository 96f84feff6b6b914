"""``asr_gateway.call_table.CallTable``, the bridge's calls without threads: legs and incoming
calls point at their call, a partner with the same join key joins a waiting call, a call ends
with its last incoming call and is taken out only once its last leg has ended, and nothing is
left behind."""

from __future__ import annotations

from asr_gateway.call_table import CallTable
from calls.call import CallInfo
from calls.metadata import CallMetadata
from calls.profile import Profile
from kb_hooks.types import CallContext, Participant


def call(call_id: str, join_key: str | None = None, timeout_s: float = 5.0) -> CallInfo:
    profile = Profile(join_timeout_s=timeout_s)
    return CallInfo.unaddressed(
        call_id, "sip", call_id, ("127.0.0.1", 5060, "udp"), None, profile, (), CallMetadata(), join_key
    )


def context(info: CallInfo) -> CallContext:
    return CallContext(call_id=info.call_id)


def test_a_plain_call_is_announced_at_once_and_ends_with_its_leg() -> None:
    table = CallTable()
    call_id, state, waits = table.add_leg(call("c"), "c-0", Participant("caller"), context, now=0.0)
    assert (call_id, waits, len(table)) == ("c", False, 1)
    assert table.of_leg("c-0") is state and table.participant(state, "c-0") == Participant("caller")
    assert table.to_announce(state) == [Participant("caller")]
    state.started = True
    assert table.to_announce(state) is None, "announced once"
    assert table.member_ended("c", "bye") is state
    assert table.take_ended(state) is None, "its leg has not sent its last event yet"
    table.leg_ended(state, "c-0")
    assert table.take_ended(state) == "bye"
    assert len(table) == 0 and table.empty()


def test_a_partner_joins_a_waiting_call_which_ends_with_the_last_of_them() -> None:
    table = CallTable()
    first, second = call("a", "cucm=1"), call("b", "cucm=1")
    _, state, waits = table.add_leg(first, "a-0", Participant("agent"), context, now=0.0)
    assert waits and table.to_announce(state) is None, "it waits for its partner"
    joined_id, joined, waits = table.add_leg(second, "b-0", Participant("caller"), context, now=1.0)
    assert (joined_id, joined, waits) == ("a", state, False)
    assert table.to_announce(state) == [Participant("agent"), Participant("caller")]
    for leg in ("a-0", "b-0"):
        table.leg_ended(state, leg)
    assert table.member_ended("a", "bye") is None, "the partner is still up"
    assert table.member_ended("b", "bye") is state
    assert table.take_ended(state) == "bye" and table.empty()


def test_a_partner_after_the_join_closed_is_a_call_of_its_own() -> None:
    table = CallTable()
    _, first, _ = table.add_leg(call("a", "k"), "a-0", Participant("agent"), context, now=0.0)
    table.close_join(first)  # the join timed out
    assert table.to_announce(first) == [Participant("agent")]
    late_id, late, waits = table.add_leg(call("b", "k"), "b-0", Participant("caller"), context, now=9.0)
    assert late_id == "b" and late is not first and waits
    assert len(table) == 2


def test_a_watcher_is_kept_until_forgotten() -> None:
    table = CallTable()
    seen: list[dict[str, object]] = []
    table.watch("w", seen.append)
    listener = table.listener("w")
    assert listener is not None and not table.empty()
    listener({"event_type": "call.started"})
    table.unwatch("w")
    assert table.listener("w") is None and table.empty() and seen == [{"event_type": "call.started"}]
