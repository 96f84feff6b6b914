"""The AudioSocket door's one error family: the peer broke the protocol."""

from __future__ import annotations

from asr_common.listener import DoorError


class PeerError(DoorError):
    """The peer sent something the protocol or our limits do not allow; the connection is
    answered with an error frame carrying ``message`` and closed, and ``reason`` is counted."""
