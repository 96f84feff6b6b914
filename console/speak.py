"""Where the "Speak to it" page streams the browser's audio: the gateway's WebSocket door.

The console and the gateway are separate processes; the page connects to the gateway itself
(our ``hotline-asr.v1`` dialect, docs/front-doors.md). The address is the console's
``speak_url`` when set; otherwise it is derived from the gateway's ``websocket`` section: the
scheme from ``websocket.tls``, the port from ``websocket.port`` and the host the browser used
to reach the console (the page fills it in), which is right when both run on one host. When
the door is off and no ``speak_url`` is set, the page says so and how to turn it on.

When the gateway serves the bundled demo model, which hears synthetic voices only, the page says
so before anyone speaks to it, with how to install a real model (``demo_model_notice``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asr_core.model.bundled import DEMO_MODEL_NOTICE
from wsaudio.config import WebSocketSettings

STREAM_PATH = "/v1/stream"
"""Path of our dialect on the WebSocket door."""


@dataclass(frozen=True)
class SpeakTarget:
    """What the page needs to open its stream.

    ``url``: the whole ``ws://``/``wss://`` URL, or None when the page builds it from
    ``scheme``, the browser's host name, ``port`` and ``STREAM_PATH``; ``off`` says why there
    is nowhere to connect (the door is off), None when there is.
    """

    url: str | None
    scheme: str
    port: int
    off: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"url": self.url, "scheme": self.scheme, "port": self.port, "path": STREAM_PATH, "off": self.off}


def speak_target(speak_url: str | None, door: WebSocketSettings) -> SpeakTarget:
    """The target under the console's ``speak_url`` and the gateway's WebSocket door settings."""
    scheme = "wss" if door.tls else "ws"
    if speak_url is not None:
        return SpeakTarget(speak_url, scheme, door.port)
    if not door.enabled:
        return SpeakTarget(None, scheme, door.port, off=(
            "The gateway's WebSocket door is off. Set websocket: {enabled: true} in the gateway's "
            "config (docs/front-doors.md) and restart it, or set speak_url in console.yaml if the "
            "door listens elsewhere (behind a proxy, on another host)."
        ))  # fmt: skip
    if door.port == 0:
        return SpeakTarget(None, scheme, door.port, off=(
            "The gateway's WebSocket door listens on a port picked at start (websocket.port: 0), "
            "which the console cannot know: set websocket.port, or speak_url in console.yaml."
        ))  # fmt: skip
    return SpeakTarget(None, scheme, door.port)


def demo_model_notice(nodes: Sequence[Mapping[str, Any]], configured_demo: bool) -> str | None:
    """The page's notice when the gateway serves the bundled demo model, else None.

    ``nodes`` are the gateways' heartbeats (``ConfigStore.nodes``): when a live one reports its
    ``model``, they decide (any node serving the demo model: a call may reach it).
    ``configured_demo`` (the gateway's config leaves ``engine.model_dir`` unset, or names a
    directory with the demo marker) decides while none does: no gateway running yet, or one
    from before the heartbeat carried the model.
    """
    reports = [node["model"] for node in nodes if not node.get("stale") and isinstance(node.get("model"), dict)]
    demo = any(report.get("demo") is True for report in reports) if reports else configured_demo
    return DEMO_MODEL_NOTICE if demo else None
