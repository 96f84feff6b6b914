"""Confirmed work orders to the ticket system: the outbox survives a restart, a receiver that is
down gets the work order once it is back (once), a signed POST the receiver can verify, a
refusal is final; and through the console: confirm on the call page's API, the receiver gets it."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from asr_gateway.dev.local_redis import free_tcp_port
from console.webhooks import Delivery, Outbox, WebhookSender, backoff_s, signature
from kb_hooks import events as ev
from tests.console_helpers import LivePublisher, login, running_console, write_configs
from tests.redis_server import RedisServer, redis_server
from tests.test_console_workorder import drafted_call

__all__ = ["redis_server"]


class Receiver:
    """A ticket system on a loopback port: records every POST, answers ``statuses`` in turn (then 200)."""

    def __init__(self, port: int, statuses: tuple[int, ...] = ()) -> None:
        self.port = port
        self.statuses = list(statuses)
        self.received: list[tuple[dict[str, str], bytes]] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None: ...

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/tickets"


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    made = Receiver(free_tcp_port())
    yield made
    made.stop()


def delivery(url: str, event_id: str = "e1") -> Delivery:
    return Delivery(event_id, "wo-1", url, "TICKETS_KEY", json.dumps({"event_id": event_id, "workorder_id": "wo-1"}))


def wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_backoff_doubles_up_to_five_minutes() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 9, 20)] == [1.0, 2.0, 4.0, 256.0, 300.0]


def test_the_outbox_keeps_what_was_not_answered_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    outbox = Outbox(path)
    outbox.add(delivery("http://t/1", "e1"))
    outbox.add(delivery("http://t/2", "e2"))
    outbox.finish("e1", "delivered")
    assert list(Outbox(path).pending) == ["e2"]
    Outbox(path).finish("e2", "refused 400")
    assert Outbox(path).pending == {} and path.read_text() == ""


def test_a_receiver_that_is_down_gets_the_work_order_once_it_is_back(tmp_path: Path, receiver: Receiver) -> None:
    outbox = Outbox(tmp_path / "outbox.jsonl")
    sender = WebhookSender(outbox, environ={"TICKETS_KEY": "s3cret"})

    async def scenario() -> None:
        sender.start()
        outbox.add(delivery(receiver.url))
        sender.wake()
        await asyncio.to_thread(wait_for, lambda: sender.failures >= 1)  # nobody listens yet
        receiver.start()
        await asyncio.to_thread(wait_for, lambda: sender.delivered == 1)
        await asyncio.sleep(0.3)
        await sender.stop()

    asyncio.run(scenario())
    assert len(receiver.received) == 1 and outbox.pending == {}
    headers, body = receiver.received[0]
    assert headers["idempotency-key"] == "wo-1" and json.loads(body)["event_id"] == "e1"
    stamp = headers["x-hotline-timestamp"]
    expected = hmac.new(b"s3cret", stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    assert headers["x-hotline-signature"] == f"sha256={expected}" == signature(b"s3cret", stamp, body)


def test_a_5xx_is_retried_and_a_4xx_is_final(tmp_path: Path, receiver: Receiver) -> None:
    receiver.statuses = [503, 422]
    receiver.start()
    outbox = Outbox(tmp_path / "outbox.jsonl")
    sender = WebhookSender(outbox, environ={"TICKETS_KEY": "k"})

    async def scenario() -> None:
        sender.start()
        outbox.add(delivery(receiver.url))
        sender.wake()
        await asyncio.to_thread(wait_for, lambda: not outbox.pending)
        await sender.stop()

    asyncio.run(scenario())
    assert len(receiver.received) == 2 and sender.delivered == 0
    assert (tmp_path / "outbox.jsonl").read_text() == ""  # nothing left to replay


def test_a_confirmed_work_order_reaches_the_routes_ticket_system(
    tmp_path: Path, redis_server: RedisServer, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKETS_KEY", "route-key")
    receiver.start()
    console_yaml = write_configs(tmp_path, redis_server.url)
    routes = console_yaml.parent / "routes.yaml"
    lines = routes.read_text(encoding="utf-8").splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("streets: hotline")) + 1
    lines[at:at] = [f"      webhook_url: {receiver.url}\n", "      webhook_secret_env: TICKETS_KEY\n"]
    routes.write_text("".join(lines), encoding="utf-8")
    events, ended = drafted_call("wo-hook", console_yaml.parent)
    with running_console(console_yaml) as base, LivePublisher(redis_server.url, tmp_path / "pub") as publisher:
        for event in [*events, ended]:
            publisher.submit(event)
        publisher.wait_published(len(events) + 1)
        answer = login(base, "agent1").post("/api/calls/wo-hook/workorder", json={"fields": {}})
        assert answer.status_code == 200 and answer.json()["webhook"] == "queued", answer.text
        wait_for(lambda: len(receiver.received) == 1)
    headers, body = receiver.received[0]
    sent = json.loads(body)
    assert sent["event_type"] == ev.EventType.WORKORDER_CONFIRMED and sent["workorder_id"] == "wo-hook"
    assert headers["x-hotline-signature"] == signature(b"route-key", headers["x-hotline-timestamp"], body)
