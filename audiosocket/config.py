"""Settings of the AudioSocket door (the ``audiosocket`` section of the service config)."""

from __future__ import annotations

from pydantic import Field

from asr_common.listener import ListenerSettings, ListenPort


class AudioSocketSettings(ListenerSettings):
    """Off by default. Asterisk dials it with ``AudioSocket(<uuid>,host:port)`` in the dialplan
    (or ``Dial(AudioSocket/host:port/<uuid>)``); the stream's UUID is matched by the routes
    file's ``headers: {uuid: ...}`` conditions.

    AudioSocket carries no credentials, so the door's one check of who is calling is the
    source address: ``source_cidrs`` (the Asterisk servers; ``ListenerSettings``). The
    connection-level fields (host, port, idle timeout, per-source cap) are ``ListenerSettings``'."""

    port: ListenPort = 9092
    max_frame_bytes: int = Field(
        8192, ge=2, le=0xFFFF, description="larger frames close the connection (a 20 ms frame at 16 kHz is 640)"
    )
    frame_timeout_s: float = Field(
        5.0, gt=0, description="close a connection whose frame is incomplete this long after its first byte"
    )
