"""Confirmed work orders to the hotline's ticket system: one webhook per route, durable, signed, retried.

A confirmation whose route's profile names ``workorder.webhook_url`` is appended to the outbox
(``STATE/webhook-outbox.jsonl``, fsynced) before the agent's POST is answered; ``WebhookSender``
POSTs it until the receiver answers 2xx, with backoff (``backoff_s``) across outages and
console restarts (the outbox is read back at start). A 4xx other than 408 and 429 is final: the
receiver refused it, the outbox records that and the log says why. Each POST carries

* ``Idempotency-Key``: the ``workorder_id`` (one work order per call): a retry, or a later
  confirmation of the same work order, is the same ticket to the receiver;
* ``X-Hotline-Timestamp`` (unix s) and ``X-Hotline-Signature: sha256=<hex>``, the HMAC-SHA256
  of ``<timestamp>.<body>`` with the secret in the environment variable the route names
  (``workorder.webhook_secret_env``);
* the body: the ``workorder.confirmed`` event's JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 300.0
TIMEOUT_S = 10.0


def backoff_s(attempts: int) -> float:
    """Seconds to wait after ``attempts`` failed tries: 1, 2, 4 ... up to ``MAX_BACKOFF_S``."""
    return min(MAX_BACKOFF_S, 2.0 ** max(attempts - 1, 0))


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: the HMAC-SHA256 of ``<timestamp>.<body>`` (receivers recompute it)."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Delivery:
    """One confirmed work order to POST."""

    event_id: str  # the workorder.confirmed event's
    workorder_id: str
    url: str
    secret_env: str | None
    body: str


class Outbox:
    """The deliveries not yet answered, kept in an append-only JSON-lines file (fsynced)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending: dict[str, Delivery] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    record = json.loads(line)
                    if record["op"] == "add":
                        self.pending[record["event_id"]] = Delivery(**record["delivery"])
                    else:
                        self.pending.pop(record["event_id"], None)
        path.parent.mkdir(parents=True, exist_ok=True)

    def _append(self, record: Mapping[str, object]) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())

    def add(self, delivery: Delivery) -> None:
        self._append({"op": "add", "event_id": delivery.event_id, "delivery": asdict(delivery)})
        self.pending[delivery.event_id] = delivery

    def finish(self, event_id: str, outcome: str) -> None:
        """The receiver answered (``delivered`` or ``refused <status>``): never sent again."""
        self._append({"op": "done", "event_id": event_id, "outcome": outcome, "at": time.time()})
        self.pending.pop(event_id, None)
        if not self.pending:
            self.path.write_text("", encoding="utf-8")  # nothing left to replay: start the file afresh


class WebhookSender:
    """Sends the outbox's deliveries in the background; ``wake()`` after adding one."""

    def __init__(self, outbox: Outbox, environ: Mapping[str, str] = os.environ,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.outbox = outbox
        self.environ = environ
        self.clock = clock
        self.attempts: dict[str, int] = {}
        self.not_before: dict[str, float] = {}
        self.delivered = 0
        self.failures = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="webhooks")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            while True:
                self._wake.clear()
                now = self.clock()
                for delivery in list(self.outbox.pending.values()):
                    if self.not_before.get(delivery.event_id, 0.0) <= now:
                        await self.send(client, delivery)
                due = [self.not_before.get(e, 0.0) for e in self.outbox.pending]
                wait = max(0.05, min(due) - self.clock()) if due else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)

    async def send(self, client: httpx.AsyncClient, delivery: Delivery) -> None:
        """One try; the outcome goes to the outbox, or the next try is scheduled."""
        body = delivery.body.encode()
        timestamp = str(int(self.clock()))
        headers = {"Content-Type": "application/json", "Idempotency-Key": delivery.workorder_id,
                   "X-Hotline-Timestamp": timestamp}  # fmt: skip
        if delivery.secret_env is not None:
            secret = self.environ.get(delivery.secret_env)
            if secret is None:
                log.error("webhook %s: environment variable %s (the route's webhook_secret_env) is not set; "
                          "the work order %s waits until it is", delivery.url, delivery.secret_env,
                          delivery.workorder_id)  # fmt: skip
                self._retry_later(delivery)
                return
            headers["X-Hotline-Signature"] = signature(secret.encode(), timestamp, body)
        try:
            answer = await client.post(delivery.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("webhook %s unreachable (%s); work order %s retried", delivery.url, exc, delivery.workorder_id)
            self._retry_later(delivery)
            return
        if answer.is_success:
            self.outbox.finish(delivery.event_id, "delivered")
            self.delivered += 1
        elif 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
            log.error("webhook %s refused work order %s: %d %s", delivery.url, delivery.workorder_id,
                      answer.status_code, answer.text[:200])  # fmt: skip
            self.outbox.finish(delivery.event_id, f"refused {answer.status_code}")
        else:
            log.warning("webhook %s answered %d; work order %s retried", delivery.url, answer.status_code,
                        delivery.workorder_id)  # fmt: skip
            self._retry_later(delivery)

    def _retry_later(self, delivery: Delivery) -> None:
        self.failures += 1
        attempts = self.attempts[delivery.event_id] = self.attempts.get(delivery.event_id, 0) + 1
        self.not_before[delivery.event_id] = self.clock() + backoff_s(attempts)
