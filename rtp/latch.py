"""RTP source policy: which source addresses a call leg takes media from (sans-IO).

The RTP sockets listen on every address, so anyone who can reach a port can send to it. The
policy decides, from the address the peer signalled in its SDP (or SIPREC) and a mode, which
datagrams are the call's media; the others are counted by reason and dropped before anything
is parsed or decoded.

Modes (``rtp.latch`` in the service config, a routing profile's ``rtp_latch`` overrides it):

- ``strict``: only the signalled address and port.
- ``address`` (default): only the signalled IP, from any port: the first packet from it
  latches its port; another port of the same IP takes the latch over only with a new SSRC,
  once the latched source has been silent for `RELATCH_SILENCE_S` and the new stream has sent
  `RELATCH_PACKETS` consecutive packets (the peer restarted its stream elsewhere; those
  packets are dropped), so neither a second sender on that host nor junk with random headers
  takes a call over, not even after its media stopped.
- ``first``: the old behaviour, for peers behind NAT whose SDP names an address they do not
  send from: the first valid packet from anywhere latches its source, and later only the exact
  signalled address takes the latch over. Risky: a stranger who sends first owns the call's
  audio until the signalled address sends, and forever when the peer's real source is not the
  signalled one.

Until the signalled address is known (a delayed offer: the leg opens with our offer in the
200 OK, the peer's answer comes in the ACK), or when it is a host name, which cannot be
compared with a packet's source, every mode behaves like ``first``. When the address arrives,
a latch the mode does not allow is released, so the stranger's packets stop there; the window
is one SIP round trip, and a PBX rarely sends media before its ACK.
"""

from __future__ import annotations

import enum
import ipaddress
from typing import Any, Literal

Address = tuple[Any, ...]
LatchName = Literal["strict", "address", "first"]
"""A `LatchMode` as written in the config files (validated there)."""

_MAPPED_PREFIX = "::ffff:"
RELATCH_SILENCE_S = 0.2  # 10 packets of 20 ms: the latched source has stopped, not paused
RELATCH_PACKETS = 3  # consecutive sequence numbers of one new SSRC from one new port


class LatchMode(enum.StrEnum):
    STRICT = "strict"
    ADDRESS = "address"
    FIRST = "first"


class DropReason(enum.StrEnum):
    """Why a datagram was not taken; each names a `rtp.stats.LegStats` counter."""

    FOREIGN_ADDRESS = "foreign_address"  # an IP the SDP did not signal
    FOREIGN_PORT = "foreign_port"  # the signalled IP, a port the mode does not take now


def _host(address: Address) -> str:
    """A packet source's host, IPv4-mapped IPv6 (``::ffff:192.0.2.1``) as plain IPv4."""
    host = str(address[0])
    return host[len(_MAPPED_PREFIX) :] if host.startswith(_MAPPED_PREFIX) else host


