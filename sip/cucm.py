"""Who is speaking on a plain (non-SIPREC) recording INVITE, and which INVITEs are one call.

Sans-IO. Cisco CUCM's built-in-bridge recording sends two INVITEs per recorded call, one
per direction. Each From URI carries ``;x-nearend`` (the recorded phone: the agent) or
``;x-farend`` (the other party: the caller) and the same ``;x-refci=<id>`` (the recorded call
leg's reference), so ``x-refci`` ties the pair together. A routing profile picks how a plain
call's role and join key are read (``Profile.role`` / ``Profile.join_by``; the rules, the
key's form and the wait for the partner are the call model's, ``calls.join``):

- unset: a From URI naming exactly one end and a non-empty ``x-refci`` is a CUCM
  built-in-bridge INVITE (no other sender uses those parameters) and is read as under ``cucm``;
  any other INVITE keeps the profile's role and stands alone;
- ``none``: the profile's role, never joined;
- ``cucm``: role from ``x-nearend``/``x-farend``, key from ``x-refci``;
- ``header:NAME``: key is the value of the INVITE header ``NAME``;
- ``uri-param:NAME``: key is the value of the From URI parameter ``NAME``.
"""

from __future__ import annotations

from dataclasses import dataclass

from calls.join import NO_JOIN, join_key
from calls.roles import Role
from sip.errors import SipParseError
from sip.header_values import SipUri
from sip.message import Request


@dataclass(frozen=True)
class PlainCall:
    """Role of a plain call's stream(s) and the key joining it with its partner INVITE (None: alone)."""

    role: Role
    join_key: str | None = None


def uri_params(uri: str) -> dict[str, str | None]:
    """Parameters of a SIP URI (names lower-cased), empty when it does not parse."""
    try:
        return SipUri.parse(uri).params
    except SipParseError:
        return {}


def cucm_side(params: dict[str, str | None]) -> Role | None:
    """Built-in-bridge direction of a From URI: near end (the recorded phone) is the agent,
    far end the caller; None when the URI names neither."""
    if "x-nearend" in params:
        return "agent"
    if "x-farend" in params:
        return "caller"
    return None


def cucm_call(params: dict[str, str | None]) -> PlainCall | None:
    """The role and key of a From URI that is unmistakably CUCM built-in bridge's (exactly one
    of ``x-nearend``/``x-farend``, and an ``x-refci`` with a value); None for any other URI."""
    side = cucm_side(params)
    key = join_key("cucm", params.get("x-refci"))
    if side is None or key is None or ("x-nearend" in params and "x-farend" in params):
        return None
    return PlainCall(side, key)


def plain_call(request: Request, from_uri: str, role: Role, join_by: str | None) -> PlainCall:
    """Role and join key of a plain INVITE under a profile's ``role`` and ``join_by``.

    ``role`` is the default; a CUCM built-in-bridge From URI overrides it by its near/far end
    when ``join_by`` is unset or ``cucm``. A missing or empty key value leaves the call alone
    (no join), never refuses it.
    """
    if join_by == NO_JOIN:
        return PlainCall(role)
    params = uri_params(from_uri)
    if join_by is None:
        return cucm_call(params) or PlainCall(role)
    if join_by == "cucm":
        side = cucm_side(params)
        return PlainCall(side or role, join_key("cucm", params.get("x-refci")) if side else None)
    kind, _, name = join_by.partition(":")
    value = request.headers.get(name) if kind == "header" else params.get(name.lower())
    return PlainCall(role, join_key(join_by, value))
