"""The console in real headless Chromium (selenium + chromedriver) against the real service.

A sipp call plays the bundled recording through the gateway (SIP, RTP, the demo model, the KB
processor, the Redis publisher); an agent watches it live in the call view: the caller's final
text and the 井盖破损应急处置流程 card must show within 3 s of the final being made. An admin then
edits that KB entry in the browser and applies it; the gateway reloads (the console's reload
request), reports the new version hash, and the next call's suggestion carries the new title.
A rollback in the browser restores the entry. Requests without login and writes without the
CSRF token are refused. The run saves console-call.png and console-admin.png (browser_helpers.screenshot_dir).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from asr_core.audio_io import read_wav
from asr_gateway.config import load_config
from asr_gateway.dev.sipp_calls import PCMU, place_call
from asr_gateway.service import Service
from tests.browser_helpers import chromium, needs_chromium, screenshot_dir
from tests.browser_helpers import sign_in as sign_in_as
from tests.console_helpers import PASSWORDS, running_console, write_configs
from tests.redis_server import RedisServer, free_port, redis_server
from tests.tool_marks import needs_sipp

__all__ = ["redis_server"]

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "hotline_8k"
IMG = screenshot_dir()
CARD_TITLE = "井盖破损应急处置流程"
NEW_TITLE = "井盖破损应急处置流程（2024修订）"

pytestmark = [
    needs_sipp,
    needs_chromium,
]
pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


class ServiceThread:
    """The gateway on its own event loop thread, so the test can drive the browser meanwhile."""

    def __init__(self, config_path: Path) -> None:
        self.config = load_config(config_path, {})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="service", daemon=True)
        self.service: Service | None = None
        self.sip_port = 0

    def __enter__(self) -> ServiceThread:
        self.thread.start()

        async def start() -> None:
            self.service = Service(self.config)
            ports = await self.service.start()
            assert ports.sip_udp is not None
            self.sip_port = ports.sip_udp

        self.run(start(), 120)
        return self

    def run(self, coro: Any, timeout_s: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, workdir: Path, agent: str, media_delay_ms: int = 0) -> Any:
        seed = read_wav(DATA / "hotline_seed.wav")
        return asyncio.run_coroutine_threadsafe(
            place_call(workdir, self.sip_port, seed.samples, 16000, payload_type=PCMU, call_tag=workdir.name,
                       media_delay_ms=media_delay_ms, extra_headers=f"X-Agent-Id: {agent}"),
            self.loop,
        )  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        if self.service is not None:
            self.run(self.service.stop(grace_s=5), 30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def gateway_sections(tmp: Path) -> str:
    return f"""sip: {{host: 127.0.0.1, port: {free_port()}, transports: [udp], rtp_inactivity_timeout_s: 20}}
