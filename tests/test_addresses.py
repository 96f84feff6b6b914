"""``asr_common.addresses``: the one answer to "is this peer in these networks?" that the doors'
``source_cidrs``, SIP's ACL and trusted sources, and the routes file's address rules share."""

from __future__ import annotations

import ipaddress

import pytest

from asr_common.addresses import Network, host_inside, inside, is_loopback_host, parse_address

LAN: tuple[Network, ...] = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fe80::/10"))


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10.0.0.7", "10.0.0.7"),
        ("2001:db8::1", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1%eth0"),  # the zone id is kept
        ("::ffff:10.0.0.7", "::ffff:a00:7"),
        ("10.0.0.7, 192.0.2.1", None),  # a proxy's header, not an address
        ("10.0.0.7:5060", None),
        ("", None),
    ],
)
def test_parse_address_reads_one_ip_address_or_none(text: str, parsed: str | None) -> None:
    address = parse_address(text)
    assert (None if address is None else str(address)) == parsed


@pytest.mark.parametrize(
    ("host", "held"),
    [
        ("10.1.2.3", True),
        ("::ffff:10.0.0.7", True),  # a dual-stack listener's view of an IPv4 peer
        ("fe80::1%eth0", True),  # a network's `in` ignores the zone id
        ("192.0.2.1", False),
        ("::ffff:192.0.2.1", False),
        ("2001:db8::1", False),
        ("proxy-1", False),
        ("", False),
    ],
)
def test_host_inside_parses_and_checks_containment(host: str, held: bool) -> None:
    assert host_inside(host, LAN) is held
    address = parse_address(host)
    assert address is None or inside(address, LAN) is held


def test_an_ipv4_mapped_address_is_also_inside_the_ipv6_networks_that_hold_it() -> None:
    mapped_block = (ipaddress.ip_network("::ffff:0:0/96"),)
    assert host_inside("::ffff:192.0.2.1", mapped_block)
    assert not host_inside("192.0.2.1", mapped_block)
    assert not host_inside("10.0.0.1", ())


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("localhost", True), ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("0.0.0.0", False),
     ("::", False), ("10.0.0.1", False), ("asr.example", False)],
)  # fmt: skip
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
