"""The error classes of the SIP package; each carries the SIP status a reply should use.

Like h11, we tell apart "the peer broke the protocol" (``RemoteProtocolError``: answer with
``status_hint`` or drop) from "we were asked to do something illegal" (``LocalProtocolError``:
a bug or misuse on our side). Parse failures are ``SipParseError``, a ``ValueError`` so that
callers that only know the standard library can still catch them.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class; ``status_hint`` is the SIP status code that best describes the problem."""

    def __init__(self, message: str, status_hint: int = 400) -> None:
        super().__init__(message)
        self.status_hint = status_hint


class LocalProtocolError(ProtocolError):
    """We tried to do something the protocol forbids in the current state."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids in the current state."""


class SipParseError(RemoteProtocolError, ValueError):
    """Bytes that are not a well-formed SIP message (or header value)."""