rtp: {{host: 127.0.0.1, port_min: 42000, port_max: 42999}}
engine: {{max_streams: 4, max_batch: 4, left_chunks: 8}}
metrics: {{host: 127.0.0.1, port: 0}}
"""


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path / "chromium") as driver:
        yield driver


def events_of(url: str, sip_tag: str) -> list[dict[str, Any]]:
    with redis.Redis.from_url(url) as client:
        events = [json.loads(fields[b"event"]) for _, fields in client.xrange("asr:events")]
    return [e for e in events if str(e.get("sip_call_id") or "").startswith(sip_tag)]


def sign_in(driver: Any, base: str, user: str, path: str = "/") -> None:
    sign_in_as(driver, base, user, PASSWORDS[user], path)


def ts_ms(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000


def attr_ms(driver: Any, selector: str, name: str) -> float:
    return float(driver.find_element(By.CSS_SELECTOR, selector).get_attribute(name))


def test_console_in_chromium(tmp_path: Path, redis_server: RedisServer, browser: Any) -> None:
    console_yaml = write_configs(tmp_path, redis_server.url, gateway_sections(tmp_path))
    conf = console_yaml.parent  # the example routes' default profile publishes X-Agent-Id
    original_kb = (conf / "kb.yaml").read_text(encoding="utf-8")
    driver = browser
    with ServiceThread(conf / "gateway.yaml") as gateway, running_console(console_yaml) as base:
        assert gateway.service is not None
        first_version = gateway.service.reloader.config_version

        # -- an agent watches their call live --------------------------------------------------
        sign_in(driver, base, "agent1")
        call = gateway.call(tmp_path / "call1", "1001", media_delay_ms=2500)
        row = WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#calls tr[data-call-id] a"))
        row[0].click()
        final = WebDriverWait(driver, 40).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#lane-caller .utt.final"))
        card_sel = '.card.confirmed[data-entry-id="kb-municipal-manhole"]'
        card = WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, card_sel))
        assert call.result(60).returncode == 0
        WebDriverWait(driver, 15).until(lambda d: not d.find_element(By.ID, "summary").get_attribute("hidden"))
        events = events_of(redis_server.url, "call1")
        finals = [e for e in events if e["event_type"] == "transcript.final"]
        assert finals and final[0].text == finals[0]["text"] and "井盖" in finals[0]["text"]
        assert CARD_TITLE in card[0].find_element(By.CSS_SELECTOR, ".title").text
        assert driver.find_elements(By.CSS_SELECTOR, "#lane-caller .utt.final mark"), "matched words highlighted"
        made = ts_ms(finals[0]["ts"])
        final_lag = attr_ms(driver, "#lane-caller .utt.final", "data-final-at") - made
        card_lag = attr_ms(driver, card_sel, "data-confirmed-at") - made
        assert final_lag <= 3000 and card_lag <= 3000, (final_lag, card_lag)
        driver.save_screenshot(str(IMG / "console-call.png"))

        # -- refused: no login, and a write without the CSRF token ----------------------------
        with httpx.Client(base_url=base, timeout=10) as anonymous:
            assert anonymous.get("/api/calls").status_code == 401
        driver.find_element(By.CSS_SELECTOR, "nav form button").click()
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "login-form"))
        sign_in(driver, base, "admin", "/admin")
        cookies = {c["name"]: c["value"] for c in driver.get_cookies()}
        with httpx.Client(base_url=base, timeout=10, cookies=cookies) as stolen:
            refused = stolen.post("/api/admin/apply", json={"key": "kb:hotline", "content": original_kb})
            assert refused.status_code == 403
            assert stolen.get("/api/admin/versions").json()["versions"] == []

        # -- the admin edits the KB entry, tries it, applies it -------------------------------
        editor = WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "editor"))
        WebDriverWait(driver, 10).until(lambda d: CARD_TITLE in editor.get_attribute("value"))
        driver.execute_script(
            "const e = document.getElementById('editor');"
            "const at = e.value.indexOf(arguments[0]) + arguments[0].length;"
            "e.focus(); e.setSelectionRange(at, at);", f"title: {CARD_TITLE}")  # fmt: skip
        editor.send_keys("（2024修订）")
        assert f"title: {NEW_TITLE}\n" in editor.get_attribute("value")
        driver.find_element(By.ID, "comment").send_keys("manhole entry: revised title")
        driver.find_element(By.ID, "validate").click()
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "apply-result").text == "valid")
        driver.find_element(By.ID, "try-text").send_keys("新华路十二号警盖坏了，我电话13812345678")
        driver.find_element(By.ID, "try").click()
        tried = WebDriverWait(driver, 10).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, '.try-suggestions tr[data-entry-id="kb-municipal-manhole"]')
        )
        assert NEW_TITLE in tried[0].text and "yes" in tried[0].text  # the draft, a homophone match
        driver.find_element(By.ID, "apply").click()
        WebDriverWait(driver, 10).until(
            lambda d: d.find_element(By.ID, "apply-result").get_attribute("data-applied-version") == "2"
        )
        # The nodes table is refreshed every second, in place: the gateway's row found now is the
        # row that shows the reload taking effect (a redrawn row would be stale).
        node_row = driver.find_element(By.CSS_SELECTOR, "#nodes tr[data-node]")
        WebDriverWait(driver, 10).until(lambda d: "running the applied version" in node_row.text)
        new_version = node_row.find_element(By.CSS_SELECTOR, ".node-version").text
        assert new_version == gateway.service.reloader.config_version != first_version
        # the heartbeat's surge count: "none", or "N of M streams" slowed down to longer chunks
        slowed = node_row.find_element(By.CSS_SELECTOR, ".node-slowed").text
        assert re.fullmatch(r"none|\d+ of \d+ streams?", slowed), slowed
        driver.save_screenshot(str(IMG / "console-admin.png"))

        # -- the next call's suggestion carries the new title ---------------------------------
        assert gateway.call(tmp_path / "call2", "1001").result(60).returncode == 0
        deadline = time.monotonic() + 10
        titles: set[str] = set()
        while NEW_TITLE not in titles and time.monotonic() < deadline:
            titles = {e["title"] for e in events_of(redis_server.url, "call2") if e["event_type"] == "kb.suggestion"}
            time.sleep(0.1)
        assert NEW_TITLE in titles, titles

        # -- rollback in the browser restores it -----------------------------------------------
        driver.find_element(By.CSS_SELECTOR, '#versions tr[data-version="1"] button.rollback').click()
        WebDriverWait(driver, 10).until(
            lambda d: d.find_element(By.ID, "apply-result").get_attribute("data-applied-version") == "3"
        )
        version_cell = node_row.find_element(By.CSS_SELECTOR, ".node-version")
        WebDriverWait(driver, 10).until(lambda d: version_cell.text == first_version)
        assert (conf / "kb.yaml").read_text(encoding="utf-8") == original_kb
        kb = gateway.service.processor.kb["hotline"].get()
        assert kb.match("新华路十二号井盖发生了破损")[0].entry.title == CARD_TITLE
