"""Shared by the console tests and the console benchmark's checks: a gateway-style config in a
temporary directory (copies of the example routes, KB, tag and analytics rules and street files), a users file with real
argon2 hashes, a console served by uvicorn on a free loopback port, and a real kb_hooks
Publisher on its own thread for publishing events into Redis as the gateway does."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import uvicorn

from asr_gateway.config import load_config
from asr_gateway.dev.local_redis import free_tcp_port
from console.app import build_app
from console.cli import server_config
from console.settings import load_settings
from console.users import hash_password
from kb_hooks import events as ev
from kb_hooks.config import RedisSettings
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.publisher import Publisher
from kb_hooks.types import CallContext, Participant, RedactionMode, TranscriptUpdate

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "deploy" / "config"
MANHOLE = "我今天发现新华路十二号井盖发生了破损有安全隐患"
PASSWORDS = {"admin": "admin-pass-1", "sup": "sup-pass-1", "agent1": "agent-pass-1", "agent2": "agent-pass-2"}


def write_configs(tmp: Path, redis_url: str, gateway_extra: str = "") -> Path:
    """Copies of the example files, a gateway config naming them, users, the console config."""
    conf = tmp / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    for name in ("routes.example.yaml", "kb.example.yaml", "tags.example.yaml", "analytics.example.yaml",
                 "streets.example.txt"):  # fmt: skip
        shutil.copy(EXAMPLES / name, conf / name.replace(".example", ""))
    (conf / "gateway.yaml").write_text(
        f"""redis: {{url: "{redis_url}", spool_dir: {tmp / "spool"}}}
routes: routes.yaml
kb_hooks:
  kb_sets: {{hotline: kb.yaml}}
  tag_rule_sets: {{hotline: tags.yaml}}
  analytics_rule_sets: {{hotline: analytics.yaml}}
  street_lists: {{hotline: streets.txt}}
{gateway_extra}""",
        encoding="utf-8",
    )
    roles = {"admin": "admin", "sup": "supervisor", "agent1": "agent", "agent2": "agent"}
    lines = ["users:"]
    for name, password in PASSWORDS.items():
        agent = f', agent_id: "{1000 + int(name[-1])}"' if name.startswith("agent") else ""
        lines.append(f'  {name}: {{role: {roles[name]}, password_hash: "{hash_password(password)}"{agent}}}')
    (conf / "users.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    console = conf / "console.yaml"
    console.write_text(
        f"""service_config: gateway.yaml
