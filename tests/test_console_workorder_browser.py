"""The work order and the analytics on the call page, in headless Chromium: the draft fills the
form (the address normalized), Confirm waits for the call's end, the agent edits a field and
confirms, and ``workorder.confirmed`` (with that change) reaches the call's stream once; the
analytics show talk, overlaps and each check in words; the supervisors' page sums up every
call's analytics (agents may not open it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_hooks import events as ev
from kb_hooks.types import CallContext
from tests.browser_helpers import assert_fits_width, chromium, needs_chromium, sign_in
from tests.console_helpers import PASSWORDS, LivePublisher, login, running_console, write_configs
from tests.redis_server import RedisServer, redis_server
from tests.test_console_workorder import drafted_call, stored_events

__all__ = ["redis_server"]
pytestmark = [needs_chromium]
pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def test_the_agent_edits_and_confirms_the_draft_on_the_call_page(tmp_path: Path, redis_server: RedisServer) -> None:
    console_yaml = write_configs(tmp_path, redis_server.url)
    events, ended = drafted_call("wo-page", console_yaml.parent)
    ctx = ended.call_id
    analytics = ev.CallAnalytics(
        call=CallContext(ctx, ended.sip_call_id, ended.route), duration_ms=9_000,
        talk_ms={"agent": 2_000, "caller": 5_000}, non_talk_ms=2_500,
        overlap=ev.Overlap(1, 500, (ev.Interruption("agent", "caller", 1, 500),)),
        speaking_rate={"caller": 240.0},
        checks=(ev.RuleCheck("greeting", "greeting", False, None, None, None, None),
                ev.RuleCheck("address_read_back", "address_read_back", None, None, None, None, None)),
        categories=(),
    )  # fmt: skip
    with (
        running_console(console_yaml) as base,
        LivePublisher(redis_server.url, tmp_path / "pub") as publisher,
        chromium(tmp_path / "chromium") as driver,
    ):
        for event in events:
            publisher.submit(event)
        publisher.wait_published(len(events))
        sign_in(driver, base, "agent1", PASSWORDS["agent1"], f"/calls/{ctx}")
        address = WebDriverWait(driver, 10).until(
            lambda d: d.find_element(By.NAME, "address").get_attribute("value") or None
        )
        assert address == "新华路12号"
        assert driver.find_element(By.NAME, "category").get_attribute("value") == "市政设施/井盖"
        confirm = driver.find_element(By.ID, "workorder-confirm")
        assert not confirm.is_enabled()  # the call goes on
        time_input = driver.find_element(By.NAME, "time")
        time_input.clear()
        time_input.send_keys("明天上午")

        publisher.submit(analytics)
        publisher.submit(ended)
        publisher.wait_published(len(events) + 2)
        WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "workorder-confirm").is_enabled())
        assert driver.find_element(By.NAME, "time").get_attribute("value") == "明天上午"  # kept while events came
        text = driver.find_element(By.ID, "analytics-text").text
        assert "talk agent 2.0 s · caller 5.0 s" in text and "agent interrupted caller 1×" in text, text
        checks = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#analytics-checks li")]
        assert checks == ["greeting: failed", "address read back: did not apply"]
        assert_fits_width(driver, "call page with its work order")

        driver.find_element(By.ID, "workorder-confirm").click()
        state = WebDriverWait(driver, 10).until(
            lambda d: (
                "confirmed by" in d.find_element(By.ID, "workorder-state").text
                and d.find_element(By.ID, "workorder-state").text
            )
        )
        assert "confirmed by agent1" in state and "changed: time" in state, state

    stored = stored_events(redis_server.url, f"asr:call:{ctx}")
    confirmations = [e for e in stored if e["event_type"] == "workorder.confirmed"]
    assert len(confirmations) == 1
    assert confirmations[0]["changes"] == [{"field": "time", "draft": "今天", "confirmed": "明天上午"}]


def analysed_call(call_id: str, greeted: bool, categories: tuple[ev.CategoryHit, ...]) -> list[ev.Event]:
    ctx = CallContext(call_id, route="pbx-default")
    return [
        ev.CallStarted(call=ctx, participants=(), metadata={"X-Agent-Id": "1001"}),
        ev.CallAnalytics(
            call=ctx, duration_ms=10_000, talk_ms={"agent": 3_000, "caller": 5_000}, non_talk_ms=2_000,
            overlap=ev.Overlap(1, 400, ()), speaking_rate={},
            checks=(ev.RuleCheck("greeting", "greeting", greeted, None, None, None, None),), categories=categories,
        ),
        ev.CallEnded(call=ctx, reason="bye", stats={}),
    ]  # fmt: skip


def test_supervisors_see_the_analytics_of_every_call_summed_up(tmp_path: Path, redis_server: RedisServer) -> None:
    console_yaml = write_configs(tmp_path, redis_server.url)
    supervisor_asks = ev.CategoryHit("asks_supervisor", "要求找领导", "caller", 2, 6_000, "找你们领导")
    events = analysed_call("an-1", True, ()) + analysed_call("an-2", False, (supervisor_asks,))
    with (
        running_console(console_yaml) as base,
        LivePublisher(redis_server.url, tmp_path / "pub") as publisher,
        chromium(tmp_path / "chromium") as driver,
    ):
        for event in events:
            publisher.submit(event)
        publisher.wait_published(len(events))
        assert login(base, "agent1").get("/analytics").status_code == 403
        calls = login(base, "sup").get("/api/calls").json()["calls"]
        assert {c["call_id"]: c["analytics"]["failed"] for c in calls} == {"an-1": [], "an-2": ["greeting"]}
        sign_in(driver, base, "sup", PASSWORDS["sup"], "/analytics")
        WebDriverWait(driver, 10).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#analytics-calls tr[data-call-id]")) == 2
        )
        overview = driver.find_element(By.ID, "analytics-overview").text
        assert overview == "2 calls · 20.0 s of audio · silence 20 % · 2 overlaps", overview
        rates = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#analytics-rates li")]
        assert rates == ["greeting: passed 1 of 2 (50 %)", "要求找领导: 1 calls"], rates
        assert_fits_width(driver, "analytics page")
