"""``asr-gateway demo --console`` as a newcomer runs it: one command prints the console's URL
and three users with fresh passwords; in Chromium the agent signs in and sees a demo call placed
for them, live, with the caller's text; Ctrl-C stops the service, the calls and the console.
Saves console-demo.png (browser_helpers.screenshot_dir)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from asr_gateway.dev.console_demo import AGENT_ID
from asr_gateway.dev.local_redis import free_tcp_port
from tests.browser_helpers import chromium, needs_chromium, screenshot_dir, sign_in
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


def lines_of(stream: object) -> queue.Queue[str]:
    """The stream's lines, read on a thread, so the test can wait for one with a deadline."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_demo_with_the_console(tmp_path: Path) -> None:
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
            try:
                printed.append(output.get(timeout=1))
            except queue.Empty:
                continue
        text = "".join(printed)
        assert f"console: http://127.0.0.1:{port}/" in text, text
        passwords = dict(re.findall(r"^\s+\w+\s+user (\w+)\s+password (\S+)", text, flags=re.MULTILINE))
        assert set(passwords) == {"agent", "supervisor", "admin"}, text
        assert len(set(passwords.values())) == 3

        with chromium(tmp_path / "chromium") as driver:
            sign_in(driver, f"http://127.0.0.1:{port}", "agent", passwords["agent"])
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
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
    assert code == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)  # the console went with it
