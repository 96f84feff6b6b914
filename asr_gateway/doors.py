"""The front doors beside SIP (Asterisk AudioSocket today) that the config turns on.

Each door hands its calls to the same application (``CallBridge``, a ``calls.handler.CallHandler``)
and routes them with the routes in force, so routing, admission, the engine, events and the
journal work the same for every door. The service constructs ``Doors``, starts them after SIP
listens, and stops them before SIP.
"""

from __future__ import annotations

from collections.abc import Callable

from asr_common.audio import SAMPLE_RATE
from asr_common.yamlconf import ConfigError
from asr_gateway.config import ServiceConfig
from audiosocket.server import AudioSocketServer
from calls.handler import CallHandler
from calls.routing import Router


class Doors:
    """The enabled doors; ``model_rate`` (Hz) is the engine's input rate, which doors feed at 16 kHz."""

    def __init__(
        self, config: ServiceConfig, handler: CallHandler, router: Callable[[], Router], model_rate: int
    ) -> None:
        enabled = ["audiosocket"] if config.audiosocket.enabled else []
        if enabled and model_rate != SAMPLE_RATE:
            raise ConfigError(
                [f"{', '.join(enabled)}: these doors feed {SAMPLE_RATE} Hz audio; the model's front end runs at "
                 f"{model_rate} Hz (turn the doors off or serve a {SAMPLE_RATE} Hz model)"]
            )  # fmt: skip
        self.audiosocket = (
            AudioSocketServer(config.audiosocket, handler, router) if config.audiosocket.enabled else None
        )

    async def start(self) -> None:
        if self.audiosocket is not None:
            await self.audiosocket.start()

    def set_draining(self) -> None:
        """Refuse new connections on every door."""
        if self.audiosocket is not None:
            self.audiosocket.set_draining()

    async def stop(self) -> None:
        """Stop listening and end the doors' open legs."""
        if self.audiosocket is not None:
            await self.audiosocket.stop()
