"""What a dashboard needs to tie a call to the agent's desktop or a CRM case, read off the INVITE.

Sans-IO: a ``CallMetadata`` record is built from the accepted INVITE (From/To, the Request-URI,
the SIPREC session id) plus the values of the headers the route's profile lists in
``metadata_headers``. Header values come from the peer, so they are cleaned before they travel
on: control characters dropped, whitespace trimmed, at most ``MAX_VALUE_CHARS`` characters kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from sip.header_values import NameAddr
from sip.message import Request
from sip.siprec import RecordingMetadata

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


def uri_user(uri: str) -> str | None:
    """The user part of a ``sip:``/``sips:`` URI or the number of a ``tel:`` URI, percent-decoded.

    ``sip:+8610123@pbx;user=phone`` -> ``+8610123``; ``tel:+86-10-123;phone-context=x`` ->
    ``+86-10-123``; a URI without a user part (``sip:pbx.local``) or of another scheme -> None.
    """
    scheme, sep, rest = uri.strip().partition(":")
    scheme = scheme.lower()
    if not sep:
        return None
    if scheme == "tel":
        number = rest.split(";", 1)[0]
    elif scheme in ("sip", "sips"):
        if "@" not in rest:
            return None
        number = rest.rsplit("@", 1)[0].split(":", 1)[0].split(";", 1)[0]
    else:
        return None
    number = clean_value(unquote(number))
    return number or None


@dataclass(frozen=True)
class CallMetadata:
    """Who called whom, as the INVITE said it; every field None (or empty) when absent.

    ``dialled`` is the Request-URI's user part (the number the PBX routed on), else the To
    user. ``headers`` are the listed headers that were present, as (name as listed, value).
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


def extract(
    request: Request,
    from_party: NameAddr,
    to: NameAddr,
    header_names: Iterable[str] = (),
    recording: RecordingMetadata | None = None,
) -> CallMetadata:
    """The metadata of a new call's INVITE; ``header_names`` are matched case-insensitively and
    a header given several times keeps its first value."""
    headers: list[tuple[str, str]] = []
    for name in header_names:
        value = request.headers.get(name)
        if value is not None and clean_value(value):
            headers.append((name, clean_value(value)))
    session_id = recording.session_id if recording is not None else None
    return CallMetadata(
        from_uri=clean_value(from_party.uri),
        from_name=_clean_or_none(from_party.display),
        to_uri=clean_value(to.uri),
        to_name=_clean_or_none(to.display),
        dialled=uri_user(request.uri) or uri_user(to.uri),
        request_uri=clean_value(request.uri),
        siprec_session_id=_clean_or_none(session_id),
        headers=tuple(headers),
    )


def _clean_or_none(value: str | None) -> str | None:
    cleaned = clean_value(value) if value is not None else ""
    return cleaned or None
