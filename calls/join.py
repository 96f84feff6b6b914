"""Which incoming calls are one call: the join rule a profile names and the key a call carries
under it.

Sans-IO. Some recorders send one call set-up per direction of a conversation (Cisco CUCM's
built-in bridge: two INVITEs tied by ``x-refci``). A profile's ``join_by`` names where a
front door reads the tie (``sip/cucm.py`` for SIP):

- ``cucm``: CUCM's ``x-refci`` From-URI parameter (the door also reads who speaks);
- ``header:NAME``: the value of the header (or attribute) ``NAME``;
- ``uri-param:NAME``: the value of the From URI's parameter ``NAME``.

A key is namespaced by the rule (``join_key``), so two rules never join each other's calls.
"""

from __future__ import annotations

import re

from calls.metadata import HEADER_NAME, clean_value

_PARAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~!*'+-]{0,63}$")
"""A URI parameter name as ``join_by: uri-param:NAME`` may give it (RFC 3261 ``pname`` chars)."""


def check_join_by(value: str) -> str:
    """``value`` if it is a join rule (``cucm``, ``header:NAME``, ``uri-param:NAME``), else ValueError."""
    if value == "cucm":
        return value
    kind, sep, name = value.partition(":")
    if sep and kind == "header" and HEADER_NAME.match(name):
        return value
    if sep and kind == "uri-param" and _PARAM_NAME.match(name):
        return value
    raise ValueError(f"{value!r} is not a join rule: use cucm, header:NAME or uri-param:NAME")


def join_key(rule: str, value: str | None) -> str | None:
    """The key a call carries under join rule ``rule`` when the tie reads ``value``: ``rule=value``
    (cleaned), or None when the value is missing or empty (the call stands alone, never refused)."""
    cleaned = clean_value(value) if value is not None else ""
    return f"{rule}={cleaned}" if cleaned else None
