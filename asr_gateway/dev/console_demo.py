"""``asr-gateway demo --console``: the product as its users see it, in one command.

Starts the service as ``asr-gateway demo`` does (the bundled model, the demo's routes, KB and
tag rules, copied into the work directory so the console's admin editor changes the copies the
service reads), the console as a subprocess (``python -m console``: it sits above asr_gateway
and nothing may import it) with an agent, a supervisor and an admin whose passwords are made
here and printed once, then places the bundled demo calls round after round, each for the demo
agent (``X-Agent-Id``), until Ctrl-C or SIGTERM (or ``--rounds``), and stops everything.
The archiver (``python -m archive run``, a subprocess for the same reason) keeps every ended
call in ``archive.db`` in the work directory, which the console's Archive page searches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from asr_gateway.config import ServiceConfig
from asr_gateway.dev.demo import (
    DATA_DIR,
    DEMO_CALLS,
    DEMO_ERRORS,
    KEY_PREFIX,
    DemoError,
    build_parser,
    demo_config,
    model_and_redis,
    place_demo_call,
)
from asr_gateway.logs import configure_logging
from asr_gateway.service import Service

AGENT_ID = "1001"
ROUND_PAUSE_S = 3.0
CONSOLE_START_TIMEOUT_S = 60.0
CONSOLE_STOP_TIMEOUT_S = 10.0


async def _stop_child(process: asyncio.subprocess.Process | None) -> None:
    """SIGTERM a child the demo started, and SIGKILL it if it has not exited in time."""
    if process is None or process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), CONSOLE_STOP_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()


@dataclass(frozen=True)
class DemoUser:
    name: str
    role: str
    password: str
    agent_id: str | None = None


def make_users() -> list[DemoUser]:
    """An agent (whose calls the demo places), a supervisor and an admin, each a fresh password."""
    return [
        DemoUser("agent", "agent", secrets.token_urlsafe(12), AGENT_ID),
        DemoUser("supervisor", "supervisor", secrets.token_urlsafe(12)),
        DemoUser("admin", "admin", secrets.token_urlsafe(12)),
    ]


def console_environment() -> dict[str, str]:
    """The console reads the Redis its service config names: ASR_* overrides meant for the demo's
    own choice of Redis (``--redis``, ``$ASR_REDIS_URL``) must not send it elsewhere."""
    return {key: value for key, value in os.environ.items() if not key.startswith("ASR_")}


async def hash_password(password: str) -> str:
    """``asr-console hash-password``'s hash of ``password`` (one way of hashing, the console's)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "console", "hash-password", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=console_environment(),
    )  # fmt: skip
    out, err = await process.communicate(f"{password}\n".encode())
    if process.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise DemoError(f"the console could not hash a password ({last}); is it installed? "
                        "pip install 'hotline-asr[console]'")  # fmt: skip
    return out.decode().strip()


async def write_console_files(workdir: Path, redis_url: str, listen: str, users: list[DemoUser]) -> Path:
    """The demo's routes, KB and tag files copied to ``workdir/conf``, a service config naming
    them and the demo's Redis, the users file and the console's config; returns the latter."""
    conf = workdir / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    for name in ("routes.yaml", "kb.yaml", "tags.yaml", "analytics.yaml", "streets.txt"):
        shutil.copy(DATA_DIR / name, conf / name)
    service = {
        "redis": {"url": redis_url, "key_prefix": KEY_PREFIX, "spool_dir": str(workdir / "spool")},
        "routes": "routes.yaml",
        "kb_hooks": {
            "kb_sets": {"hotline": "kb.yaml"},
            "tag_rule_sets": {"hotline": "tags.yaml"},
            "analytics_rule_sets": {"hotline": "analytics.yaml"},
            "street_lists": {"hotline": "streets.txt"},
        },
    }
    (conf / "gateway.yaml").write_text(json.dumps(service, indent=2) + "\n", encoding="utf-8")  # JSON is YAML
    hashes = await asyncio.gather(*(hash_password(user.password) for user in users))
    entries: dict[str, dict[str, str]] = {}
    for user, hashed in zip(users, hashes, strict=True):
        entries[user.name] = {"role": user.role, "password_hash": hashed}
        if user.agent_id:
            entries[user.name]["agent_id"] = user.agent_id
    (conf / "users.yaml").write_text(json.dumps({"users": entries}, indent=2) + "\n", encoding="utf-8")
    console = {"service_config": "gateway.yaml", "users_file": "users.yaml", "listen": listen,
               "state_dir": str(workdir / "console-state"), "archive_db": archive_url(workdir)}  # fmt: skip
    (conf / "console.yaml").write_text(json.dumps(console, indent=2) + "\n", encoding="utf-8")
    return conf / "console.yaml"


def archive_url(workdir: Path) -> str:
    """The demo's call archive: one SQLite file in the work directory (docs/archive.md)."""
    return f"sqlite://{(workdir / 'archive.db').resolve()}"


class ArchiverProcess:
    """``python -m archive run`` on the demo's Redis into ``archive_url(workdir)``; ``stop()``
    ends it (SIGTERM; what it read and did not write is read again by a next start)."""

    def __init__(self, redis_url: str, workdir: Path) -> None:
        self.command = [sys.executable, "-m", "archive", "run", "--redis", redis_url, "--db", archive_url(workdir),
                        "--prefix", KEY_PREFIX, "--consumer", "demo", "--agent-id-key", "X-Agent-Id"]  # fmt: skip
        self.log = workdir / "archive.log"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.command, stdout=log, stderr=subprocess.STDOUT, env=console_environment()
            )

    async def stop(self) -> None:
        await _stop_child(self.process)


