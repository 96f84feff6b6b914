"""The call model's joins: the rules a profile may name and the key a call carries (SIP's
side: tests/test_cucm_join.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from calls.join import join_key
from calls.profile import Profile


def test_join_key_is_namespaced_by_the_rule_and_cleaned() -> None:
    assert join_key("cucm", " 25396399 ") == "cucm=25396399"
    assert join_key("header:X-Ref", "25396399") == "header:X-Ref=25396399"
    assert join_key("cucm", None) is None and join_key("cucm", " \x00 ") is None


@pytest.mark.parametrize("rule", ["cucm", "header:X-Ref", "uri-param:x-refci"])
def test_profile_takes_join_rules(rule: str) -> None:
    assert Profile(join_by=rule, role="caller").join_by == rule


@pytest.mark.parametrize("rule", ["", "refci", "header:", "header:bad name", "uri-param:a;b", "cookie:x"])
def test_profile_refuses_bad_join_rules(rule: str) -> None:
    with pytest.raises(ValidationError, match="join rule"):
        Profile(join_by=rule)


def test_profile_refuses_bad_roles_and_timeouts() -> None:
    with pytest.raises(ValidationError):
        Profile(role="boss")
    with pytest.raises(ValidationError):
        Profile(join_timeout_s=0)
