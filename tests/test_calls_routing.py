"""The call model's routing: roles of recorded streams, the routes file (first match wins,
``file:line key`` errors) and the profile's door-specific policy words."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import get_args

import pytest

from asr_common.yamlconf import ConfigError
from calls import routing
from calls.profile import RtpLatchName, SrtpPolicy
from calls.roles import RoleRule, assign_roles
from calls.routing import CallFacts, Router, load_routes
from rtp.latch import LatchName
from sip import sdp

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_ROUTES = ROOT / "deploy" / "config" / "routes.example.yaml"


def test_role_rules() -> None:
    by_aor = RoleRule(agent_aor=r"^sip:[0-9]{4}@pbx")
    assert assign_roles(by_aor, ["sip:+86138@carrier", "sip:1001@pbx.example"]) == ["caller", "agent"]
    assert assign_roles(by_aor, ["sip:1001@pbx.example", "sip:+86138@carrier"]) == ["agent", "caller"]
    assert assign_roles(RoleRule(), [None, None, None]) == ["caller", "agent", "mixed"]
    assert assign_roles(RoleRule(label_order=("agent", "caller")), [None, None]) == ["agent", "caller"]


def facts(**overrides: object) -> CallFacts:
    values: dict[str, object] = {
        "source_ip": "10.10.0.7",
        "to_user": "4000",
        "from_user": "alice",
        "headers": {},
        "siprec": False,
    }
    values.update(overrides)
    return CallFacts(**values)  # type: ignore[arg-type]


def test_example_routes_first_match_wins() -> None:
    router = load_routes(EXAMPLE_ROUTES)
    sales = router.decide(facts(source_ip="10.20.0.10", siprec=True, headers={"x-queue": "sales-east"}))
    assert (sales.route, sales.profile.name, sales.profile.chunk_ms) == ("siprec-sales-queue", "sales", 160)  # type: ignore[union-attr]
    assert router.decide(facts(source_ip="10.20.0.10", siprec=False, headers={"X-Queue": "sales"})).route is None
    assert router.decide(facts(to_user="95555")).route == "complaints-did"
    assert router.decide(facts()).route == "pbx-default"
    fallback = router.decide(facts(source_ip="172.16.0.1"))
    assert (fallback.route, fallback.profile.name) == (None, "default")  # type: ignore[union-attr]


def test_no_default_rejects(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text("default_profile: null\nreject_code: 403\nroutes: []\n")
    decision = load_routes(path).decide(facts())
    assert (decision.profile, decision.reject_code) == (None, 403)


def test_routes_errors_name_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(
        "profiles:\n  default:\n    chunk_ms: 150\n    colour: red\nroutes:\n"
        "  - name: a\n    match:\n      to_user: '('\n    profile: default\n"
    )
    with pytest.raises(ConfigError) as info:
        load_routes(path)
    errors = "\n".join(info.value.errors)
    assert f"{path}:3 profiles.default.chunk_ms: 150 is invalid" in errors
    assert f"{path}:4 profiles.default.colour: unknown key" in errors
    assert f"{path}:8 routes.0.match.to_user:" in errors and "regular expression" in errors
    path.write_text(
        "routes:\n  - name: a\n    profile: nope\n  - name: b\n    match: {trunk: t1}\n    profile: default\n"
    )
    with pytest.raises(ConfigError) as info:
        load_routes(path)
    assert info.value.errors == [
        f"{path}:3 routes.0.profile: unknown profile 'nope' (known: default)",
        f"{path}:5 routes.1.match.trunk: unknown trunk 't1' (known: none)",
    ]


def test_router_defaults() -> None:
    decision = Router().decide(facts())
    assert decision.profile is not None and decision.profile.chunk_ms == 320


def test_profile_rtp_latch_overrides_only_when_set(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text("profiles:\n  default: {}\n  nat: {rtp_latch: first}\ndefault_profile: nat\n")
    routes = load_routes(path)
    assert routes.decide(facts()).profile.rtp_latch == "first"  # type: ignore[union-attr]
    assert load_routes(EXAMPLE_ROUTES).decide(facts()).profile.rtp_latch is None  # type: ignore[union-attr]
    path.write_text("profiles:\n  default:\n    rtp_latch: sometimes\n")
    with pytest.raises(ConfigError) as info:
        load_routes(path)
    assert info.value.errors[0].startswith(f"{path}:3 profiles.default.rtp_latch:")


@pytest.mark.parametrize("path", [EXAMPLE_ROUTES, ROOT / "asr_gateway" / "dev" / "data" / "routes.yaml"])
def test_shipped_routes_files_load(path: Path) -> None:
    assert load_routes(path).decide(facts()).profile is not None


def test_profile_policy_words_are_the_front_doors_words() -> None:
    """The profile declares SIP's and RTP's policy values itself (the call model imports no door)."""
    assert get_args(SrtpPolicy) == get_args(sdp.SrtpPolicy)
    assert get_args(RtpLatchName) == get_args(LatchName)


ADDRESS_RULES = """
trunks: {carrier: [192.0.2.0/24]}
routes:
  - {name: by-trunk, match: {trunk: carrier}, profile: default}
  - {name: by-cidr, match: {source_cidrs: ["10.0.0.0/8", "fe80::/10"]}, profile: default}
  - {name: by-header, match: {headers: {X-Queue: ^sales$}}, profile: default}
  - {name: by-user, match: {to_user: ^4000$}, profile: default}
