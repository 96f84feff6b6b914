"""The front doors beside SIP that the config turns on: Asterisk AudioSocket (``audiosocket``)
and the WebSocket API with FreeSWITCH ``mod_audio_fork`` (``websocket``).

Each door hands its calls to the same application (the service's ``calls.registry.CallRegistry``,
which counts them and passes them on to ``CallBridge``; both are ``calls.handler.CallHandler``s)
and routes them with the routes in force, so routing, admission, the engine, events and the
journal work the same for every door. The service constructs ``Doors``, starts them after SIP
listens, and stops them before SIP.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from asr_common.audio import SAMPLE_RATE
from asr_common.yamlconf import ConfigError
from asr_gateway.bridge import CallBridge
from asr_gateway.config import ServiceConfig
from asr_gateway.metrics import DoorFigures
from audiosocket.server import AudioSocketServer
from calls.handler import CallHandler
from calls.routing import Router
from wsaudio.server import WebSocketServer


def websocket_tls(config: ServiceConfig) -> ssl.SSLContext | None:
    """The WebSocket door's TLS context (``websocket.tls``: the SIP certificate and key), or None."""
    if not config.websocket.tls:
        return None
    sip = config.sip
    if not sip.tls_cert or not sip.tls_key:
        raise ConfigError(["websocket.tls needs sip.tls_cert and sip.tls_key (PEM files), as the SIP tls transport"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(sip.tls_cert, sip.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError([f"websocket.tls: cannot load {sip.tls_cert} / {sip.tls_key}: {exc}"]) from None
    return context


class Doors:
    """The enabled doors: their calls go to ``handler``; a door that answers with a call's events
    watches it on ``bridge``. ``model_rate`` (Hz) is the engine's input rate, which doors feed at 16 kHz."""

    def __init__(
        self,
        config: ServiceConfig,
        handler: CallHandler,
        bridge: CallBridge,
        router: Callable[[], Router],
        model_rate: int,
    ) -> None:
        switches = (("audiosocket", config.audiosocket.enabled), ("websocket", config.websocket.enabled))
        enabled = [name for name, on in switches if on]
        if enabled and model_rate != SAMPLE_RATE:
            raise ConfigError(
                [f"{', '.join(enabled)}: these doors feed {SAMPLE_RATE} Hz audio; the model's front end runs at "
                 f"{model_rate} Hz (turn the doors off or serve a {SAMPLE_RATE} Hz model)"]
            )  # fmt: skip
        self.audiosocket = (
            AudioSocketServer(config.audiosocket, handler, router) if config.audiosocket.enabled else None
        )
        self.websocket = (
            WebSocketServer(
                config.websocket, handler, router, bridge.watch, bridge.unwatch, tuple(config.engine.allowed_chunk_ms),
                websocket_tls(config),
            )
            if config.websocket.enabled
            else None
        )  # fmt: skip

    async def start(self) -> None:
        if self.audiosocket is not None:
            await self.audiosocket.start()
        if self.websocket is not None:
            await self.websocket.start()

    def set_draining(self) -> None:
        """Refuse new connections on every door."""
        if self.audiosocket is not None:
            self.audiosocket.set_draining()
        if self.websocket is not None:
            self.websocket.set_draining()

    async def stop(self) -> None:
        """Stop listening and end the doors' open legs."""
        if self.audiosocket is not None:
            await self.audiosocket.stop()
        if self.websocket is not None:
            await self.websocket.stop()

    def stats(self) -> list[DoorFigures]:
        """The enabled doors' counters (none for SIP: it has its own)."""
        result = []
        if self.audiosocket is not None:
            door = self.audiosocket
            result.append(DoorFigures("audiosocket", door.connections, door.legs, dict(door.refusals)))
        if self.websocket is not None:
            ws = self.websocket
            result.append(DoorFigures("websocket", ws.connections, ws.legs, dict(ws.refusals)))
        return result
