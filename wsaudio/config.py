"""Settings of the WebSocket door (the ``websocket`` section of the service config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WebSocketSettings(BaseModel):
    """Off by default. One port serves every dialect: WeNet's runtime protocol (any path),
    ours (path ``/v1/stream`` or subprotocol ``hotline-asr.v1``) and FreeSWITCH
    ``mod_audio_fork`` (subprotocol ``audio.drachtio.org`` or path ``/audio_fork``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    enabled: bool = Field(False, description="listen for WebSocket audio streams")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(9093, ge=0, le=65535, description="TCP port; 0 picks a free one")
    tls: bool = Field(
        False, description="serve wss:// with the SIP TLS certificate and key (sip.tls_cert, sip.tls_key)"
    )
    max_message_bytes: int = Field(
        65536, ge=1024, description="larger messages close the connection (1009); 100 ms of 16 kHz stereo is 6400"
    )
    idle_timeout_s: float = Field(10.0, gt=0, description="close a connection that sends nothing this long")
    handshake_timeout_s: float = Field(5.0, gt=0, description="close a connection whose handshake takes longer")
    max_connections_per_source: int = Field(200, ge=1, description="open connections per source IP; more are closed")
