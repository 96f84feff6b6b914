"""Building responses: the status texts, our capability headers and the ``Reject`` signal.

Stateless helpers shared by the UAS core and its helpers (admission, auth, session timers,
call media): a handler that decides a request must be refused raises ``Reject`` with the
status and extra headers, and the core answers it in the request's transaction.
"""

from __future__ import annotations

from sip.message import Headers, Request, Response

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, UPDATE, INFO"
ACCEPT = "application/sdp, multipart/mixed, application/rs-metadata+xml"
SUPPORTED = "timer, siprec"
SUPPORTED_OPTIONS = frozenset({"timer", "siprec"})
WARNING_AGENT = "hotline-asr"
_WARNING_TEXT_CHARS = 200
REASONS = {
    100: "Trying",
    180: "Ringing",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    420: "Bad Extension",
    422: "Session Interval Too Small",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    491: "Request Pending",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    513: "Message Too Large",
}

HeaderPairs = tuple[tuple[str, str], ...]


class Reject(Exception):
    """Answer the request with ``status`` (and extra headers) and stop handling it."""

    def __init__(self, status: int, headers: HeaderPairs = ()) -> None:
        super().__init__(status)
        self.status = status
        self.headers = headers


def _quoted(text: str) -> str:
    """``text`` as a quoted-string: control characters become spaces, quotes and backslashes
    are escaped, and it is cut to 200 characters."""
    clean = "".join(" " if ord(c) < 0x20 or ord(c) == 0x7F else c for c in text[:_WARNING_TEXT_CHARS])
    escaped = clean.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def warning(text: str, code: int = 399) -> tuple[str, str]:
    """A ``Warning`` header (RFC 3261 20.43) telling the peer what was wrong, in one line."""
    return ("Warning", f"{code} {WARNING_AGENT} {_quoted(text)}")


def reason_header(cause: int, text: str) -> tuple[str, str]:
    """A ``Reason`` header (RFC 3326) for our BYE: the SIP status that best names why, and text."""
    return ("Reason", f"SIP;cause={cause};text={_quoted(text)}")


def contact_header(transport: str, host_port: str, siprec: bool) -> tuple[str, str]:
    """Our Contact in a dialog's 18x/2xx; a recording session marks us as the SRS (RFC 7866)."""
    srs = ";+sip.srs" if siprec else ""
    param = "" if transport == "udp" else f";transport={transport}"
    return ("Contact", f"<sip:hotline-asr@{host_port}{param}>{srs}")


def make_response(
    request: Request,
    status: int,
    user_agent: str,
    extra: HeaderPairs = (),
    to_tag: str | None = None,
) -> Response:
    """A response to ``request``: its Via/From/Call-ID/CSeq, To with our tag, and ``extra``."""
    headers = Headers()
    for name, value in request.headers:
        lower = name.lower()
        if lower in ("via", "from", "call-id", "cseq") or (
            lower == "record-route" and request.method == "INVITE" and 100 < status < 300
        ):
            headers.add(name, value)
        elif lower == "to":
            if to_tag is not None and status > 100 and ";tag=" not in value.replace(" ", "").lower():
                value = f"{value};tag={to_tag}"
            headers.add(name, value)
    headers.add("Server", user_agent)
    if status in (200, 405) and request.method in ("INVITE", "UPDATE"):
        headers.add("Allow", ALLOW)
        headers.add("Supported", SUPPORTED)
    for name, value in extra:
        headers.add(name, value)
    return Response(status, REASONS.get(status, "Unknown"), headers)
