"""The RTP source policy (`rtp.latch`), sans-IO: which sources each mode takes and latches."""

from __future__ import annotations

import pytest

from rtp.latch import RELATCH_PACKETS, RELATCH_SILENCE_S, DropReason, LatchMode, SourcePolicy

SDP = ("192.0.2.10", 4000)
SAME_HOST = ("192.0.2.10", 4100)
STRANGER = ("203.0.113.9", 4000)
QUIET, TALKING = RELATCH_SILENCE_S, 0.0


@pytest.mark.parametrize(
    ("mode", "source", "reason"),
    [
        ("strict", SDP, None),
        ("strict", SAME_HOST, DropReason.FOREIGN_PORT),
        ("strict", STRANGER, DropReason.FOREIGN_ADDRESS),
        ("address", SAME_HOST, None),
        ("address", ("::ffff:192.0.2.10", 4100, 0, 0), None),
        ("address", STRANGER, DropReason.FOREIGN_ADDRESS),
        ("first", STRANGER, None),
    ],
)
def test_screen_by_mode(mode: str, source: tuple[str, int], reason: DropReason | None) -> None:
    policy = SourcePolicy(mode)
    policy.set_signalled(SDP)
    assert policy.screen(source) == reason
    assert policy.admit(source, 1, 0, None, QUIET) == reason
    assert policy.latched == (None if reason else source)


def test_screen_filter_is_what_the_c_receiver_gets() -> None:
    policy = SourcePolicy()
    assert policy.screen_filter() is None  # nothing signalled yet: first-like
    policy.set_signalled(("::ffff:192.0.2.10", 4000))
    assert (policy.signalled, policy.screen_filter()) == (SDP, ("192.0.2.10", 0))
    policy.set_mode("strict")
    assert policy.screen_filter() == SDP
    policy.set_mode(LatchMode.FIRST)
    assert policy.screen_filter() is None
    named = SourcePolicy("strict")
    named.set_signalled(("pbx.example", 4000))  # a host name cannot be compared: first-like
    assert (named.enforced, named.screen(STRANGER)) == (False, None)


def test_address_mode_relatches_only_a_restarted_stream() -> None:
    policy = SourcePolicy("address")
    policy.set_signalled(SDP)
    assert policy.admit(SAME_HOST, 1, 0, None, QUIET) is None
    assert policy.admit(SDP, 1, 1, 1, QUIET) == DropReason.FOREIGN_PORT  # same SSRC: a copy
    for seq in range(10, 10 + RELATCH_PACKETS):
        assert policy.admit(SDP, 2, seq, 1, TALKING) == DropReason.FOREIGN_PORT  # the latched one talks
    for ssrc in range(3, 3 + RELATCH_PACKETS):  # junk: a new SSRC each time
        assert policy.admit(SDP, ssrc, 20 + ssrc, 1, QUIET) == DropReason.FOREIGN_PORT
    for seq in (30, 31, 33, 34):  # a gap restarts the count
        assert policy.admit(SDP, 2, seq, 1, QUIET) == DropReason.FOREIGN_PORT
    assert policy.admit(SDP, 2, 35, 1, QUIET) is None
    assert policy.latched == SDP


def test_first_mode_gives_the_latch_to_the_signalled_address_only() -> None:
    policy = SourcePolicy("first")
    policy.set_signalled(SDP)
    assert policy.admit(STRANGER, 1, 0, None, QUIET) is None  # the risk: a stranger latches
    assert policy.admit(("198.51.100.7", 5000), 3, 0, 1, QUIET) == DropReason.FOREIGN_ADDRESS
    assert policy.admit(SDP, 2, 0, 1, TALKING) is None
    assert policy.latched == SDP


def test_signalled_address_and_mode_changes_release_a_refused_latch() -> None:
    policy = SourcePolicy("address")
    assert policy.admit(STRANGER, 1, 0, None, QUIET) is None  # before the answer: first-like
    assert policy.set_signalled(SDP) and policy.latched is None
    assert not policy.set_signalled(("0.0.0.0", 4000)) and not policy.set_signalled(None)
    assert not policy.set_signalled((SDP[0], 0)) and policy.signalled == SDP
    assert policy.admit(SAME_HOST, 1, 0, None, QUIET) is None
    policy.set_mode("strict")
    assert policy.latched is None
    assert policy.admit_rtcp(("192.0.2.10", 4001)) and not policy.admit_rtcp(STRANGER)
    with pytest.raises(ValueError, match="70000 is outside 0-65535"):
        policy.set_signalled(("192.0.2.10", 70000))
    with pytest.raises(ValueError):
        policy.set_mode("sometimes")
