"""``asr-gateway demo --console`` as a newcomer runs it: one command prints the console's URL
and three users with fresh passwords; in Chromium the agent signs in and sees a demo call placed
for them, live, with the caller's text; Ctrl-C stops the service, the calls and the console.
Saves console-demo.png (browser_helpers.screenshot_dir)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from asr_gateway.dev.console_demo import AGENT_ID
from tests.browser_helpers import chromium, needs_chromium, screenshot_dir, sign_in
from tests.console_helpers import demo_console
from tests.tool_marks import needs_redis_server, needs_sipp

REPO = Path(__file__).resolve().parents[1]
IMG = screenshot_dir()

pytestmark = [
    needs_sipp,
    needs_redis_server,
    needs_chromium,
]
pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def test_demo_with_the_console(tmp_path: Path) -> None:
    with demo_console() as demo:
        assert f"console: {demo.base}/" in demo.text, demo.text
        passwords = demo.passwords
        assert set(passwords) == {"agent", "supervisor", "admin"}, demo.text
        assert len(set(passwords.values())) == 3

        with chromium(tmp_path / "chromium") as driver:
            sign_in(driver, demo.base, "agent", passwords["agent"])
            links = WebDriverWait(driver, 60).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, "#calls tr[data-call-id] a")
            )
            row = driver.find_element(By.CSS_SELECTOR, "#calls tr[data-call-id]")
            assert AGENT_ID in row.text
            # the list fills in live: a call's last words and its KB suggestion
            WebDriverWait(driver, 60).until(lambda d: "井盖破损应急处置流程" in d.find_element(By.ID, "calls").text)
            driver.save_screenshot(str(IMG / "console-demo.png"))
            # The list changed many times since the link was found; its rows are updated in place,
            # so the link an agent is pointing at stays there to be clicked (a redrawn row would
            # be gone: selenium's StaleElementReferenceException, a lost click for a person).
            links[0].click()
            WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#lane-caller .utt.final"))
            assert f"agent {AGENT_ID}" in driver.find_element(By.ID, "call-info").text
    assert demo.exit_code == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{demo.base}/health", timeout=2)  # the console went with it