class SourcePolicy:
    """Decides per datagram whether its source may carry the leg's media, and the latch.

    `latched` is the source whose packets are taken without asking again (the leg compares
    it first, so the common packet costs one tuple comparison)."""

    def __init__(self, mode: LatchMode | str = LatchMode.ADDRESS) -> None:
        self.mode = LatchMode(mode)
        self.signalled: tuple[str, int] | None = None
        self._signalled_ip = False  # the signalled host is an IP address (comparable)
        self.latched: Address | None = None
        # A stream that may take the latch over in `address` mode: (source, SSRC), the sequence
        # number it sends next, and how many consecutive packets it has sent.
        self._candidate: tuple[Address, int] | None = None
        self._candidate_next = 0
        self._candidate_packets = 0

    def set_mode(self, mode: LatchMode | str) -> None:
        """A new mode (a profile's override); a latch it does not allow is released."""
        self.mode = LatchMode(mode)
        self._release_disallowed()

    def set_signalled(self, address: tuple[str, int] | None) -> bool:
        """The peer's SDP connection address and port (offer, answer or re-INVITE).

        None, port 0 or an unspecified address (0.0.0.0, ::, the old way to put a call on hold)
        tell nothing new and keep the current one. A changed address releases the latch.
        Returns whether the signalled address changed. ValueError for a port outside 0-65535.
        """
        if address is None:
            return False
        host, port = address
        if not 0 <= port <= 65535:
            raise ValueError(f"expected RTP port {port} is outside 0-65535")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            normalized, is_ip = (host, port), False
        else:
            if ip.is_unspecified:
                return False
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            normalized, is_ip = (ip.compressed, port), True
        if port == 0 or normalized == self.signalled:
            return False
        self.signalled, self._signalled_ip = normalized, is_ip
        self.latched = None
        return True

    @property
    def enforced(self) -> bool:
        """Whether sources are checked against the signalled address (not `first`-like)."""
        return self.mode is not LatchMode.FIRST and self._signalled_ip

    def screen(self, address: Address) -> DropReason | None:
        """Why a datagram from `address` is dropped on its address alone, or None. This is the
        check the C receive path makes too (`screen_filter`)."""
        if not self.enforced:
            return None
        signalled = self.signalled
        assert signalled is not None
        if _host(address) != signalled[0]:
            return DropReason.FOREIGN_ADDRESS
        if self.mode is LatchMode.STRICT and address[1] != signalled[1]:
            return DropReason.FOREIGN_PORT
        return None

    def screen_filter(self) -> tuple[str, int] | None:
        """(IP, port or 0 for any port) that `screen` lets through, None when it lets all."""
        if not self.enforced:
            return None
        assert self.signalled is not None
        host, port = self.signalled
        return host, port if self.mode is LatchMode.STRICT else 0

    def admit(
        self, address: Address, ssrc: int, sequence_number: int, current_ssrc: int | None, silent_s: float
    ) -> DropReason | None:
        """For a valid RTP packet from `address` (not the latched source) with `ssrc` and
        `sequence_number`, while the leg's stream has `current_ssrc` and its last packet came
        `silent_s` ago: latch `address` and return None, or say why the packet is dropped."""
        reason = self.screen(address)
        if reason is not None:
            return reason
        if self.latched is None:
            self.latched = address
            return None
        if self.enforced:
            # Only `address` gets here with a latch (strict allows one source): another port of
            # the signalled IP takes over only when the stream restarts there with a new SSRC.
            stopped = ssrc != current_ssrc and silent_s >= RELATCH_SILENCE_S
            if stopped and self._restarted(address, ssrc, sequence_number):
                self.latched = address
                return None
            return DropReason.FOREIGN_PORT
        signalled = self.signalled
        if signalled is not None and _host(address) == signalled[0] and address[1] == signalled[1]:
            self.latched = address
            return None
        return DropReason.FOREIGN_ADDRESS

    def admit_rtcp(self, address: Address) -> bool:
        """RTCP is taken from the signalled IP when enforced, else from the latched or the
        signalled host (its port is RTP's + 1 or an a=rtcp port, so only hosts are compared)."""
        if self.enforced:
            assert self.signalled is not None
            return _host(address) == self.signalled[0]
        latched, signalled = self.latched, self.signalled
        host = _host(address)
        return latched is None or host == _host(latched) or (signalled is not None and host == signalled[0])

    def _restarted(self, address: Address, ssrc: int, sequence_number: int) -> bool:
        """Count a packet of a would-be new stream; True at its `RELATCH_PACKETS`th in a row."""
        if self._candidate == (address, ssrc) and sequence_number == self._candidate_next:
            self._candidate_packets += 1
        else:
            self._candidate, self._candidate_packets = (address, ssrc), 1
        self._candidate_next = (sequence_number + 1) & 0xFFFF
        if self._candidate_packets < RELATCH_PACKETS:
            return False
        self._candidate = None
        return True

    def _release_disallowed(self) -> None:
        if self.latched is not None and self.screen(self.latched) is not None:
            self.latched = None