def service_config(redis_url: str, model_dir: Path, workdir: Path) -> ServiceConfig:
    """``demo_config`` reading the copies the console edits (so an applied change reaches it)."""
    config = demo_config(redis_url, model_dir, workdir)
    conf = workdir / "conf"
    hooks = config.kb_hooks.model_copy(
        update={
            "kb_sets": {"hotline": conf / "kb.yaml"},
            "tag_rule_sets": {"hotline": conf / "tags.yaml"},
            "analytics_rule_sets": {"hotline": conf / "analytics.yaml"},
            "street_lists": {"hotline": conf / "streets.txt"},
        }
    )
    return config.model_copy(update={"routes": conf / "routes.yaml", "kb_hooks": hooks})


class ConsoleProcess:
    """``python -m console --config FILE`` with its log in ``log``; ``stop()`` ends it (SIGTERM, then kill)."""

    def __init__(self, console_yaml: Path, log: Path) -> None:
        self.console_yaml = console_yaml
        self.log = log
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, health_url: str) -> None:
        with self.log.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "console", "--config", str(self.console_yaml), "--log-level", "warning",
                stdout=log, stderr=subprocess.STDOUT, env=console_environment(),
            )  # fmt: skip
        deadline = asyncio.get_running_loop().time() + CONSOLE_START_TIMEOUT_S
        while not await asyncio.to_thread(_answers, health_url):
            if self.process.returncode is not None or asyncio.get_running_loop().time() > deadline:
                lines = self.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
                last = lines[-1] if lines else "no output"
                hint = "; --listen HOST:PORT picks another address" if "address already in use" in last else ""
                raise DemoError(f"the console did not start: {last}{hint}")
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        await _stop_child(self.process)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def console_url(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    host = "127.0.0.1" if host in ("0.0.0.0", "[::]", "") else host
    return f"http://{host}:{port}/"


def print_welcome(url: str, users: list[DemoUser], out: TextIO) -> None:
    out.write(f"\nconsole: {url}\n")
    out.write("sign in as (these passwords are shown only now):\n")
    for user in users:
        sees = f"agent {user.agent_id}: the demo's calls are theirs" if user.agent_id else "every call"
        if user.role == "admin":
            sees += "; edits routes, KB and tag rules"
        out.write(f"  {user.role:<10} user {user.name:<10} password {user.password}   ({sees})\n")
    out.write("ended calls are archived: supervisor and admin search them on the Archive page\n")
    out.write("placing the bundled demo calls round after round; Ctrl-C stops everything\n\n")
    out.flush()


async def place_rounds(sip_port: int, workdir: Path, rounds: int, stop: asyncio.Event, out: TextIO) -> None:
    """Round after round of the demo calls (all three at once) until ``stop`` is set or ``rounds``
    rounds (0: no limit) are done; a round still running when ``stop`` is set is cut short."""
    done = 0
    while not stop.is_set() and (rounds == 0 or done < rounds):
        done += 1
        run_id = f"{os.getpid()}{random.randrange(10**6):06d}"
        round_dir = workdir / f"round-{done}"
        headers = f"X-Agent-Id: {AGENT_ID}"
        placing = asyncio.gather(*(
            place_demo_call(call, f"{call.tag}-{run_id}", round_dir, sip_port, extra_headers=headers)
            for call in DEMO_CALLS
        ))  # fmt: skip
        stopping = asyncio.create_task(stop.wait())
        either: set[asyncio.Future[Any]] = {placing, stopping}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not placing.done():
            placing.cancel()
            await asyncio.gather(placing, return_exceptions=True)
            break
        results = placing.result()
        ok = sum(result.returncode == 0 for result in results)
        out.write(f"round {done}: {ok} of {len(results)} calls completed\n")
        out.flush()
        shutil.rmtree(round_dir, ignore_errors=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ROUND_PAUSE_S)


async def run_console_demo(model_dir: Path, redis_url: str, workdir: Path, listen: str, rounds: int,
                           out: TextIO) -> None:  # fmt: skip
    """The service, the console with three users, the calls; everything stopped on return."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    users = make_users()
    console_yaml = await write_console_files(workdir, redis_url, listen, users)
    service = Service(service_config(redis_url, model_dir, workdir))
    console = ConsoleProcess(console_yaml, workdir / "console.log")
    archiver = ArchiverProcess(redis_url, workdir)
    try:
        ports = await service.start()
        if ports.sip_udp is None:
            raise DemoError("the service opened no UDP SIP port")
        url = console_url(listen)
        await archiver.start()
        await console.start(url + "health")
        print_welcome(url, users, out)
        await place_rounds(ports.sip_udp, workdir, rounds, stop, out)
    finally:
        await console.stop()
        await service.stop(grace_s=5.0)
        await archiver.stop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def main(argv: list[str] | None = None) -> int:
    """``asr-gateway demo --console``: the demo's options (``demo.build_parser``), then the service,
    the console and the calls until Ctrl-C or ``--rounds``."""
    args = build_parser().parse_args(argv)
    configure_logging("warning", "console")
    try:
        with model_and_redis(args) as (model_dir, redis_url, workdir):
            asyncio.run(run_console_demo(model_dir, redis_url, workdir, args.listen, args.rounds, sys.stdout))
    except DEMO_ERRORS as exc:
        print(f"asr-gateway demo: {exc}", file=sys.stderr)
        return 2
    return 0
