"""What a dashboard needs to tie a call to the agent's desktop or a CRM case: the
``CallMetadata`` record published as ``call.started.metadata``, and its limits.

Sans-IO. A front door fills the record from what its call set-up states (``sip/call_metadata.py``
reads it off the INVITE) plus the values of the headers or attributes the route's profile
lists in ``metadata_headers``. Those values come from the peer, so they are cleaned before
they travel on: control characters dropped, whitespace trimmed, at most ``MAX_VALUE_CHARS``
characters kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MAX_VALUE_CHARS = 256
"""Longest header value (characters) kept; longer ones are cut, not refused."""
MAX_METADATA_HEADERS = 16
"""Most header names a profile may list in ``metadata_headers``."""
HEADER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,63}$")
"""What a listed header name may look like: a SIP token without ``_`` (so it never collides
with the fixed, snake_case keys of ``CallMetadata.as_map``)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean_value(value: str) -> str:
    """``value`` without control characters, trimmed, cut to ``MAX_VALUE_CHARS``."""
    return _CONTROL.sub("", value).strip()[:MAX_VALUE_CHARS]


def listed_headers(attributes: Mapping[str, str], names: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """(name as ``names`` spells it, cleaned value) for each of ``names`` (a profile's
    ``metadata_headers``) that ``attributes`` holds, names matched case-insensitively, in the
    order of ``names``; a value empty once cleaned is left out. When ``attributes`` holds a
    name twice in different cases, the first one counts."""
    values: dict[str, str] = {}
    for name, value in attributes.items():
        values.setdefault(name.lower(), value)
    listed: list[tuple[str, str]] = []
    for name in names:
        found = values.get(name.lower())
        if found is not None and (cleaned := clean_value(found)):
            listed.append((name, cleaned))
    return tuple(listed)


def check_header_names(names: Iterable[str]) -> None:
    """Raise ValueError unless ``names`` can be a profile's ``metadata_headers``: at most
    ``MAX_METADATA_HEADERS``, each a ``HEADER_NAME``, none listed twice (case-insensitively)."""
    listed = list(names)
    if len(listed) > MAX_METADATA_HEADERS:
        raise ValueError(f"at most {MAX_METADATA_HEADERS} metadata headers, got {len(listed)}")
    seen: set[str] = set()
    for name in listed:
        if not HEADER_NAME.match(name):
            raise ValueError(f"{name!r} is not a header name (letters, digits and '-', at most 64)")
        if name.lower() in seen:
            raise ValueError(f"{name!r} is listed twice")
        seen.add(name.lower())


@dataclass(frozen=True)
class CallMetadata:
    """Who called whom, as the call set-up said it; every field None (or empty) when absent.

    ``dialled`` is the number the PBX routed on (SIP: the Request-URI's user part, else the To
    user). ``request_uri`` and ``siprec_session_id`` are SIP's own facts, None from other doors.
    ``headers`` are the listed headers (or a door's attributes) that were present, as
    (name as listed, cleaned value).
    """

    from_uri: str | None = None
    from_name: str | None = None
    to_uri: str | None = None
    to_name: str | None = None
    dialled: str | None = None
    request_uri: str | None = None
    siprec_session_id: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def as_map(self) -> dict[str, str]:
        """The flat string map published as ``call.started.metadata`` (absent fields left out)."""
        fixed = {
            "from_uri": self.from_uri,
            "from_name": self.from_name,
            "to_uri": self.to_uri,
            "to_name": self.to_name,
            "dialled_number": self.dialled,
            "request_uri": self.request_uri,
            "siprec_session_id": self.siprec_session_id,
        }
        result = {key: value for key, value in fixed.items() if value is not None}
        result.update(self.headers)
        return result
