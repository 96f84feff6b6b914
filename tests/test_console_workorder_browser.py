"""The work order and the analytics on the call page, in headless Chromium: the draft fills the
form (the address normalized), Confirm waits for the call's end, the agent edits a field and
confirms, and ``workorder.confirmed`` (with that change) reaches the call's stream once; where
the route has a webhook, a real local ticket system gets it once, signed, and the page says so;
one that is down gets it once it is back, the page saying it waits meanwhile; the analytics
show talk, overlaps and each check in words; the supervisors' page sums up every call's
analytics (agents may not open it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kb_hooks import events as ev
from kb_hooks.types import CallContext
from tests.browser_helpers import assert_fits_width, chromium, needs_chromium, sign_in
from tests.console_helpers import PASSWORDS, LivePublisher, login, running_console, write_configs
from tests.redis_server import RedisServer, redis_server
from tests.test_console_workorder import drafted_call, stored_events
from tests.webhook_receiver import Receiver, free_port, route_webhook

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
        assert driver.find_element(By.ID, "workorder-delivery").text == ""  # the route sends no webhook

    stored = stored_events(redis_server.url, f"asr:call:{ctx}")
    confirmations = [e for e in stored if e["event_type"] == "workorder.confirmed"]
    assert len(confirmations) == 1
    assert confirmations[0]["changes"] == [{"field": "time", "draft": "今天", "confirmed": "明天上午"}]


SECRET_ENV = "TICKETS_HMAC_KEY"
SECRET = b"browser-test-key"
RETRY_FIRST_S, RETRY_MAX_S = 0.25, 0.5  # console.yaml's webhook backoff, shortened for the test
QUIET_S = 3 * RETRY_MAX_S  # how long no second delivery must come: several retry intervals


def ticket_console(tmp_path: Path, redis_url: str, url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example configs with the default route's work orders POSTed to ``url`` (signed), retried soon."""
    monkeypatch.setenv(SECRET_ENV, SECRET.decode())
    console_yaml = write_configs(tmp_path, redis_url)
    route_webhook(console_yaml, url, SECRET_ENV)
    with console_yaml.open("a", encoding="utf-8") as out:
        out.write(f"webhook_retry_first_s: {RETRY_FIRST_S}\nwebhook_retry_max_s: {RETRY_MAX_S}\n")
    return console_yaml


def confirm_with_an_edit(driver: Any, base: str, publisher: LivePublisher, call_id: str, conf: Path) -> None:
    """An ended call with a draft; the agent changes the time on its page and confirms."""
    events, ended = drafted_call(call_id, conf)
    for event in [*events, ended]:
        publisher.submit(event)
    publisher.wait_published(len(events) + 1)
    sign_in(driver, base, "agent1", PASSWORDS["agent1"], f"/calls/{call_id}")
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "workorder-confirm").is_enabled())
    time_input = driver.find_element(By.NAME, "time")
    time_input.clear()
    time_input.send_keys("明天上午")
    driver.find_element(By.ID, "workorder-confirm").click()
    WebDriverWait(driver, 10).until(lambda d: "confirmed by agent1" in d.find_element(By.ID, "workorder-state").text)


def delivery_says(driver: Any, words: str, timeout_s: float = 20.0) -> str:
    """The call page's delivery line once it contains ``words``."""
    line: str = WebDriverWait(driver, timeout_s).until(
        lambda d: (
            words in d.find_element(By.ID, "workorder-delivery").text
            and d.find_element(By.ID, "workorder-delivery").text
        )
    )
    return line


def stays(condition: Callable[[], bool], for_s: float) -> bool:
    """Whether ``condition`` holds throughout the next ``for_s`` seconds (looked at every 50 ms)."""
    until = time.monotonic() + for_s
    while time.monotonic() < until:
        if not condition():
            return False
        time.sleep(0.05)
    return condition()


def assert_the_edited_work_order_came_once(receiver: Receiver, call_id: str) -> None:
    assert stays(lambda: len(receiver.received) == 1, QUIET_S), [r.json()["event_id"] for r in receiver.received]
    (got,) = receiver.received
    sent = got.json()
    assert got.signed_right is True and got.idempotency_key == sent["workorder_id"] == call_id
    assert sent["event_type"] == ev.EventType.WORKORDER_CONFIRMED and sent["confirmed_by"] == "agent1"
    assert sent["fields"]["time"]["value"] == "明天上午"
    assert sent["changes"] == [{"field": "time", "draft": "今天", "confirmed": "明天上午"}]


def test_the_ticket_system_gets_the_confirmed_work_order_once_and_the_page_says_so(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver(free_port("127.0.0.3"), host="127.0.0.3", secret=SECRET)
    receiver.start()
    console_yaml = ticket_console(tmp_path, redis_server.url, receiver.url, monkeypatch)
    try:
        with (
            running_console(console_yaml) as base,
            LivePublisher(redis_server.url, tmp_path / "pub") as publisher,
            chromium(tmp_path / "chromium") as driver,
        ):
            confirm_with_an_edit(driver, base, publisher, "wo-sent", console_yaml.parent)
            assert delivery_says(driver, "sent") == "sent to the ticket system"
            assert_the_edited_work_order_came_once(receiver, "wo-sent")
    finally:
        receiver.stop()


def test_a_ticket_system_that_is_down_gets_the_work_order_once_it_is_back(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = "127.0.0.4"
    receiver = Receiver(free_port(host), host=host, secret=SECRET)  # not started: nobody listens there
    console_yaml = ticket_console(tmp_path, redis_server.url, receiver.url, monkeypatch)
    try:
        with (
            running_console(console_yaml) as base,
            LivePublisher(redis_server.url, tmp_path / "pub") as publisher,
            chromium(tmp_path / "chromium") as driver,
        ):
            confirm_with_an_edit(driver, base, publisher, "wo-down", console_yaml.parent)
            waiting = delivery_says(driver, "waiting to send, will retry")
            assert "the ticket system did not answer" in waiting, waiting
            assert_fits_width(driver, "call page with a work order waiting to be sent")
            receiver.start()
            assert delivery_says(driver, "sent") == "sent to the ticket system"
            assert_the_edited_work_order_came_once(receiver, "wo-down")
    finally:
        receiver.stop()


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
