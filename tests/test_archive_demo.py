"""``asr-gateway demo --console`` archives with no extra step: real SIP calls through the whole
service (the bundled model, RTP from sipp, the gateway's Publisher, Redis) reach the demo's
SQLite archive, and a supervisor finds each call in the console by its agent, by a phrase of
the caller's words and by its tag; the agent opens their own archived call; Ctrl-C stops the
archiver with the rest."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from asr_gateway.dev.console_demo import AGENT_ID
from asr_gateway.dev.local_redis import free_tcp_port
from tests.test_console_demo import lines_of
from tests.tool_marks import needs_redis_server, needs_sipp
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[1]
pytestmark = [needs_sipp, needs_redis_server]


def signed_in(base: str, user: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=10)
    token = client.get("/login").text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    answer = client.post("/login", data={"username": user, "password": password, "csrf_token": token})
    assert answer.status_code == 303, answer.text
    return client


def test_the_console_demo_archives_its_calls(tmp_path: Path) -> None:
    port = free_tcp_port()
    env = {key: value for key, value in os.environ.items() if key != "ASR_REDIS_URL"}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "asr_gateway.cli", "demo", "--console", "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output = lines_of(process.stdout)
        printed: list[str] = []
        deadline = time.monotonic() + 120
        while not any(line.startswith("placing the bundled demo calls") for line in printed):
            assert time.monotonic() < deadline and process.poll() is None, "".join(printed)
            if not output.empty():
                printed.append(output.get())
            else:
                time.sleep(0.05)
        text = "".join(printed)
        assert "archived" in text, text
        passwords = dict(re.findall(r"^\s+\w+\s+user (\w+)\s+password (\S+)", text, flags=re.MULTILINE))
        base = f"http://127.0.0.1:{port}"
        supervisor = signed_in(base, "supervisor", passwords["supervisor"])

        def agents_calls() -> list[dict[str, object]]:
            answer = supervisor.get("/api/archive/calls", params={"agent": AGENT_ID})
            assert answer.status_code == 200, answer.text
            return [c for c in answer.json()["calls"] if c["ended_at"] and c["first_words"]]

        wait_until(agents_calls, 180, "a demo call archived after it ended")
        hit = agents_calls()[0]
        call_id, words = str(hit["call_id"]), str(hit["first_words"])
        phrase = re.sub(r"[，。？！,.?!\s*]", "", words)[:4]
        assert len(phrase) >= 3, words
        found = supervisor.get("/api/archive/calls", params={"phrase": phrase}).json()["calls"]
        assert call_id in [c["call_id"] for c in found], (phrase, found)

        record = supervisor.get(f"/api/archive/calls/{call_id}").json()["call"]
        assert record["agent"] == AGENT_ID and record["finals"]

        def demands() -> list[tuple[str, str]]:
            found = []
            for other in agents_calls():
                tags = supervisor.get(f"/api/archive/calls/{other['call_id']}").json()["call"]["tags"]
                found += [(str(other["call_id"]), str(t["label"])) for t in tags if t["kind"] == "demand"]
            return found

        wait_until(demands, 180, "an archived demo call with a demand tag (the manhole)")
        for tagged_id, label in demands():
            found = supervisor.get("/api/archive/calls", params={"tag": label}).json()["calls"]
            assert tagged_id in [c["call_id"] for c in found], (label, found)
        agent = signed_in(base, "agent", passwords["agent"])
        assert agent.get(f"/archive/calls/{call_id}").status_code == 200
        assert agent.get("/archive").status_code == 403
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
    assert code == 0
