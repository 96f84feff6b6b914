"""``asr-gateway demo --console`` archives with no extra step: real SIP calls through the whole
service (the bundled model, RTP from sipp, the gateway's Publisher, Redis) reach the demo's
SQLite archive, and a supervisor finds each call in the console by its agent, by a phrase of
the caller's words and by its tag; the agent opens their own archived call; Ctrl-C stops the
archiver with the rest."""

from __future__ import annotations

import re
from pathlib import Path

from asr_gateway.dev.console_demo import AGENT_ID
from tests.console_helpers import demo_console, login
from tests.tool_marks import needs_redis_server, needs_sipp
from tests.waiting import wait_until

pytestmark = [needs_sipp, needs_redis_server]


def test_the_console_demo_archives_its_calls(tmp_path: Path) -> None:
    with demo_console() as demo:
        assert "archived" in demo.text, demo.text
        passwords, base = demo.passwords, demo.base
        supervisor = login(base, "supervisor", passwords["supervisor"])

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
        agent = login(base, "agent", passwords["agent"])
        assert agent.get(f"/archive/calls/{call_id}").status_code == 200
        assert agent.get("/archive").status_code == 403
    assert demo.exit_code == 0
