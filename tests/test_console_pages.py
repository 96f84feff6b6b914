"""The console's pages in headless Chromium, with calls published into a real redis-server as
the gateway publishes them: an agent cannot open another agent's call page nor an unknown one
(a 404 page); with an ``agent_id_key`` other than X-Agent-Id the call header still names the
agent; the call page says its event fields in words (the end reason, durations in seconds, the
match kind), never raw JSON; every page fits a 1366 px laptop and a 768 px tablet (no
sideways scroll, nothing past the right edge); and a click held on the live calls list while
the list changes still opens the call. Saves console-*-768.png (browser_helpers.screenshot_dir)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from kb_hooks.events import CallEnded, CallStarted, TranscriptPartial
from tests.browser_helpers import (
    LAPTOP_WIDTH,
    TABLET_WIDTH,
    WINDOW_HEIGHT,
    assert_fits_width,
    chromium,
    needs_chromium,
    screenshot_dir,
    sign_in,
)
from tests.console_helpers import PASSWORDS, LivePublisher, call_events, login, running_console, write_configs
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]
pytestmark = [needs_chromium]
pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

IMG = screenshot_dir()
AGENT_KEY = "X-Operator"
# what the gateway's bridge puts in call.ended (audio per leg) and a leg's RFC 4733 key presses
STATS = {"audio_ms": {"call-a-0": 8800, "call-a-1": 8640}, "dtmf_events": {"call-a-0": 3}}


def at_both_widths(driver: Any, what: str, screenshot: str | None = None) -> None:
    for width in (LAPTOP_WIDTH, TABLET_WIDTH):
        driver.set_window_size(width, WINDOW_HEIGHT)
        assert_fits_width(driver, f"{what} at {width} px")
    if screenshot is not None:
        driver.save_screenshot(str(IMG / screenshot))
    driver.set_window_size(LAPTOP_WIDTH, WINDOW_HEIGHT)


def test_call_pages_words_and_widths(tmp_path: Path, redis_server: RedisServer) -> None:
    console_yaml = write_configs(tmp_path, redis_server.url)
    with console_yaml.open("a", encoding="utf-8") as out:
        out.write(f"agent_id_key: {AGENT_KEY}\n")
    conf = console_yaml.parent
    mine = call_events("call-a", "1001", conf, agent_key=AGENT_KEY, reason="rtp-timeout", stats=STATS)
    theirs = call_events("call-b", "1002", conf, "路灯坏了", agent_key=AGENT_KEY)
    with (
        running_console(console_yaml) as base,
        LivePublisher(redis_server.url, tmp_path / "pub") as publisher,
        chromium(tmp_path / "chromium") as driver,
    ):
        for event in mine + theirs:
            publisher.submit(event)
        publisher.wait_published(len(mine) + len(theirs))
        driver.get(base + "/login")
        at_both_widths(driver, "sign-in page")

        # -- the agent's calls: only theirs, the end reason in words --------------------------------
        sign_in(driver, base, "agent1", PASSWORDS["agent1"])
        rows = WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#calls tr[data-call-id]"))
        assert [row.get_attribute("data-call-id") for row in rows] == ["call-a"]
        assert "1001" in rows[0].text and "ended: no audio arrived for too long" in rows[0].text
        at_both_widths(driver, "calls page")

        # -- their call page: the agent under agent_id_key, every field in words -------------------
        rows[0].find_element(By.CSS_SELECTOR, "a").click()
        WebDriverWait(driver, 10).until(lambda d: not d.find_element(By.ID, "summary").get_attribute("hidden"))
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".card.confirmed .meta"))
        assert "agent 1001" in driver.find_element(By.ID, "call-info").text
        summary = driver.find_element(By.ID, "summary-text").text
        assert "no audio arrived for too long" in summary, summary
        assert "audio: 8.8 s + 8.6 s (2 legs)" in summary and "key presses: 3" in summary, summary
        assert not re.search(r"[{}\"_]|\d{4}", summary.split(" · ", 1)[1]), summary  # no JSON, no raw ms
        meta = driver.find_element(By.CSS_SELECTOR, ".card.confirmed .meta").text
        assert re.match(r"match \d+ % · (keyword|all keywords|pattern)( · sounds alike)? · heard “.+”$", meta), meta
        at_both_widths(driver, "call page", "console-call-768.png")

        # -- another agent's call, and no call at all: a 404 page -----------------------------------
        for call_id in ("call-b", "no-such-call"):
            driver.get(f"{base}/calls/{call_id}")
            missing = WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "missing"))
            assert f"No call {call_id}" in missing[0].text and not driver.find_elements(By.ID, "lane-caller")
        assert not driver.find_elements(By.CSS_SELECTOR, "#missing .utt")
        agent = login(base, "agent1")
        assert agent.get("/calls/call-b").status_code == 404 and agent.get("/calls/call-a").status_code == 200

        # -- the admin page ---------------------------------------------------------------------
        driver.get(base + "/")
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "nav form button"))
        driver.find_element(By.CSS_SELECTOR, "nav form button").click()
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "login-form"))
        sign_in(driver, base, "admin", PASSWORDS["admin"], "/admin")
        WebDriverWait(driver, 10).until(lambda d: "kb-" in d.find_element(By.ID, "editor").get_attribute("value"))
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#versions, #audit li"))
        at_both_widths(driver, "admin page", "console-admin-768.png")
        with httpx.Client(base_url=base, timeout=10) as anonymous:
            assert anonymous.get("/calls/call-a").status_code == 303  # pages still ask for a sign-in first


def test_a_click_held_while_the_list_changes(tmp_path: Path, redis_server: RedisServer) -> None:
    """The calls list changes several times a second while calls are live. A person's click is a
    button press and, a moment later, its release; if the row under the pointer were replaced in
    between, the browser would fire no click and the agent's click would be lost. Rows are kept
    and updated in place, so a click held across an update still opens the call."""
    console_yaml = write_configs(tmp_path, redis_server.url)
    started, partial, *rest = call_events("call-live", "1001", console_yaml.parent)
    assert isinstance(started, CallStarted) and isinstance(partial, TranscriptPartial)
    final_and_cards = [e for e in rest if not isinstance(e, CallEnded)]
    with (
        running_console(console_yaml) as base,
        LivePublisher(redis_server.url, tmp_path / "pub") as publisher,
        chromium(tmp_path / "chromium") as driver,
    ):
        publisher.submit(started)
        publisher.submit(partial)
        publisher.wait_published(2)
        sign_in(driver, base, "agent1", PASSWORDS["agent1"])
        link = WebDriverWait(driver, 10).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, '#calls tr[data-call-id="call-live"] a')
        )[0]
        row = driver.find_element(By.CSS_SELECTOR, '#calls tr[data-call-id="call-live"]')
        assert "live" in row.text and "井盖破损应急处置流程" not in row.text

        ActionChains(driver).click_and_hold(link).perform()
        for event in final_and_cards:
            publisher.submit(event)
        publisher.wait_published(2 + len(final_and_cards))
        # the same row element, now showing the final's KB suggestion
        WebDriverWait(driver, 10).until(lambda d: "井盖破损应急处置流程" in row.text)
        ActionChains(driver).release().perform()
        WebDriverWait(driver, 10).until(lambda d: d.current_url.endswith("/calls/call-live"))
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#lane-caller .utt.final"))
