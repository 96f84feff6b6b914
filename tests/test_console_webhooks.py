"""Confirmed work orders to the ticket system: the outbox survives a restart, a receiver that is
down gets the work order once it is back (once), a signed POST the receiver can verify, a
refusal is final, a URL the client cannot use stops neither the sender nor the others, each
delivery's state in words; and through the console: confirm on the call page's API, the
receiver gets it, the API says so. The browser's side: test_console_workorder_browser.py."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asr_common.yamlconf import ConfigError
from asr_gateway.dev.local_redis import free_tcp_port
from calls.routing import load_routes
from console.settings import load_settings
from console.webhooks import Backoff, Delivery, Outbox, WebhookSender, signature
from kb_hooks import events as ev
from tests.console_helpers import LivePublisher, login, running_console, write_configs
from tests.redis_server import RedisServer, redis_server
from tests.test_console_workorder import drafted_call
from tests.webhook_receiver import Receiver, route_webhook

__all__ = ["redis_server"]


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
    assert [Backoff().after(n) for n in (1, 2, 3, 9, 20)] == [1.0, 2.0, 4.0, 256.0, 300.0]
    assert [Backoff(0.25, 1.0).after(n) for n in (1, 2, 3, 4)] == [0.25, 0.5, 1.0, 1.0]


@pytest.mark.parametrize(
    ("url", "why"),
    [("http://[::1/tickets", "Invalid IPv6 URL"), ("http://tickets:99999/x", "Port out of range"),
     ("http://:8080/x", "names no host")],
)  # fmt: skip
def test_the_routes_file_refuses_a_webhook_url_the_console_cannot_post_to(tmp_path: Path, url: str, why: str) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(f"profiles:\n  default:\n    workorder:\n      webhook_url: '{url}'\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_routes(path)
    (error,) = info.value.errors
    assert error.startswith(f"{path}:4 profiles.default.workorder.webhook_url:") and why in error, error


def test_console_yaml_shortens_the_retries_within_bounds(tmp_path: Path) -> None:
    path = tmp_path / "console.yaml"
    base = "service_config: gateway.yaml\nusers_file: users.yaml\n"
    path.write_text(base, encoding="utf-8")
    assert (load_settings(path).webhook_retry_first_s, load_settings(path).webhook_retry_max_s) == (1.0, 300.0)
    path.write_text(base + "webhook_retry_first_s: 10\nwebhook_retry_max_s: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.errors == [
        f"{path}:4 webhook_retry_max_s: 2.0 is below webhook_retry_first_s (10.0): raise it, or lower that"
    ]


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
    sender = WebhookSender(outbox, Backoff(0.2, 0.4), environ={"TICKETS_KEY": "s3cret"})
    states = []

    async def scenario() -> None:
        sender.start()
        outbox.add(delivery(receiver.url))
        states.append(sender.state("e1"))
        sender.wake()
        await asyncio.to_thread(wait_for, lambda: sender.failures >= 1)  # nobody listens yet
        states.append(sender.state("e1"))
        receiver.start()
        await asyncio.to_thread(wait_for, lambda: sender.delivered == 1)
        states.append(sender.state("e1"))
        await asyncio.sleep(1.0)  # longer than the longest wait between tries
        await sender.stop()

    asyncio.run(scenario())
    assert len(receiver.received) == 1 and outbox.pending == {}
    got = receiver.received[0]
    assert got.idempotency_key == "wo-1" and got.json()["event_id"] == "e1"
    stamp, body = got.headers["x-hotline-timestamp"], got.body
    expected = hmac.new(b"s3cret", stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    assert got.headers["x-hotline-signature"] == f"sha256={expected}" == signature(b"s3cret", stamp, body)
    sending, waiting, sent = states
    assert sending is not None and (sending.stage, sending.tries, sending.error) == ("sending", 0, None)
    assert waiting is not None and waiting.stage == "waiting" and waiting.tries >= 1 and waiting.retry_at is not None
    assert waiting.error is not None and waiting.error.startswith("the ticket system did not answer")
    assert sent is not None and sent.stage == "sent" and sent.tries == waiting.tries + 1 and sent.error is None
    assert sender.attempts == {} and sender.not_before == {}  # nothing kept of what is finished but its state


def test_a_5xx_is_retried_and_a_4xx_is_final(tmp_path: Path, receiver: Receiver) -> None:
    receiver.statuses = [503, 422]
    receiver.start()
    outbox = Outbox(tmp_path / "outbox.jsonl")
    sender = WebhookSender(outbox, Backoff(0.1, 0.1), environ={"TICKETS_KEY": "k"})

    async def scenario() -> None:
        sender.start()
        outbox.add(delivery(receiver.url))
        sender.wake()
        await asyncio.to_thread(wait_for, lambda: not outbox.pending)
        await sender.stop()

    asyncio.run(scenario())
    assert len(receiver.received) == 2 and sender.delivered == 0
    assert (tmp_path / "outbox.jsonl").read_text() == ""  # nothing left to replay
    refused = sender.state("e1")
    assert refused is not None and (refused.stage, refused.tries) == ("refused", 2)
    assert refused.error == "the ticket system answered 422 Unprocessable Entity"


def test_a_url_the_client_cannot_use_stops_neither_the_sender_nor_the_other_work_orders(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Outbox lines written before routes files checked the URL: an invalid one is final, a port
    out of range (an ``ExceptionGroup`` from the client) is retried; the good one still goes."""
    receiver.start()
    outbox = Outbox(tmp_path / "outbox.jsonl")
    sender = WebhookSender(outbox, Backoff(0.1, 0.1), environ={"TICKETS_KEY": "k"})

    async def scenario() -> None:
        sender.start()
        outbox.add(delivery("http://[::1/tickets", "bad-url"))
        outbox.add(delivery("http://127.0.0.1:99999/tickets", "bad-port"))
        outbox.add(delivery(receiver.url, "good"))
        sender.wake()
        await asyncio.to_thread(wait_for, lambda: sender.delivered == 1 and sender.attempts.get("bad-port", 0) >= 2)
        await sender.stop()

    asyncio.run(scenario())
    assert [r.json()["event_id"] for r in receiver.received] == ["good"]
    bad_url, bad_port = sender.state("bad-url"), sender.state("bad-port")
    assert bad_url is not None and bad_url.stage == "refused" and "the webhook URL cannot be used" in str(bad_url.error)
    assert bad_port is not None and bad_port.stage == "waiting" and "could not send it" in str(bad_port.error)
    assert list(outbox.pending) == ["bad-port"]