users_file: users.yaml
state_dir: {tmp / "console-state"}
listen: 127.0.0.1:{free_tcp_port()}
""",
        encoding="utf-8",
    )
    return console


@contextmanager
def running_console(console_yaml: Path) -> Iterator[str]:
    """The console on uvicorn in a thread; yields its base URL."""
    settings = load_settings(console_yaml)
    host, port = settings.host_port
    server = uvicorn.Server(server_config(build_app(settings), settings, "warning"))
    thread = threading.Thread(target=server.run, name="console", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("console did not start")
        time.sleep(0.05)
    try:
        yield f"{'https' if settings.tls_certfile else 'http'}://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def login(base: str, user: str, password: str | None = None) -> httpx.Client:
    """An httpx client signed in as ``user`` (with ``password``, else the test users file's);
    its ``headers`` carry the CSRF token."""
    client = httpx.Client(base_url=base, timeout=10)
    page = client.get("/login")
    token = page.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    secret = PASSWORDS[user] if password is None else password
    answer = client.post("/login", data={"username": user, "password": secret, "csrf_token": token})
    assert answer.status_code == 303, answer.text
    client.headers["X-CSRF-Token"] = client.get("/api/me").json()["csrf"]
    return client


class LivePublisher:
    """The gateway's Publisher on its own event loop thread; ``submit`` from any thread."""

    def __init__(self, redis_url: str, spool_dir: Path) -> None:
        self.publisher = Publisher(RedisSettings(url=redis_url, spool_dir=spool_dir, spool_fsync="never"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="publisher", daemon=True)

    def __enter__(self) -> LivePublisher:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.publisher.start(), self.loop).result(10)
        # A partial submitted before the first connection is dropped by design (partials are
        # best effort while Redis is unreachable): wait for it, so the tests' counts hold.
        deadline = time.monotonic() + 10
        while not self.publisher.connected:
            if time.monotonic() > deadline:
                raise TimeoutError("the publisher did not connect to Redis within 10 s")
            time.sleep(0.01)
        return self

    def submit(self, event: ev.Event) -> None:
        self.publisher.submit(event)

    def wait_published(self, count: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.publisher.published < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.publisher.published} of {count} events published "
                                   f"({self.publisher.partials_dropped} partials dropped)")  # fmt: skip
            time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.publisher.stop(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def call_events(call_id: str, agent: str, conf: Path, text: str = MANHOLE, *, agent_key: str = "X-Agent-Id",
                reason: str = "bye", stats: dict[str, Any] | None = None) -> list[ev.Event]:  # fmt: skip
    """A call as the gateway publishes it: started (the agent's id in metadata under ``agent_key``),
    a partial, the final with its KB suggestion and tags (from the real processor), ended."""
    config = load_config(conf / "gateway.yaml")
    processor = TranscriptProcessor.from_settings(config.kb_hooks)
    ctx = CallContext(call_id, route="default", redaction=RedactionMode.MASK, kb_set="hotline", tag_rules=("hotline",))
    caller = Participant("caller", "sip:citizen@pbx")
    agent_side = Participant("agent", f"sip:{agent}@pbx")
    out: list[ev.Event] = [ev.CallStarted(call=ctx, participants=(caller, agent_side), metadata={agent_key: agent})]
    out += processor.process(TranscriptUpdate(ctx, caller, 0, True, text[:8]))
    out += processor.process(TranscriptUpdate(ctx, caller, 0, False, text))
    out.append(ev.CallEnded(call=ctx, reason=reason, stats={"duration_ms": 4000} if stats is None else stats))
    return out


def lines_of(stream: IO[str]) -> queue.Queue[str]:
    """The stream's lines, read on a thread, so a test can wait for one with a deadline."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


@dataclass
class DemoConsole:
    """``asr-gateway demo --console`` as started by ``demo_console``: its URL, what it printed
    up to its first demo calls, and (after the ``with``) its exit status."""

    base: str
    text: str = ""
    exit_code: int | None = None

    @property
    def passwords(self) -> dict[str, str]:
        """The three demo users' fresh passwords, by user name, as the demo printed them."""
        return dict(re.findall(r"^\s+\w+\s+user (\w+)\s+password (\S+)", self.text, flags=re.MULTILINE))


@contextmanager
def demo_console(start_timeout_s: float = 120.0) -> Iterator[DemoConsole]:
    """Run the console demo as a newcomer does (no ``ASR_REDIS_URL``: its own redis-server) until
    it starts placing calls; Ctrl-C (SIGINT) at the end, as a person stops it."""
    port = free_tcp_port()
    env = {key: value for key, value in os.environ.items() if key != "ASR_REDIS_URL"}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "asr_gateway.cli", "demo", "--console", "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    demo = DemoConsole(f"http://127.0.0.1:{port}")
    try:
        assert process.stdout is not None
        output = lines_of(process.stdout)
        printed: list[str] = []
        deadline = time.monotonic() + start_timeout_s
        while not any(line.startswith("placing the bundled demo calls") for line in printed):
            assert time.monotonic() < deadline and process.poll() is None, "".join(printed)
            try:
                printed.append(output.get(timeout=1))
            except queue.Empty:
                continue
        demo.text = "".join(printed)
        yield demo
    finally:
        process.send_signal(signal.SIGINT)
        try:
            demo.exit_code = process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
