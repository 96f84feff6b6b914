"""Session timers for a UAS (RFC 4028): the interval a request asks for and our 2xx's headers.

The refresher is whoever the UAC names (default ``uac``), or us when the UAC does not
support the extension. When the UAC refreshes, the call expires a little before the
interval ends unless a refresh arrives; when we refresh, we send UPDATE every half interval.
Times are seconds on the caller's clock (``now``); the UAS schedules ``call.next_deadline()``.
"""

from __future__ import annotations

from sip.dialog import Call
from sip.errors import SipParseError
from sip.header_values import parse_params
from sip.message import Request
from sip.responses import HeaderPairs, Reject

_MAX_DIGITS = 9
_EXPIRY_MARGIN_MAX_S = 32


def session_interval(request: Request, min_se_s: int) -> int | None:
    """The interval (s) ``request`` asks for, None without ``Session-Expires``; 422 below ``min_se_s``."""
    value = request.headers.get("Session-Expires")
    if value is None:
        return None
    number = value.split(";", 1)[0].strip()
    if not number.isascii() or not number.isdigit() or len(number) > _MAX_DIGITS:
        raise SipParseError(f"malformed Session-Expires {value[:40]!r}")
    interval = int(number)
    if interval < min_se_s:
        raise Reject(422, (("Min-SE", str(min_se_s)),))
    return interval


def arm(call: Call, request: Request, now: float) -> HeaderPairs:
    """Set the call's expiry or refresh time from ``call.session_expires`` and return the
    ``Session-Expires`` (and ``Require: timer``) headers of our 2xx to ``request``."""
    call.expires_at = call.refresh_at = None
    if call.session_expires is None:
        return ()
    value = request.headers.get("Session-Expires") or ""
    refresher = parse_params(value.partition(";")[2]).get("refresher") or "uac"
    supported = any(o.lower() == "timer" for o in request.headers.get_all("Supported"))
    if not supported:
        refresher = "uas"
    interval = call.session_expires
    if refresher == "uac":
        call.expires_at = now + interval - min(_EXPIRY_MARGIN_MAX_S, interval / 3)
    else:
        call.refresh_at = now + interval / 2
    headers = [("Session-Expires", f"{interval};refresher={refresher}")]
    if supported:
        headers.append(("Require", "timer"))
    return tuple(headers)


def refresh_headers(call: Call) -> HeaderPairs:
    """The headers of the UPDATE we send when we are the refresher."""
    return (("Session-Expires", f"{call.session_expires};refresher=uas"), ("Supported", "timer"))
