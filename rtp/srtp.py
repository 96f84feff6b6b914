"""Unprotecting one leg's SRTP and SRTCP (RFC 3711) with libsrtp (``pylibsrtp``).

A leg whose SDP negotiated SDES keys (``sip.sdes``) gets an ``SrtpReceiver`` built from the
offerer's master key and salt; the leg passes every datagram from an admitted source through
``unprotect`` (or ``unprotect_rtcp``) before parsing it. A packet that fails authentication
or the replay check returns None and is counted in the leg's ``LegStats`` (``srtp_auth_failed``,
``srtp_replayed``, ``srtp_bad``): it never reaches the reorder buffer or the decoder.

A master key index (MKI, RFC 3711 3.1) is stripped before libsrtp sees the packet: it sits
outside the authenticated portion, and with one key per stream it selects nothing. The key
is held by libsrtp and never by an attribute of this object, so no ``repr`` can show it.
``SrtpSender`` is the sending side, for tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pylibsrtp

from rtp.stats import LegStats


@dataclass(frozen=True)
class SrtpKeys:
    """What unprotecting a stream needs: the SDES suite name, the master key and salt (never in
    a ``repr``) and the length of the MKI each packet carries (0: none)."""

    suite: str
    key: bytes = field(repr=False)
    mki_length: int = 0


PROFILES = {
    "AES_CM_128_HMAC_SHA1_80": (pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80, 10),
    "AES_CM_128_HMAC_SHA1_32": (pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32, 4),
}
"""SDES suite name -> (libsrtp profile, SRTP authentication tag length in bytes)."""
AWAITING_KEYS = SrtpKeys("awaiting-keys", b"")
"""The keys of a leg whose SRTP keys are not known yet (our RTP/SAVP offer in a 200, the
answer still to come in the ACK): every packet is dropped, counted in ``srtp_bad``, rather
than decoded as plain RTP."""
_SRTCP_TAG_BYTES = 10  # SRTCP always uses the 80-bit tag (RFC 4568 6.2.1, RFC 3711 5.2)
_AUTH_FAILED = pylibsrtp.ERRORS[7]
_REPLAYED = (pylibsrtp.ERRORS[9], pylibsrtp.ERRORS[10])


def _policy(suite: str, key: bytes, direction: int) -> pylibsrtp.Policy:
    if suite not in PROFILES:
        raise ValueError(f"SRTP suite {suite!r} not supported (use one of {', '.join(PROFILES)})")
    return pylibsrtp.Policy(key=key, ssrc_type=direction, srtp_profile=PROFILES[suite][0])


class SrtpReceiver:
    """The inbound SRTP session of one leg: any SSRC, the suite and master key the peer offered."""

    def __init__(self, keys: SrtpKeys, stats: LegStats | None = None) -> None:
        self.suite = keys.suite
        self.mki_length = keys.mki_length
        self.stats = stats if stats is not None else LegStats()
        self._session: pylibsrtp.Session | None = None
        self._rtp_tag = 0
        if keys != AWAITING_KEYS:
            self._session = pylibsrtp.Session(_policy(keys.suite, keys.key, pylibsrtp.Policy.SSRC_ANY_INBOUND))
            self._rtp_tag = PROFILES[keys.suite][1]

    def __repr__(self) -> str:
        return f"SrtpReceiver({self.suite}, mki_length={self.mki_length})"

    def unprotect(self, packet: bytes) -> bytes | None:
        """The plain RTP packet, or None (counted) when it fails authentication or replay."""
        if self._session is None:
            self.stats.srtp_bad += 1
            return None
        if self.mki_length:
            packet = _strip_mki(packet, self.mki_length, self._rtp_tag)
        try:
            return self._session.unprotect(packet)
        except pylibsrtp.Error as exc:
            self._count(exc)
            return None

    def unprotect_rtcp(self, packet: bytes) -> bytes | None:
        """The plain RTCP compound packet, or None (counted) when it fails."""
        if self._session is None:
            self.stats.srtp_bad += 1
            return None
        if self.mki_length:
            packet = _strip_mki(packet, self.mki_length, _SRTCP_TAG_BYTES)
        try:
            return self._session.unprotect_rtcp(packet)
        except pylibsrtp.Error as exc:
            self._count(exc)
            return None

    def native(self) -> tuple[object, int, int, int] | None:
        """What the C receive path needs to unprotect this stream's in-order packets itself:
        (an object keeping the session alive, the session's ``srtp_t``, the address of libsrtp's
        ``srtp_unprotect``, the tag length). None with an MKI (only Python strips it) or when
        this pylibsrtp does not expose its session: the leg then stays on the Python path."""
        if self.mki_length or self._session is None:
            return None
        try:
            from pylibsrtp._binding import ffi, lib

            session = int(ffi.cast("uintptr_t", self._session._srtp[0]))
            unprotect = int(ffi.cast("uintptr_t", ffi.addressof(lib, "srtp_unprotect")))
        except (AttributeError, ImportError, TypeError):
            return None
        return self._session, session, unprotect, self._rtp_tag

    def _count(self, exc: pylibsrtp.Error) -> None:
        reason = str(exc)
        if reason == _AUTH_FAILED:
            self.stats.srtp_auth_failed += 1
        elif reason in _REPLAYED:
            self.stats.srtp_replayed += 1
        else:
            self.stats.srtp_bad += 1


def _strip_mki(packet: bytes, mki_length: int, tag_length: int) -> bytes:
    """``packet`` without the MKI that precedes its authentication tag (too short: as it is)."""
    if len(packet) < mki_length + tag_length + 12:
        return packet
    return packet[: -(mki_length + tag_length)] + packet[len(packet) - tag_length :]


class SrtpSender:
    """The outbound side (tests, benchmarks, the SRTP test caller): protects RTP and RTCP."""

    def __init__(self, keys: SrtpKeys) -> None:
        self.suite = keys.suite
        self._session = pylibsrtp.Session(_policy(keys.suite, keys.key, pylibsrtp.Policy.SSRC_ANY_OUTBOUND))

    def __repr__(self) -> str:
        return f"SrtpSender({self.suite})"

    def protect(self, packet: bytes) -> bytes:
        return self._session.protect(packet)

    def protect_rtcp(self, packet: bytes) -> bytes:
        return self._session.protect_rtcp(packet)
