"""What the console shows of surge (docs/events.md ``chunk_ms``, ``reduced_search``): each
party's pace folded from its transcripts (slowed while its latest chunk size is above the
smallest it reported), finals searched the quick way counted; the calls API and the supervisors'
calls page say how many live calls are slowed down; the call page, in headless Chromium while
the events arrive in a real redis-server, says in words that a party was slowed down to save
capacity and marks the quick final, with the route's own size taken from the routes file; the
supervisors' calls page also lists each gateway's own count of slowed streams (its heartbeat).
Saves console-call-surge.png and console-calls-surge.png (browser_helpers.screenshot_dir)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from asr_gateway.config import load_config
from console.feeds import CallSummary, fold_event
from console.route_sizes import RouteChunkSizes
from kb_hooks import events as ev
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, RedactionMode, ReducedReason, TranscriptUpdate
from tests.browser_helpers import (
    LAPTOP_WIDTH,
    TABLET_WIDTH,
    WINDOW_HEIGHT,
    assert_fits_width,
    chromium,
    needs_chromium,
    screenshot_dir,
)
from tests.browser_helpers import sign_in as sign_in_as
from tests.console_helpers import EXAMPLES, MANHOLE, PASSWORDS, LivePublisher, login, running_console, write_configs
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]

ROUTE = "pbx-default"  # deploy/config/routes.example.yaml: profile default, chunk_ms 320
CALLER = Participant("caller", "sip:citizen@pbx")
AGENT = Participant("agent", "sip:1001@pbx")


def transcript(call_id: str, role: str, kind: str, chunk_ms: int | None, **extra: Any) -> dict[str, Any]:
    return {"event_type": kind, "call_id": call_id, "participant": {"role": role, "aor": None, "label": None},
            "text": "喂", "chunk_ms": chunk_ms, **extra}  # fmt: skip


def test_a_party_is_slowed_while_its_chunk_is_above_the_smallest_it_reported() -> None:
    call = CallSummary("c1", "asr")
    fold_event(call, transcript("c1", "caller", ev.EventType.TRANSCRIPT_PARTIAL, 320), "X-Agent-Id")
    fold_event(call, transcript("c1", "agent", ev.EventType.TRANSCRIPT_PARTIAL, 320), "X-Agent-Id")
    assert not call.slowed and call.to_json()["pace"] == [
        {"role": "caller", "label": None, "chunk_ms": 320, "own_chunk_ms": 320},
        {"role": "agent", "label": None, "chunk_ms": 320, "own_chunk_ms": 320},
    ]
    fold_event(call, transcript("c1", "caller", ev.EventType.TRANSCRIPT_PARTIAL, 640), "X-Agent-Id")
    assert call.slowed and call.to_json()["slowed"] is True
    assert [p.slowed for p in call.pace.values()] == [True, False]
    fold_event(call, transcript("c1", "caller", ev.EventType.TRANSCRIPT_FINAL, 640, reduced_search=True), "X-Agent-Id")
    fold_event(call, transcript("c1", "caller", ev.EventType.TRANSCRIPT_FINAL, 320, seq=9), "X-Agent-Id")
    assert not call.slowed and call.reduced_finals == 1
    # a partial made before that final but come later (pub/sub and the stream are separate paths)
    fold_event(call, transcript("c1", "caller", ev.EventType.TRANSCRIPT_PARTIAL, 640, seq=8), "X-Agent-Id")
    assert not call.slowed and call.pace[("caller", None)].chunk_ms == 320
    # a result without chunk_ms (an older gateway) says nothing about the pace
    fold_event(call, transcript("c1", "agent", ev.EventType.TRANSCRIPT_FINAL, None), "X-Agent-Id")
    assert call.pace[("agent", None)].chunk_ms == 320 and call.to_json()["reduced_finals"] == 1


def test_the_routes_own_size_counts_where_the_console_knows_it(tmp_path: Path) -> None:
    """A call that started while the node was behind reports 640 ms first: slowed all the same."""
    routes = tmp_path / "routes.yaml"
    routes.write_text((EXAMPLES / "routes.example.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    sizes = RouteChunkSizes(routes)
    assert (sizes("pbx-default"), sizes("siprec-sales-queue"), sizes(None), sizes("gone")) == (320, 160, 320, None)
    call = CallSummary("c2", "asr", route="siprec-sales-queue")
    fold_event(call, transcript("c2", "caller", ev.EventType.TRANSCRIPT_PARTIAL, 320), "X-Agent-Id", sizes)
    assert call.slowed and call.to_json()["pace"][0]["own_chunk_ms"] == 160
    assert RouteChunkSizes(tmp_path / "missing.yaml")("pbx-default") is None


class SurgeCall:
    """One call of route ``ROUTE`` as the gateway publishes it, its transcripts made by the real
    processor with the chunk size the engine ran them at."""

    def __init__(self, conf: Path, call_id: str) -> None:
        self.processor = TranscriptProcessor.from_settings(load_config(conf / "gateway.yaml").kb_hooks)
        self.ctx = CallContext(call_id, route=ROUTE, redaction=RedactionMode.MASK, kb_set="hotline",
                               tag_rules=("hotline",))  # fmt: skip

    def started(self) -> ev.Event:
        return ev.CallStarted(call=self.ctx, participants=(CALLER, AGENT), metadata={"X-Agent-Id": "1001"})

    def result(self, who: Participant, utterance: int, text: str, chunk_ms: int, *, final: bool = False,
               reduced: bool | None = None, reason: ReducedReason | None = None) -> list[ev.Event]:  # fmt: skip
        update = TranscriptUpdate(self.ctx, who, utterance, not final, text, chunk_ms=chunk_ms,
                                  reduced_search=reduced if final else None,
                                  reduced_reason=reason if final and reduced else None)  # fmt: skip
        return self.processor.process(update)


def test_calls_api_counts_slowed_calls_and_quick_finals(tmp_path: Path, redis_server: RedisServer) -> None:
    conf_yaml = write_configs(tmp_path, redis_server.url)
    calm, busy = SurgeCall(conf_yaml.parent, "calm"), SurgeCall(conf_yaml.parent, "busy")
    quick_final = busy.result(CALLER, 0, MANHOLE, 640, final=True, reduced=True)
    events = [calm.started(), *calm.result(CALLER, 0, "你好", 320), busy.started(), *busy.result(CALLER, 0, "喂", 320)]
    events += quick_final
    with running_console(conf_yaml) as base, LivePublisher(redis_server.url, tmp_path / "pub") as publisher:
        for event in events:
            publisher.submit(event)
        publisher.wait_published(len(events))
        sup = login(base, "sup")
        deadline = time.monotonic() + 10
        calls: dict[str, Any] = {}
        while time.monotonic() < deadline and not calls.get("busy", {}).get("reduced_finals"):
            calls = {c["call_id"]: c for c in sup.get("/api/calls").json()["calls"]}
            time.sleep(0.05)
        assert calls["busy"]["slowed"] is True and calls["busy"]["reduced_finals"] == 1
        assert calls["busy"]["pace"] == [{"role": "caller", "label": None, "chunk_ms": 640, "own_chunk_ms": 320}]
        assert calls["calm"]["slowed"] is False and calls["calm"]["reduced_finals"] == 0
        # the call page knows the route's own size from the routes file; the load line is the supervisors'
        assert 'data-route-chunk-ms="320"' in sup.get("/calls/busy").text
        assert 'id="calls-load"' in sup.get("/").text
        assert 'id="calls-load"' not in login(base, "agent1").get("/").text


@needs_chromium
def test_call_page_says_when_a_party_is_slowed_down(tmp_path: Path, redis_server: RedisServer) -> None:
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    conf_yaml = write_configs(tmp_path, redis_server.url)
    call = SurgeCall(conf_yaml.parent, "surge-call")
    with (
        running_console(conf_yaml) as base,
        LivePublisher(redis_server.url, tmp_path / "pub") as publisher,
        chromium(tmp_path / "chromium") as driver,
    ):
        # finals: partials go by pub/sub only, and this page is not open yet
        opening = [call.started(), *call.result(CALLER, 0, "你好", 320, final=True),
                   *call.result(AGENT, 0, "您好", 320, final=True)]  # fmt: skip
        for event in opening:
            publisher.submit(event)
        publisher.wait_published(len(opening))
        sign_in_as(driver, base, "agent1", PASSWORDS["agent1"], "/calls/surge-call")

        def pace(role: str) -> str:
            found = driver.find_elements(By.CSS_SELECTOR, f"#lane-{role} .pace")
            return found[0].text if found else ""

        WebDriverWait(driver, 10).until(lambda d: "320 ms" in pace("caller") and "320 ms" in pace("agent"))
        assert "slowed" not in pace("caller").lower()

        # the node falls behind: the caller's stream moves to 640 ms chunks, its final is searched the quick way
        quick_final = call.result(CALLER, 1, MANHOLE, 640, final=True, reduced=True, reason="engine_saturated")
        surge = [*call.result(CALLER, 1, "我今天发现", 640), *quick_final]
        for event in surge:
            publisher.submit(event)
        WebDriverWait(driver, 10).until(lambda d: "Slowed down to save capacity" in pace("caller"))
        assert "every 640 ms (normally every 320 ms)" in pace("caller"), pace("caller")
        assert "slowed" not in pace("agent").lower()
        final = WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#lane-caller .utt.final"))
        quick = final[-1].find_elements(By.CSS_SELECTOR, ".badge.reduced")
        assert quick and "the service was busy" in quick[0].text and "less accurate" in quick[0].get_attribute("title")
        # and why, for whoever sizes the nodes (docs/events.md reduced_reason)
        assert "already at its slowest pace" in quick[0].get_attribute("title"), quick[0].get_attribute("title")
        for width in (TABLET_WIDTH, LAPTOP_WIDTH):
            driver.set_window_size(width, WINDOW_HEIGHT)
            assert_fits_width(driver, f"slowed call page at {width} px")
        driver.save_screenshot(str(screenshot_dir() / "console-call-surge.png"))

        # the load falls: back to its own size, and the words go
        for event in call.result(CALLER, 2, "好的", 320):
            publisher.submit(event)
        WebDriverWait(driver, 10).until(lambda d: pace("caller") == "Live text updates every 320 ms")

        # a supervisor's calls page counts the live calls slowed down, and each gateway's own
        # count from its heartbeat (asr_gateway/heartbeat.py)
        for event in call.result(AGENT, 1, "请稍等", 640):
            publisher.submit(event)
        beat = {"node": "gw-1:5060", "config_version": "abc", "last_reload": {"at": 0, "ok": True, "errors": []},
                "active_calls": 1, "engine_streams": 2, "degraded_streams": 1, "ts": time.time()}  # fmt: skip
        redis.Redis.from_url(redis_server.url).hset("asr:nodes", "gw-1:5060", json.dumps(beat))
        driver.delete_all_cookies()
        sign_in_as(driver, base, "sup", PASSWORDS["sup"])
        load = WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "calls-load"))[0]
        WebDriverWait(driver, 10).until(lambda d: "1 of 1 live call slowed down to save capacity" in load.text)
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#calls-nodes li"))
        node = driver.find_element(By.CSS_SELECTOR, "#calls-nodes li").text
        assert node == "gw-1:5060: 1 call · 1 of 2 streams slowed down to save capacity", node
        row = driver.find_element(By.CSS_SELECTOR, '#calls tr[data-call-id="surge-call"]')
        assert "live · slowed down to save capacity" in row.text
        driver.save_screenshot(str(screenshot_dir() / "console-calls-surge.png"))
