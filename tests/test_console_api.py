"""The console's HTTP API against a real redis-server, with events published by the real
kb_hooks Publisher and made by the real TranscriptProcessor: sign-in, roles, CSRF, the calls
API and its SSE resume, validation with check-config's messages, try it, apply, versions,
rollback, audit, and the gateways' heartbeat and reload channel; on a real three-master Redis
Cluster, the calls of every firehose shard and their hash-tagged streams."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from asr_common.yamlconf import ConfigError
from asr_gateway.config import load_config
from asr_gateway.config_check import check_referenced_files
from asr_gateway.dev.local_redis import LocalRedisCluster
from asr_gateway.heartbeat import Heartbeat, control_channel, nodes_key
from kb_hooks import events as ev
from kb_hooks.types import CallContext
from tests.console_helpers import MANHOLE, LivePublisher, call_events, login, running_console, write_configs
from tests.redis_server import RedisServer, redis_cluster, redis_server
from tests.waiting import wait_until_async

__all__ = ["redis_cluster", "redis_server"]


@pytest.fixture()
def console(tmp_path: Path, redis_server: RedisServer) -> Iterator[tuple[str, Path]]:
    console_yaml = write_configs(tmp_path, redis_server.url)
    with running_console(console_yaml) as base:
        yield base, console_yaml.parent


def sse(client: httpx.Client, url: str, count: int, headers: dict[str, str] | None = None,
        timeout_s: float = 10.0) -> list[tuple[str | None, dict[str, Any]]]:  # fmt: skip
    """The first ``count`` SSE messages of ``url`` as (id, data)."""
    out: list[tuple[str | None, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout_s
    with client.stream("GET", url, headers=headers or {}, timeout=httpx.Timeout(timeout_s)) as response:
        assert response.status_code == 200, response.read()
        event_id, data = None, []
        for line in response.iter_lines():
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                out.append((event_id, json.loads("\n".join(data))))
                event_id, data = None, []
                if len(out) >= count:
                    break
            if time.monotonic() > deadline:
                break
    return out


def test_health_is_the_only_door_without_login(console: tuple[str, Path]) -> None:
    base, _ = console
    with httpx.Client(base_url=base, timeout=10) as anonymous:
        assert anonymous.get("/health").json() == {"ok": True, "redis": True}
        for path in ("/api/calls", "/api/calls/x", "/api/calls/x/events", "/api/admin/files", "/api/admin/nodes"):
            assert anonymous.get(path).status_code == 401, path
        page = anonymous.get("/admin")
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
        assert anonymous.post("/api/admin/apply", json={"key": "kb:hotline", "content": ""}).status_code == 401
        form = anonymous.get("/login").text
        token = form.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        bad = anonymous.post("/login", data={"username": "admin", "password": "wrong", "csrf_token": token})
        assert bad.status_code == 401
        no_csrf = anonymous.post("/login", data={"username": "admin", "password": "admin-pass-1"})
        assert no_csrf.status_code == 403
    with httpx.Client(base_url=base, timeout=10) as fresh:
        cookie = fresh.get("/login").headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie, cookie


def test_writes_need_the_csrf_token_and_the_admin_role(console: tuple[str, Path]) -> None:
    base, conf = console
    admin = login(base, "admin")
    draft = (conf / "kb.yaml").read_text(encoding="utf-8")
    ok = admin.post("/api/admin/validate", json={"key": "kb:hotline", "content": draft})
    assert ok.status_code == 200 and ok.json() == {"ok": True, "errors": []}
    token = admin.headers.pop("X-CSRF-Token")
    assert admin.post("/api/admin/validate", json={"key": "kb:hotline", "content": draft}).status_code == 403
    wrong = admin.post("/api/admin/apply", json={"key": "kb:hotline", "content": draft},
                       headers={"X-CSRF-Token": token[:-2] + "xx"})  # fmt: skip
    assert wrong.status_code == 403
    assert (conf / "kb.yaml").read_text(encoding="utf-8") == draft
    agent = login(base, "agent1")
    assert agent.get("/api/admin/files").status_code == 403
    assert agent.post("/api/admin/apply", json={"key": "kb:hotline", "content": draft}).status_code == 403
    assert agent.get("/admin").status_code == 403


def test_agents_see_their_calls_supervisors_all(console: tuple[str, Path], redis_server: RedisServer,
                                                tmp_path: Path) -> None:  # fmt: skip
    base, conf = console
    with LivePublisher(redis_server.url, tmp_path / "pub") as publisher:
        for event in call_events("call-a", "1001", conf) + call_events("call-b", "1002", conf, "路灯坏了"):
            publisher.submit(event)
        publisher.wait_published(2 * 6)
    agent1, sup = login(base, "agent1"), login(base, "sup")
    deadline = time.monotonic() + 5
    while len(sup.get("/api/calls").json()["calls"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {c["call_id"] for c in sup.get("/api/calls").json()["calls"]} == {"call-a", "call-b"}
    mine = agent1.get("/api/calls").json()["calls"]
    assert [c["call_id"] for c in mine] == ["call-a"]
    assert mine[0]["suggestions"] == ["井盖破损应急处置流程"] and mine[0]["agent_id"] == "1001"
    ((_, listed),) = sse(agent1, "/api/calls/stream", 1)
    assert [c["call_id"] for c in listed["calls"]] == ["call-a"]
    assert agent1.get("/api/calls/call-b").status_code == 404
    assert agent1.get("/api/calls/call-b/events").status_code == 404
    # the call page checks exactly as the API does: another agent's call and an unknown id are 404
    assert agent1.get("/calls/call-b").status_code == 404
    assert agent1.get("/calls/no-such-call").status_code == 404
    assert sup.get("/calls/no-such-call").status_code == 404
    assert agent1.get("/calls/call-a").status_code == 200 and sup.get("/calls/call-b").status_code == 200
    snapshot = agent1.get("/api/calls/call-a").json()
    types = [e["event_type"] for e in snapshot["events"]]
    assert types[0] == "call.started" and types[-1] == "call.ended" and "kb.suggestion" in types
    assert all(e["stream_id"] for e in snapshot["events"])


def test_cluster_calls_of_every_firehose_shard(redis_cluster: LocalRedisCluster, tmp_path: Path) -> None:
    """call-a is published before the console starts (found by the bootstrap read of the shards),
    call-b while it runs (found by the shard readers); their streams are on different masters."""
    console_yaml = write_configs(tmp_path, redis_cluster.url)
    conf = console_yaml.parent
    layout = load_config(conf / "gateway.yaml").redis.layout
    assert layout.shards == 16 and layout.shard_of("call-a") != layout.shard_of("call-b")
    with LivePublisher(redis_cluster.url, tmp_path / "pub") as publisher:
        for event in call_events("call-a", "1001", conf):
            publisher.submit(event)
        publisher.wait_published(6)
        with running_console(console_yaml) as base:
            sup, agent2 = login(base, "sup"), login(base, "agent2")
            for event in call_events("call-b", "1002", conf, "路灯坏了"):
                publisher.submit(event)
            publisher.wait_published(2 * 6)
            deadline = time.monotonic() + 10
            while len(sup.get("/api/calls").json()["calls"]) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            calls = {c["call_id"]: c for c in sup.get("/api/calls").json()["calls"]}
            assert set(calls) == {"call-a", "call-b"}
            assert calls["call-a"]["suggestions"] == ["井盖破损应急处置流程"] and not calls["call-a"]["active"]
            assert [c["call_id"] for c in agent2.get("/api/calls").json()["calls"]] == ["call-b"]
            for call_id in ("call-a", "call-b"):
                snapshot = sup.get(f"/api/calls/{call_id}").json()
                types = [e["event_type"] for e in snapshot["events"]]
                assert types[0] == "call.started" and types[-1] == "call.ended" and "tags" in types
                assert {e["call_id"] for e in snapshot["events"]} == {call_id}
                streamed = sse(sup, f"/api/calls/{call_id}/events", len(types))
                assert [sid for sid, _ in streamed] == [e["stream_id"] for e in snapshot["events"]]
            assert agent2.get("/api/calls/call-a").status_code == 404


def test_call_events_resume_from_last_event_id_and_go_live(console: tuple[str, Path], redis_server: RedisServer,
                                                           tmp_path: Path) -> None:  # fmt: skip
    base, conf = console
    events = call_events("call-live", "1001", conf)
    stored, ended = [e for e in events[:-1] if not isinstance(e, ev.TranscriptPartial)], events[-1]
    sup = login(base, "sup")
    with LivePublisher(redis_server.url, tmp_path / "pub") as publisher:
        for event in stored:
            publisher.submit(event)
        publisher.wait_published(len(stored))
        deadline = time.monotonic() + 5
        while sup.get("/api/calls/call-live").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        first = sse(sup, "/api/calls/call-live/events", len(stored))
        assert [e["event_id"] for _, e in first] == [e.event_id for e in stored]
        assert all(sid for sid, _ in first)
        # A viewer that saw the first two resumes after the second: it gets the rest, nothing twice.
        resumed = sse(sup, "/api/calls/call-live/events", len(stored) - 2, {"Last-Event-ID": first[1][0] or ""})
        assert [e["event_id"] for _, e in resumed] == [e.event_id for e in stored[2:]]
        # Live: a partial (no id) and call.ended arrive while the viewer waits after the history.
        partial = dataclasses.replace(events[1], call=CallContext("call-live"), event_id="p" * 32)

        def later() -> None:
            time.sleep(0.8)
            publisher.submit(partial)
            publisher.submit(ended)

        threading.Thread(target=later, daemon=True).start()
        live = sse(sup, "/api/calls/call-live/events", 2, {"Last-Event-ID": first[-1][0] or ""})
        # (pub/sub and the stream are separate paths: their relative order is not guaranteed)
        got = {e["event_type"]: sid for sid, e in live}
        assert set(got) == {"transcript.partial", "call.ended"}
        assert got["transcript.partial"] is None and got["call.ended"]


def test_validation_shows_check_config_messages(console: tuple[str, Path]) -> None:
    base, conf = console
    admin = login(base, "admin")
    broken = (conf / "kb.yaml").read_text(encoding="utf-8").replace("priority: 80", "priority: 180")
    answer = admin.post("/api/admin/validate", json={"key": "kb:hotline", "content": broken}).json()
    # check-config on the same content at the real path gives the same lines
    copy = conf / "kb.check.yaml"
    copy.write_text(broken, encoding="utf-8")
    config = load_config(conf / "gateway.yaml")
    config = config.model_copy(update={"kb_hooks": config.kb_hooks.model_copy(update={"kb_sets": {"hotline": copy}})})
    try:
        expected = check_referenced_files(config)
    except ConfigError as exc:
        expected = exc.errors
    assert not answer["ok"] and answer["errors"]
    assert answer["errors"] == [line.replace(str(copy), str(conf / "kb.yaml")) for line in expected]
    assert any(f"{conf / 'kb.yaml'}:" in line and "priority" in line for line in answer["errors"]), answer
    rejected = admin.post("/api/admin/apply", json={"key": "kb:hotline", "content": broken})
    assert rejected.status_code == 422
    assert "priority: 80" in (conf / "kb.yaml").read_text(encoding="utf-8")
    bad_routes = admin.post("/api/admin/validate", json={"key": "routes", "content": "profiles: [\n"}).json()
    assert any(line.startswith(f"{conf / 'routes.yaml'}:") for line in bad_routes["errors"]), bad_routes


def test_try_it_runs_the_real_matcher_tagger_and_redaction(console: tuple[str, Path]) -> None:
    base, conf = console
    admin = login(base, "admin")
    answer = admin.post("/api/admin/try", json={"text": "新华路十二号警盖坏了，我电话13812345678"}).json()
    assert answer["profile"] == "default" and answer["redaction"] == "mask"
    assert "13812345678" not in answer["text"] and "*" * 11 in answer["text"]
    (kb,) = [s for s in answer["suggestions"] if s["entry_id"] == "kb-municipal-manhole"]
    assert kb["homophone"] is True and kb["score"] == 0.6 and kb["match_kind"] == "all_of"
    kinds = {(t["kind"], t["label"]) for t in answer["tags"]}
    assert ("entity", "phone") in kinds and any(label == "市政设施/井盖" for _, label in kinds), kinds
    draft = (conf / "kb.yaml").read_text(encoding="utf-8").replace("title: 井盖破损应急处置流程", "title: 井盖草稿")
    drafted = admin.post("/api/admin/try", json={"text": MANHOLE, "drafts": {"kb:hotline": draft}}).json()
    assert [s["title"] for s in drafted["suggestions"]] == ["井盖草稿"]


def test_apply_keeps_versions_reloads_gateways_and_rolls_back(console: tuple[str, Path],
                                                              redis_server: RedisServer) -> None:  # fmt: skip
    base, conf = console
    admin = login(base, "admin")
    original = (conf / "kb.yaml").read_text(encoding="utf-8")
    reloads: list[float] = []
    versions = {"v": "aaaa"}

    async def gateway_side() -> None:
        beat = Heartbeat(redis_server.url, "asr", "gw-1", lambda: {"config_version": versions["v"],
                         "last_reload": {"at": reloads[-1] if reloads else 0, "ok": True, "errors": []},
                         "active_calls": 0}, lambda: reloads.append(time.time()), interval_s=0.2)  # fmt: skip
        beat.start()
        with redis.Redis.from_url(redis_server.url) as client:
            await wait_until_async(
                lambda: client.hexists(nodes_key("asr"), "gw-1") and client.pubsub_numsub(control_channel("asr"))[0][1],
                10.0,
                "gw-1's first report and its subscription to reload requests",
            )
        nodes = await asyncio.to_thread(lambda: admin.get("/api/admin/nodes").json()["nodes"])
        assert [(n["node"], n["config_version"], n["stale"]) for n in nodes] == [("gw-1", "aaaa", False)]
        edited = original.replace("title: 井盖破损应急处置流程", "title: 井盖破损处置（新）")
        applied = await asyncio.to_thread(lambda: admin.post("/api/admin/apply", json={
            "key": "kb:hotline", "content": edited, "comment": "new title"}).json())  # fmt: skip
        assert applied["ok"] and applied["reload_receivers"] == 1, applied
        for _ in range(50):
            if reloads:
                break
            await asyncio.sleep(0.05)
        assert reloads, "the gateway got the reload request"
        await beat.stop()

    asyncio.run(gateway_side())
    assert "井盖破损处置（新）" in (conf / "kb.yaml").read_text(encoding="utf-8")
    kept = admin.get("/api/admin/versions", params={"key": "kb:hotline"}).json()["versions"]
    assert [(v["id"], v["user"]) for v in kept] == [(2, "admin"), (1, "(before console)")]
    diff = admin.get("/api/admin/versions/2").json()["diff"]
    assert (
        "-    title: 井盖破损应急处置流程" in diff.replace("  - id", "") or "-    title: 井盖破损应急处置流程" in diff
    )
    assert "+    title: 井盖破损处置（新）" in diff
    with redis.Redis.from_url(redis_server.url) as client, client.pubsub() as pubsub:
        pubsub.subscribe(control_channel("asr"))
        pubsub.get_message(timeout=1)
        back = admin.post("/api/admin/rollback", json={"version": 1}).json()
        message = pubsub.get_message(timeout=2)
        assert message is not None and message["data"] == b"reload"
    assert back["ok"] and back["version"]["id"] == 3
    assert (conf / "kb.yaml").read_text(encoding="utf-8") == original
    actions = [(a["action"], a.get("key")) for a in admin.get("/api/admin/audit").json()["audit"]]
    assert actions[:3] == [("apply", "kb:hotline"), ("rollback", "kb:hotline"), ("apply", "kb:hotline")]
    assert admin.post("/api/admin/rollback", json={"version": 99}).status_code == 404
