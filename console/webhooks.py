"""Confirmed work orders to the hotline's ticket system: one webhook per route, durable, signed, retried.

A confirmation whose route's profile names ``workorder.webhook_url`` is appended to the outbox
(``STATE/webhook-outbox.jsonl``, fsynced) before the agent's POST is answered; ``WebhookSender``
POSTs it until the receiver answers 2xx, with backoff (``Backoff``: console.yaml's
``webhook_retry_first_s``, doubling up to ``webhook_retry_max_s``) across outages and console
restarts (the outbox is read back at start). A 4xx other than 408 and 429 is final: the
receiver refused it, the outbox records that and the log says why; so is a URL the HTTP client
cannot use. ``WebhookSender.state`` says where a delivery stands, for the call page. Each POST carries

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
from typing import Literal

import httpx

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
FINISHED_KEPT = 10_000  # finished deliveries whose outcome the call page can still ask for


@dataclass(frozen=True)
class Backoff:
    """Seconds between one delivery's tries: ``first_s`` after the first failure, doubling, at most ``max_s``."""

    first_s: float = 1.0
    max_s: float = 300.0

    def after(self, attempts: int) -> float:
        """Seconds to wait after ``attempts`` failed tries (1, 2, 4 ... with the defaults)."""
        return min(self.max_s, self.first_s * 2.0 ** max(attempts - 1, 0))


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


Stage = Literal["sending", "waiting", "sent", "refused"]


@dataclass(frozen=True)
class DeliveryState:
    """Where one confirmed work order's delivery stands: ``sending`` (not tried yet), ``waiting``
    (every one of its ``tries`` failed, the next at ``retry_at``, unix s), ``sent`` (answered
    2xx) or ``refused`` (final: a 4xx, or a URL that cannot be used); ``error`` says why in words."""

    event_id: str
    workorder_id: str
    stage: Stage
    tries: int
    retry_at: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


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

    def __init__(self, outbox: Outbox, backoff: Backoff = Backoff(), environ: Mapping[str, str] = os.environ,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.outbox = outbox
        self.backoff = backoff
        self.environ = environ
        self.clock = clock
        self.attempts: dict[str, int] = {}
        self.not_before: dict[str, float] = {}
        self.last_error: dict[str, str] = {}
        self.finished: dict[str, DeliveryState] = {}  # by event id, oldest first, at most FINISHED_KEPT
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

    def state(self, event_id: str) -> DeliveryState | None:
        """The delivery of the ``workorder.confirmed`` ``event_id``; None when this console has
        none (the route sends no webhook, or it ended before this console started)."""
        pending = self.outbox.pending.get(event_id)
        if pending is None:
            return self.finished.get(event_id)
        tries = self.attempts.get(event_id, 0)
        return DeliveryState(event_id, pending.workorder_id, "waiting" if tries else "sending", tries,
                             self.not_before.get(event_id), self.last_error.get(event_id))  # fmt: skip

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            while True:
                self._wake.clear()
                now = self.clock()
                for delivery in list(self.outbox.pending.values()):
                    if self.not_before.get(delivery.event_id, 0.0) <= now:
                        await self._try(client, delivery)
                due = [self.not_before.get(e, 0.0) for e in self.outbox.pending]
                wait = max(0.05, min(due) - self.clock()) if due else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)

    async def _try(self, client: httpx.AsyncClient, delivery: Delivery) -> None:
        """``send``, outliving what the HTTP client raises beyond its own errors (an
        ``ExceptionGroup`` for a port out of range, say): one delivery's surprise must not stop
        the deliveries of every other work order; the traceback goes to the log."""
        try:
            await self.send(client, delivery)
        except Exception as exc:
            log.exception("webhook %s: sending work order %s failed; retried", delivery.url, delivery.workorder_id)
            self._retry_later(delivery, f"the console could not send it: {exc!r}")

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
                self._retry_later(delivery, f"the console's environment has no {delivery.secret_env} "
                                            "(the route's webhook_secret_env), the key it is signed with")  # fmt: skip
                return
            headers["X-Hotline-Signature"] = signature(secret.encode(), timestamp, body)
        try:
            answer = await client.post(delivery.url, content=body, headers=headers)
        except httpx.InvalidURL as exc:
            log.error("webhook %s is not a URL the console can use (%s); work order %s not sent", delivery.url, exc,
                      delivery.workorder_id)  # fmt: skip
            self._finish(delivery, "refused invalid-url", f"the webhook URL cannot be used: {exc}")
            return
        except httpx.HTTPError as exc:
            log.warning("webhook %s unreachable (%s); work order %s retried", delivery.url, exc, delivery.workorder_id)
            self._retry_later(delivery, f"the ticket system did not answer: {str(exc) or type(exc).__name__}")
            return
        if answer.is_success:
            self._finish(delivery, "delivered", None)
            self.delivered += 1
        elif 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
            log.error("webhook %s refused work order %s: %d %s", delivery.url, delivery.workorder_id,
                      answer.status_code, answer.text[:200])  # fmt: skip
            said = f": {answer.text[:200]}" if answer.text.strip() else ""
            self._finish(delivery, f"refused {answer.status_code}",
                         f"the ticket system answered {answer.status_code} {answer.reason_phrase}{said}")  # fmt: skip
        else:
            log.warning("webhook %s answered %d; work order %s retried", delivery.url, answer.status_code,
                        delivery.workorder_id)  # fmt: skip
            self._retry_later(delivery, f"the ticket system answered {answer.status_code} {answer.reason_phrase}")

    def _finish(self, delivery: Delivery, outcome: str, error: str | None) -> None:
        self.outbox.finish(delivery.event_id, outcome)
        tries = self.attempts.pop(delivery.event_id, 0) + 1
        self.not_before.pop(delivery.event_id, None)
        self.last_error.pop(delivery.event_id, None)
        stage: Stage = "sent" if outcome == "delivered" else "refused"
        self.finished[delivery.event_id] = DeliveryState(delivery.event_id, delivery.workorder_id, stage, tries,
                                                         None, error)  # fmt: skip
        while len(self.finished) > FINISHED_KEPT:
            del self.finished[next(iter(self.finished))]

    def _retry_later(self, delivery: Delivery, error: str) -> None:
        self.failures += 1
        attempts = self.attempts[delivery.event_id] = self.attempts.get(delivery.event_id, 0) + 1
        self.not_before[delivery.event_id] = self.clock() + self.backoff.after(attempts)
        self.last_error[delivery.event_id] = error