def test_an_unset_signing_key_waits_and_says_which_variable(tmp_path: Path, receiver: Receiver) -> None:
    receiver.start()
    outbox = Outbox(tmp_path / "outbox.jsonl")
    sender = WebhookSender(outbox, Backoff(0.1, 0.1), environ={})

    async def scenario() -> None:
        sender.start()
        outbox.add(delivery(receiver.url))
        sender.wake()
        await asyncio.to_thread(wait_for, lambda: sender.failures >= 1)
        await sender.stop()

    asyncio.run(scenario())
    waiting = sender.state("e1")
    assert receiver.received == [] and waiting is not None and waiting.stage == "waiting"
    assert waiting.error is not None and "TICKETS_KEY" in waiting.error


def test_a_confirmed_work_order_reaches_the_routes_ticket_system(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKETS_KEY", "route-key")
    receiver = Receiver(free_tcp_port(), secret=b"route-key")
    receiver.start()
    console_yaml = write_configs(tmp_path, redis_server.url)
    route_webhook(console_yaml, receiver.url, "TICKETS_KEY")
    events, ended = drafted_call("wo-hook", console_yaml.parent)
    try:
        with running_console(console_yaml) as base, LivePublisher(redis_server.url, tmp_path / "pub") as publisher:
            for event in [*events, ended]:
                publisher.submit(event)
            publisher.wait_published(len(events) + 1)
            agent = login(base, "agent1")
            assert agent.get("/api/calls/wo-hook/workorder").json() == {"deliveries": {}}  # nothing confirmed yet
            answer = agent.post("/api/calls/wo-hook/workorder", json={"fields": {}})
            assert answer.status_code == 200 and answer.json()["webhook"] == "queued", answer.text
            event_id = answer.json()["event"]["event_id"]
            wait_for(
                lambda: agent.get("/api/calls/wo-hook/workorder").json()["deliveries"][event_id]["stage"] == "sent"
            )
            assert login(base, "agent2").get("/api/calls/wo-hook/workorder").status_code == 404  # not agent2's call
    finally:
        receiver.stop()
    (got,) = receiver.received
    sent = got.json()
    assert sent["event_type"] == ev.EventType.WORKORDER_CONFIRMED and sent["workorder_id"] == "wo-hook"
    assert got.signed_right and got.idempotency_key == "wo-hook"
