"""Settings of the WebSocket door (the ``websocket`` section of the service config)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr

from asr_common.listener import ListenerSettings, ListenPort

REPLY_WRITE_BUFFER_BYTES = 65536
"""What a connection's replies may hold in the kernel's send buffer (``SO_SNDBUF``; Linux
doubles it) and what the transport's write buffer holds before the door waits for it to drain."""


class WebSocketSettings(ListenerSettings):
    """Off by default. One port serves every dialect: WeNet's runtime protocol (any path),
    ours (path ``/v1/stream`` or subprotocol ``hotline-asr.v1``) and FreeSWITCH
    ``mod_audio_fork`` (subprotocol ``audio.drachtio.org`` or path ``/audio_fork``).

    The connection-level fields (host, port, ``source_cidrs``, idle timeout, per-source cap)
    are ``ListenerSettings``'; the door's ``source_cidrs`` and ``bearer_tokens`` are both
    checked before routing. ``idle_timeout_s`` is also the time a peer has to answer the
    door's close before the connection is dropped."""

    port: ListenPort = 9093
    tls: bool = Field(
        False, description="serve wss:// with the SIP TLS certificate and key (sip.tls_cert, sip.tls_key)"
    )
    max_message_bytes: int = Field(
        65536, ge=1024, description="larger messages close the connection (1009); 100 ms of 16 kHz stereo is 6400"
    )
    handshake_timeout_s: float = Field(5.0, gt=0, description="close a connection whose handshake takes longer")
    bearer_tokens: list[Annotated[SecretStr, Field(min_length=16)]] = Field(
        default_factory=list,
        description="tokens that open the door, checked at the handshake before routing (a client presents one: "
        "Authorization: Bearer, or ?token=); empty: the door asks none. A route's bearer_token adds to this, "
        "so with both it must be one of these",
    )
    max_pending_replies: int = Field(
        512, ge=1, description="replies a client has not read (queued in the door) before it is closed as a slow reader"
    )
    max_pending_reply_bytes: int = Field(
        524288,
        ge=2 * REPLY_WRITE_BUFFER_BYTES,
        description="bytes of replies a client has not read (queued, and in the transport's buffer) before it is "
        "closed as a slow reader; with the kernel's send buffer (128 KiB), what one connection's replies can hold",
    )
