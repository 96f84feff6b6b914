"""The call and leg records a front door hands the application (``calls.handler.CallHandler``).

A front door decides *whether* a call is taken (routing, admission, media negotiation) and
builds these records from what its set-up stated; the application sees the same records
whichever door the call came in through (``CallInfo.source``). Facts only one door has keep
that door's name (``siprec``, ``CallMetadata.siprec_session_id``); other doors leave them
False or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from calls.metadata import CallMetadata
from calls.profile import Profile
from calls.roles import Role

CallSource = Literal["sip", "audiosocket", "websocket", "audio_fork"]
"""The front door a call came in through: SIP (``sip``), Asterisk AudioSocket (``audiosocket``),
the WebSocket API (``wsaudio``: ``websocket``, and FreeSWITCH ``mod_audio_fork`` as ``audio_fork``)."""


@dataclass(frozen=True)
class LegInfo:
    """One stream of a call's audio, transcribed on its own."""

    leg_id: str
    label: str | None
    """The door's name of the stream (SIP: the SDP ``a=label``, which SIPREC metadata refers to)."""
    role: Role
    aor: str | None
    """Address of the party sending the leg (SIP: the AOR, ``sip:agent@pbx``)."""
    codec: str
    name: str | None = None
    """Display name of the party sending the leg (From display name; SIPREC participant name)."""


@dataclass(frozen=True)
class CallInfo:
    """One incoming call as the application sees it."""

    call_id: str
    """Ours: unique across doors and nodes (a UUID's hex)."""
    source: CallSource
    source_call_id: str
    """The door's own id of the call (SIP: the Call-ID header; AudioSocket: the connection's UUID;
    WebSocket: the stream id), published as ``source_call_id`` (and ``sip_call_id``, its v1 name)."""
    from_aor: str
    from_name: str | None
    to_aor: str
    to_name: str | None
    peer: tuple[str, int, str]
    """(host, port, transport) of the peer the call came from (SIP: the INVITE's last hop)."""
    route: str | None
    profile: Profile
    siprec: bool
    """A SIPREC recording session (RFC 7866: roles from its metadata); False from other doors."""
    legs: tuple[LegInfo, ...] = field(default=())
    metadata: CallMetadata = field(default_factory=CallMetadata)
    join_key: str | None = None
    """Plain calls only: calls with the same key are one call to the application
    (``Profile.join_by``, ``calls.join``); None: the call stands alone."""

    @classmethod
    def unaddressed(
        cls,
        call_id: str,
        source: CallSource,
        source_call_id: str,
        peer: tuple[str, int, str],
        route: str | None,
        profile: Profile,
        legs: tuple[LegInfo, ...],
        metadata: CallMetadata,
        join_key: str | None = None,
    ) -> CallInfo:
        """A call from a door whose set-up names no parties (AudioSocket, the WebSocket API):
        From and To empty, no display names, not SIPREC."""
        return cls(
            call_id=call_id,
            source=source,
            source_call_id=source_call_id,
            from_aor="",
            from_name=None,
            to_aor="",
            to_name=None,
            peer=peer,
            route=route,
            profile=profile,
            siprec=False,
            legs=legs,
            metadata=metadata,
            join_key=join_key,
        )

    def with_legs(self, legs: tuple[LegInfo, ...]) -> CallInfo:
        return replace(self, legs=legs)
