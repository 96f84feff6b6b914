"""SDES key exchange for SRTP (RFC 4568): reading ``a=crypto`` lines and writing our answer's.

An offered SRTP m-line lists one or more ``a=crypto:<tag> <suite> inline:<key||salt>[|lifetime][|MKI:length]``
lines. We take the first line, in order of preference (``SUITES``: the 80-bit tag before the
32-bit one), whose suite we know, with one key and no session parameters; our answer echoes
its tag and suite with a key of our own, fresh for every answer (we never send media, but an
answer without a key would be malformed). The offerer's key is what its packets are
protected with: the RTP leg unprotects with it (``rtp.srtp``).

A master key never appears in a ``repr``, log line or error message: ``SdesKey`` hides it and
every error names the line by tag and suite only.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass

from rtp.srtp import PROFILES, SrtpKeys
from sip.errors import SipParseError

SUITES = tuple(PROFILES)
"""The suites we take, most preferred first: AES_CM_128_HMAC_SHA1_80, then _32."""
KEY_SALT_BYTES = 30
"""Master key (16 bytes) and salt (14 bytes) of an AES_CM_128 suite, the inline key's length."""

_TAG = re.compile(r"[0-9]{1,9}")
_LIFETIME = re.compile(r"(?:2\^)?[0-9]{1,20}")
_MKI = re.compile(r"([0-9]{1,20}):([0-9]{1,3})")


class SdesError(SipParseError):
    """An SRTP m-line without a crypto line we can use; a 488 whose Warning says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 488)


@dataclass(frozen=True)
class SdesKey:
    """One accepted crypto line: its ``tag`` and what unprotecting its stream needs (``keys``:
    suite, master key and salt, MKI length; the key never shown by ``repr``)."""

    tag: int
    keys: SrtpKeys

    @property
    def suite(self) -> str:
        return self.keys.suite


def select_key(crypto_lines: list[str]) -> SdesKey:
    """The crypto line we take from an SRTP m-line's ``a=crypto`` values (``"1 AES_CM_... inline:..."``).

    Raises ``SdesError`` when none is usable, naming each line's problem without its key.
    """
    if not crypto_lines:
        raise SdesError("an RTP/SAVP stream has no a=crypto line (SDES keys, RFC 4568)")
    usable: list[SdesKey] = []
    problems: list[str] = []
    for line in crypto_lines:
        try:
            usable.append(parse_crypto(line))
        except SdesError as exc:
            problems.append(str(exc))
    if not usable:
        raise SdesError("; ".join(problems[:3]))
    return min(usable, key=lambda key: SUITES.index(key.suite))


def parse_crypto(value: str) -> SdesKey:
    """One ``a=crypto`` value, or ``SdesError`` saying what is wrong with it."""
    fields = value.split()
    if len(fields) < 3 or not _TAG.fullmatch(fields[0]):
        raise SdesError("an a=crypto line is not '<tag> <suite> inline:<key>'")
    tag, suite, key_params = int(fields[0]), fields[1], fields[2]
    name = f"a=crypto:{tag} {suite[:40]}"
    if suite not in SUITES:
        raise SdesError(f"{name}: suite not supported (we take {', '.join(SUITES)})")
    if len(fields) > 3:
        raise SdesError(f"{name}: session parameters ({fields[3][:30]}) are not supported")
    if ";" in key_params:
        raise SdesError(f"{name}: more than one key is not supported")
    if not key_params.startswith("inline:"):
        raise SdesError(f"{name}: key method is not inline")
    material, *extras = key_params[len("inline:") :].split("|")
    try:
        key = base64.b64decode(material, validate=True)
    except (binascii.Error, ValueError):
        raise SdesError(f"{name}: key is not base64") from None
    if len(key) != KEY_SALT_BYTES:
        raise SdesError(f"{name}: key and salt are {len(key)} bytes, the suite needs {KEY_SALT_BYTES}")
    mki_length = 0
    if len(extras) > 2:
        raise SdesError(f"{name}: too many '|' fields after the key")
    for extra in extras:
        mki = _MKI.fullmatch(extra)
        if mki is not None:
            mki_length = int(mki.group(2))
            if not 1 <= mki_length <= 128:
                raise SdesError(f"{name}: MKI length {mki_length} is not 1-128 bytes")
        elif not _LIFETIME.fullmatch(extra):
            raise SdesError(f"{name}: {extra[:20]!r} is neither a key lifetime nor MKI:length")
    return SdesKey(tag, SrtpKeys(suite, key, mki_length))


def answer_line(offered: SdesKey) -> str:
    """Our ``a=crypto`` line for the stream ``offered`` was taken on: its tag and suite, a new key."""
    return crypto_line(offered.tag, offered.suite)


def crypto_line(tag: int, suite: str) -> str:
    """An ``a=crypto`` line with a fresh random key (we never send with it)."""
    ours = base64.b64encode(secrets.token_bytes(KEY_SALT_BYTES)).decode("ascii")
    return f"a=crypto:{tag} {suite} inline:{ours}"
