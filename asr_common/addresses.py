"""IP addresses and networks as every door and the routes file read them, written once.

A door's ``source_cidrs``, SIP's ACL and trusted sources, and the routes file's rules on
addresses all ask one question: does this peer's address lie in these networks? The answer
must not differ between them, so they all ask ``host_inside`` (or ``inside`` once parsed).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_address(text: str) -> Address | None:
    """The IP address ``text`` states, or None when it states none.

    An IPv6 zone id (``fe80::1%eth0``) is kept: ``ipaddress`` reads it since Python 3.9 and
    a network's ``in`` test ignores it, so ``fe80::/10`` holds ``fe80::1%eth0``."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def inside(address: Address, networks: Iterable[Network]) -> bool:
    """Whether ``address`` lies in one of ``networks``. An IPv4-mapped IPv6 address
    (``::ffff:10.0.0.7``, how a dual-stack listener sees an IPv4 peer) also counts as its IPv4
    address, so IPv4 CIDRs hold it."""
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return any(address in net or (mapped is not None and mapped in net) for net in networks)


def host_inside(host: str, networks: Iterable[Network]) -> bool:
    """``inside`` for a host as text (a socket's peer name); False when it is no IP address."""
    address = parse_address(host)
    return address is not None and inside(address, networks)


def is_loopback_host(host: str) -> bool:
    """Whether listening on ``host`` keeps a port off the network: ``localhost`` or a loopback address."""
    address = parse_address(host)
    return host == "localhost" or (address is not None and address.is_loopback)
