"""The AudioSocket door's one error family: the peer broke the protocol."""

from __future__ import annotations


class PeerError(Exception):
    """The peer sent something the protocol or our limits do not allow; the connection is
    answered with an error frame carrying ``message`` and closed, and ``reason`` is counted."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
