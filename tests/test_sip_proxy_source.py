"""The caller's address behind a SIP proxy, sans-IO: a trusted proxy's ``X-Source-Addr`` replaces
the packet source for the ACL and the routing rules (``trunk``, ``source_cidrs``); the same header
from anyone else is ignored and counted; the proxy itself is admitted; answers still go to it."""

from __future__ import annotations

import logging

import pytest

from calls.handler import CountingCallHandler
from calls.routing import Router, RoutesFile
from sip.actions import SendMessage
from sip.admission import parse_source_address
from sip.config import SipSettings
from sip.message import Address, Response
from sip.uas import UasCore
from tests.test_sip_support import FakePorts, invite

PROXY = Address("udp", "10.9.0.1", 5060)
PBX_IP = "10.20.0.7"
STRANGER = Address("udp", "10.30.0.5", 5060)
ROUTES = RoutesFile.model_validate(
    {
        "profiles": {"default": {}, "pbx": {}, "direct": {}},
        "trunks": {"pbx": ["10.20.0.0/24"]},
        "routes": [
            {"name": "from-pbx", "match": {"trunk": "pbx"}, "profile": "pbx"},
            {"name": "proxy-itself", "match": {"source_cidrs": ["10.9.0.0/24"]}, "profile": "direct"},
        ],
        "default_profile": None,
        "reject_code": 404,
    }
)


def core(**settings: object) -> tuple[UasCore, CountingCallHandler]:
    handler = CountingCallHandler()
    values = {"trusted_proxies": ["10.9.0.1/32"], "acl_cidrs": ["10.20.0.0/24"], **settings}
    return UasCore(SipSettings.model_validate(values), handler, FakePorts(), Router(ROUTES)), handler


def answers(core: UasCore, data: bytes, source: Address) -> list[tuple[int, Address]]:
    return [
        (a.message.status, a.dest)
        for a in core.receive(data, source, 0.0)
        if isinstance(a, SendMessage) and isinstance(a.message, Response) and a.message.status >= 200
    ]


def stated(value: str, n: int = 1) -> bytes:
    return invite(extra=f"X-Source-Addr: {value}\r\n", branch=f"z9hG4bK-p{n}", call_id=f"p{n}")


def test_a_trusted_proxy_states_the_source_for_routing_and_the_acl() -> None:
    uas, handler = core()
    assert answers(uas, stated(f"{PBX_IP}:5060"), PROXY) == [(200, PROXY)]  # the answer goes to the proxy
    (call,) = handler.calls.values()
    assert call.route == "from-pbx"
    assert call.peer[0] == PROXY.host  # the dialog's peer stays the proxy
    # A stated source outside the ACL is refused although the proxy itself is admitted.
    assert answers(uas, stated("203.0.113.5:5060", 2), PROXY) == [(403, PROXY)]
    assert uas.counters["acl.denied"] == 1


def test_without_the_header_the_proxy_is_its_own_source_and_is_admitted() -> None:
    uas, handler = core()
    options = invite(method="OPTIONS", body="", branch="z9hG4bK-o", call_id="o1")
    assert answers(uas, options, PROXY) == [(200, PROXY)]  # not in acl_cidrs, but a trusted proxy
    assert answers(uas, invite(), PROXY) == [(200, PROXY)]
    assert [c.route for c in handler.calls.values()] == ["proxy-itself"]


def test_the_header_from_anyone_else_is_ignored_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    uas, handler = core(acl_cidrs=["10.30.0.0/24", "10.20.0.0/24"])
    with caplog.at_level(logging.DEBUG, logger="sip.uas"):
        # A stranger claiming to be the PBX is routed (and rate-limited) as itself: no route matches.
        assert answers(uas, stated(f"{PBX_IP}:5060"), STRANGER) == [(404, STRANGER)]
    assert uas.counters["proxy.source_ignored"] == 1
    assert "not from a trusted proxy" in caplog.text
    assert not handler.calls


def test_a_stranger_outside_the_acl_cannot_talk_its_way_in() -> None:
    uas, _ = core()
    assert answers(uas, stated(f"{PBX_IP}:5060"), STRANGER) == [(403, STRANGER)]


def test_an_unreadable_header_from_the_proxy_falls_back_to_the_proxy_address() -> None:
    uas, handler = core()
    assert answers(uas, stated("not-an-address"), PROXY) == [(200, PROXY)]
    assert [c.route for c in handler.calls.values()] == ["proxy-itself"]
    assert uas.counters["proxy.source_ignored"] == 1


def test_no_trusted_proxies_by_default_means_the_header_is_never_believed() -> None:
    uas, handler = core(trusted_proxies=[], acl_cidrs=["10.9.0.0/24", "10.20.0.0/24"])
    assert answers(uas, stated(f"{PBX_IP}:5060"), PROXY) == [(200, PROXY)]
    assert [c.route for c in handler.calls.values()] == ["proxy-itself"]


def test_a_configured_header_name_is_the_one_read() -> None:
    uas, handler = core(source_header="X-Real-Source")
    data = invite(extra=f"X-Real-Source: {PBX_IP}\r\nX-Source-Addr: 10.9.0.1\r\n")
    assert answers(uas, data, PROXY) == [(200, PROXY)]
    assert [c.route for c in handler.calls.values()] == ["from-pbx"]


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("10.20.0.7:5060", "10.20.0.7"),
        (" 10.20.0.7 ", "10.20.0.7"),
        ("[2001:db8::7]:5060", "2001:db8::7"),
        ("2001:db8::7", "2001:db8::7"),
        ("host.example:5060", None),
        ("[2001:db8::7", None),
        ("", None),
    ],
)
def test_source_address_values(value: str, address: str | None) -> None:
    assert parse_source_address(value) == address


def test_a_bad_header_name_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="source_header"):
        SipSettings.model_validate({"source_header": "X Source"})