"""


def test_an_unparsable_source_fails_address_rules_only_and_is_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(ADDRESS_RULES)
    router = load_routes(path)
    garbled = "10.0.0.7, 192.0.2.1"  # a proxy's header, not an address
    with caplog.at_level(logging.WARNING, logger="calls.routing"):
        assert router.decide(facts(source_ip=garbled, headers={"x-queue": "sales"})).route == "by-header"
        assert router.decide(facts(source_ip=garbled, to_user="4000")).route == "by-user"
        assert router.decide(facts(source_ip=garbled, to_user="5000")).route is None
        assert router.decide(facts(source_ip="", to_user="5000")).route is None
    assert router.unparsable_sources == 4
    logged = [record.getMessage() for record in caplog.records]
    assert len(logged) == 2 and repr(garbled) in logged[0] and "''" in logged[1]
    assert router.decide(facts(source_ip="192.0.2.9")).route == "by-trunk"
    assert router.decide(facts(source_ip="10.1.2.3")).route == "by-cidr"
    assert router.unparsable_sources == 4


def test_zone_ids_and_ipv4_mapped_addresses_match_address_rules(tmp_path: Path) -> None:
    """Python reads an IPv6 zone id and a network's ``in`` test ignores it, so nothing is stripped;
    an IPv4-mapped address (a dual-stack listener's IPv4 peer) matches the IPv4 rules."""
    path = tmp_path / "routes.yaml"
    path.write_text(ADDRESS_RULES)
    router = load_routes(path)
    assert router.decide(facts(source_ip="fe80::1%eth0", to_user="5000")).route == "by-cidr"
    assert router.decide(facts(source_ip="::ffff:192.0.2.9")).route == "by-trunk"
    assert router.decide(facts(source_ip="::ffff:10.0.0.7", to_user="5000")).route == "by-cidr"
    assert router.decide(facts(source_ip="2001:db8::1", to_user="5000")).route is None
    assert router.unparsable_sources == 0


def test_unparsable_sources_are_logged_for_a_bounded_number_of_addresses(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routing, "MAX_LOGGED_UNPARSABLE", 3)
    router = Router()
    with caplog.at_level(logging.WARNING, logger="calls.routing"):
        for i in range(5):
            router.decide(facts(source_ip=f"proxy-{i}"))
            router.decide(facts(source_ip=f"proxy-{i}"))
    assert router.unparsable_sources == 10 and len(caplog.records) == 3
