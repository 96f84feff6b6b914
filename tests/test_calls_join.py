"""The call model's joins: the rules a profile may name, the key a call carries and the
``Joiner``'s bookkeeping of calls waiting for their partner (SIP's side: tests/test_cucm_join.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from calls.join import Joiner, join_key, uuid_join_key
from calls.profile import Profile
from calls.routing import load_routes


def test_join_key_is_namespaced_by_the_rule_and_cleaned() -> None:
    assert join_key("cucm", " 25396399 ") == "cucm=25396399"
    assert join_key("header:X-Ref", "25396399") == "header:X-Ref=25396399"
    assert join_key("cucm", None) is None and join_key("cucm", " \x00 ") is None


def test_joiner_pairs_a_partner_that_comes_before_the_deadline() -> None:
    joiner = Joiner()
    joiner.wait("cucm=1", "a", now=100.0, timeout_s=5.0)
    assert joiner.take("cucm=2", now=101.0) is None
    assert joiner.take("cucm=1", now=104.9) == "a"
    assert joiner.take("cucm=1", now=104.9) is None  # taken: a third call stands alone
    assert len(joiner) == 0


def test_joiner_closes_a_key_whose_deadline_passed() -> None:
    joiner = Joiner()
    joiner.wait("cucm=1", "a", now=100.0, timeout_s=5.0)
    assert joiner.take("cucm=1", now=105.0) is None  # a late partner is a call of its own
    assert len(joiner) == 0


def test_joiner_close_leaves_a_newer_call_waiting_under_the_key() -> None:
    joiner = Joiner()
    joiner.wait("cucm=1", "a", now=0.0, timeout_s=5.0)
    joiner.wait("cucm=1", "b", now=6.0, timeout_s=5.0)
    joiner.close("cucm=1", "a")
    assert joiner.take("cucm=1", now=7.0) == "b"
    joiner.wait("cucm=2", "c", now=0.0, timeout_s=5.0)
    joiner.close("cucm=2", "c")
    assert not joiner


def test_uuid_prefix_keys_streams_by_their_uuids_first_digits() -> None:
    caller, agent = "c0ffee00" + "0" * 23 + "1", "c0ffee00" + "0" * 23 + "2"
    assert uuid_join_key("uuid-prefix:8", caller) == uuid_join_key("uuid-prefix:8", agent) == "uuid-prefix:8=c0ffee00"
    assert uuid_join_key("uuid-prefix:32", caller) != uuid_join_key("uuid-prefix:32", agent)
    assert uuid_join_key("cucm", caller) is None and uuid_join_key(None, caller) is None


@pytest.mark.parametrize("rule", ["none", "cucm", "header:X-Ref", "uri-param:x-refci", "uuid-prefix:8"])
def test_profile_takes_join_rules(rule: str) -> None:
    assert Profile(join_by=rule, role="caller").join_by == rule


@pytest.mark.parametrize("written", ["none", "off", "false", "no"])
def test_a_routes_file_turns_joins_off_in_the_words_yaml_reads(tmp_path: Path, written: str) -> None:
    routes = tmp_path / "routes.yaml"
    routes.write_text(f"profiles:\n  quiet:\n    join_by: {written}\ndefault_profile: quiet\n")
    assert load_routes(routes).routes.profiles["quiet"].join_by == "none"
    assert Profile().join_by is None  # unset: the automatic CUCM join (sip/cucm.py)


@pytest.mark.parametrize(
    "rule",
    ["", "refci", "header:", "header:bad name", "uri-param:a;b", "cookie:x"]
    + ["uuid-prefix:0", "uuid-prefix:33", "uuid-prefix:x"],
)
def test_profile_refuses_bad_join_rules(rule: str) -> None:
    with pytest.raises(ValidationError, match="join rule"):
        Profile(join_by=rule)


def test_profile_refuses_bad_roles_and_timeouts() -> None:
    with pytest.raises(ValidationError):
        Profile(role="boss")
    with pytest.raises(ValidationError):
        Profile(join_timeout_s=0)
