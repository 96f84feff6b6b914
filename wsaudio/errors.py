"""The WebSocket door's one error family: the peer broke the protocol or a limit."""

from __future__ import annotations

from asr_common.listener import DoorError

CLOSE_POLICY = 1008
"""RFC 6455 close codes the door uses: policy violation (auth, order of messages)."""
CLOSE_UNSUPPORTED = 1003
CLOSE_INVALID = 1007
CLOSE_TOO_BIG = 1009
CLOSE_TRY_LATER = 1013


class PeerError(DoorError):
    """The peer sent something the protocol or our limits do not allow: the connection is
    closed with ``close_code`` and ``message`` as the reason, and ``reason`` is counted."""

    def __init__(self, reason: str, message: str, close_code: int = CLOSE_POLICY) -> None:
        super().__init__(reason, message)
        self.close_code = close_code


class LifecycleError(Exception):
    """The door itself asked its connection's lifecycle for a step the table does not allow (a
    bug in the door, not the peer's doing); the message names the trigger and the state."""
