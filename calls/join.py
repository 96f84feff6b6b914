"""Which incoming calls are one call: the join rule a profile names, the key a call carries
under it, and the bookkeeping of calls waiting for their partner.

Sans-IO. Some recorders send one call set-up per direction of a conversation (Cisco CUCM's
built-in bridge: two INVITEs tied by ``x-refci``). A profile's ``join_by`` names where a
front door reads the tie (``sip/cucm.py`` for SIP):

- unset (None): automatic; SIP joins a CUCM built-in-bridge INVITE (its From URI names one
  end and an ``x-refci``: nothing else sends those) as under ``cucm``, and nothing else;
- ``none``: no call is joined, a CUCM one included;
- ``cucm``: CUCM's ``x-refci`` From-URI parameter (the door also reads who speaks);
- ``header:NAME``: the value of the header (or attribute) ``NAME``;
- ``uri-param:NAME``: the value of the From URI's parameter ``NAME``;
- ``uuid-prefix:N``: the first ``N`` hex digits of a door's stream UUID (Asterisk AudioSocket:
  the dialplan gives the caller's and the agent's connection UUIDs a common prefix).

A key is namespaced by the rule (``join_key``), so two rules never join each other's calls.
The first call of a pair waits in a ``Joiner`` for its partner until a deadline; a partner
later than that is a call of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from calls.metadata import HEADER_NAME, clean_value

_PARAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~!*'+-]{0,63}$")
"""A URI parameter name as ``join_by: uri-param:NAME`` may give it (RFC 3261 ``pname`` chars)."""


UUID_HEX_DIGITS = 32
"""Hex digits of a UUID (RFC 4122): the longest ``uuid-prefix:N``."""

NO_JOIN = "none"
"""The join rule that joins nothing (turns off the automatic CUCM join)."""


def check_join_by(value: str) -> str:
    """``value`` if it is a join rule (``none``, ``cucm``, ``header:NAME``, ``uri-param:NAME``,
    ``uuid-prefix:N``), else ValueError."""
    if value in (NO_JOIN, "cucm"):
        return value
    kind, sep, name = value.partition(":")
    if sep and kind == "header" and HEADER_NAME.match(name):
        return value
    if sep and kind == "uri-param" and _PARAM_NAME.match(name):
        return value
    if sep and kind == "uuid-prefix" and name.isdigit() and 1 <= int(name) <= UUID_HEX_DIGITS:
        return value
    raise ValueError(
        f"{value!r} is not a join rule: use none, cucm, header:NAME, uri-param:NAME"
        f" or uuid-prefix:N (N 1-{UUID_HEX_DIGITS})"
    )


def uuid_join_key(rule: str | None, uuid_hex: str) -> str | None:
    """The key a stream identified by ``uuid_hex`` (32 lower-case hex digits) carries under join
    rule ``rule``: its first N digits under ``uuid-prefix:N``; None under any other rule (those
    read SIP set-ups) or none."""
    if rule is None or not rule.startswith("uuid-prefix:"):
        return None
    digits = int(rule.partition(":")[2])
    return join_key(rule, uuid_hex[:digits])


def join_key(rule: str, value: str | None) -> str | None:
    """The key a call carries under join rule ``rule`` when the tie reads ``value``: ``rule=value``
    (cleaned), or None when the value is missing or empty (the call stands alone, never refused)."""
    cleaned = clean_value(value) if value is not None else ""
    return f"{rule}={cleaned}" if cleaned else None


@dataclass(frozen=True)
class _Waiting:
    call_id: str
    deadline: float  # s, on the caller's clock


class Joiner:
    """The call waiting for its partner under each join key, and until when.

    Times are seconds on the caller's clock (``time.monotonic()``), passed in as ``now``; the
    joiner reads no clock and starts no timer. Not thread-safe: its owner serialises calls.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, _Waiting] = {}

    def __len__(self) -> int:
        """Keys with a call waiting (expired ones included until taken or closed)."""
        return len(self._waiting)

    def wait(self, key: str, call_id: str, now: float, timeout_s: float) -> None:
        """``call_id`` waits for a partner carrying ``key`` until ``now + timeout_s``; a call
        waiting under ``key`` before is forgotten."""
        self._waiting[key] = _Waiting(call_id, now + timeout_s)

    def take(self, key: str, now: float) -> str | None:
        """The call waiting under ``key``, which stops waiting: this call is its partner. None
        when no call waits or its deadline passed (the key is closed then too)."""
        waiting = self._waiting.pop(key, None)
        if waiting is None or now >= waiting.deadline:
            return None
        return waiting.call_id

    def close(self, key: str, call_id: str) -> None:
        """``call_id`` stops waiting under ``key`` (it timed out or ended); another call waiting
        under the same key is left alone."""
        waiting = self._waiting.get(key)
        if waiting is not None and waiting.call_id == call_id:
            del self._waiting[key]
