"""A ticket system for the webhook tests: a threaded ``http.server`` on a loopback address that
checks each POST's HMAC signature (docs/workorder.md) and records it with its idempotency key;
and the routes-file edit that points the example's default route at it."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from console.webhooks import signature


@dataclass(frozen=True)
class Received:
    """One POST as the receiver saw it (header names in lower case)."""

    headers: dict[str, str]
    body: bytes
    signed_right: bool | None  # None: the receiver has no key to check it with

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get("idempotency-key")

    def json(self) -> Any:
        return json.loads(self.body)


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (closed again: nobody listens there until a receiver starts)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class Receiver:
    """Records every POST to ``host:port``; answers ``statuses`` in turn (then 200), and 401 to a
    POST whose ``X-Hotline-Signature`` is not the HMAC of its timestamp and body under ``secret``."""

    def __init__(self, port: int, statuses: tuple[int, ...] = (), host: str = "127.0.0.1",
                 secret: bytes | None = None) -> None:  # fmt: skip
        self.host = host
        self.port = port
        self.statuses = list(statuses)
        self.secret = secret
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                signed_right = None
                if receiver.secret is not None:
                    expected = signature(receiver.secret, headers.get("x-hotline-timestamp", ""), body)
                    signed_right = headers.get("x-hotline-signature") == expected
                with receiver._lock:
                    receiver.received.append(Received(headers, body, signed_right))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(401 if signed_right is False else status)
                self.end_headers()

            def log_message(self, *args: Any) -> None: ...

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        threading.Thread(target=self._server.serve_forever, name="ticket-receiver", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/tickets"


def route_webhook(console_yaml: Path, url: str, secret_env: str) -> None:
    """Point the default route's ``workorder`` (the example routes file's, beside ``console_yaml``)
    at ``url``, signed with the key in the environment variable ``secret_env``."""
    routes = console_yaml.parent / "routes.yaml"
    lines = routes.read_text(encoding="utf-8").splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("streets: hotline")) + 1
    lines[at:at] = [f"      webhook_url: {url}\n", f"      webhook_secret_env: {secret_env}\n"]
    routes.write_text("".join(lines), encoding="utf-8")
