"""The call metadata of an INVITE: SIP's side of ``calls.metadata.CallMetadata``.

Sans-IO: the record is built from the accepted INVITE (From/To, the Request-URI, the SIPREC
session id) plus the values of the headers the route's profile lists in ``metadata_headers``,
each cleaned by ``calls.metadata.clean_value`` (the record and its limits live there).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import unquote

from calls.metadata import CallMetadata, clean_value
from sip.header_values import NameAddr
from sip.message import Request
from sip.siprec import RecordingMetadata


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
