"""Settings of the AudioSocket door (the ``audiosocket`` section of the service config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from calls.routing import Network


class AudioSocketSettings(BaseModel):
    """Off by default. Asterisk dials it with ``AudioSocket(<uuid>,host:port)`` in the dialplan
    (or ``Dial(AudioSocket/host:port/<uuid>)``); the stream's UUID is matched by the routes
    file's ``headers: {uuid: ...}`` conditions.

    AudioSocket carries no credentials, so the door's one check of who is calling is the
    source address: ``source_cidrs``, checked before anything is read or routed. A route's own
    ``source_cidrs`` can narrow it further, never widen it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    enabled: bool = Field(False, description="listen for Asterisk AudioSocket connections")
    host: str = Field("127.0.0.1", description="address to listen on; AudioSocket has no authentication")
    source_cidrs: list[Network] = Field(
        default_factory=list,
        description="sources (the Asterisk servers) allowed to connect; empty: any that can reach host",
    )
    port: int = Field(9092, ge=0, le=65535, description="TCP port; 0 picks a free one")
    max_frame_bytes: int = Field(
        8192, ge=2, le=0xFFFF, description="larger frames close the connection (a 20 ms frame at 16 kHz is 640)"
    )
    idle_timeout_s: float = Field(10.0, gt=0, description="close a connection that sends nothing this long")
    frame_timeout_s: float = Field(
        5.0, gt=0, description="close a connection whose frame is incomplete this long after its first byte"
    )
    max_connections_per_source: int = Field(
        200, ge=1, description="open connections per source IP (an Asterisk server: two per recorded call)"
    )
