"""The console's "Speak to it" page (issue 40 item 4).

In headless Chromium whose fake capture device plays the bundled recording (a 16 kHz 16-bit
PCM WAV, as ``--use-file-for-fake-audio-capture`` takes it; Chromium loops the file), against a
real gateway with its WebSocket door on and the bundled demo model: the page streams the
microphone in our ``hotline-asr.v1`` dialect (AudioWorklet, resampled to 16 kHz in JS) and
shows the recording's exact final text, which Redis holds for a call whose source is
``websocket``; the same file chosen as a WAV file (decoded and resampled in JS) gives it too.
Chromium's WebSocket stack is an independent client of the door. Without the door the page
says so and how to turn it on. The run saves console-speak.png (browser_helpers.screenshot_dir).
While the gateway serves the bundled demo model (its heartbeat's ``model``, else its config) the
page says it hears synthetic voices only and how to install a real model.
"""

from __future__ import annotations

import json
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from asr_core.model.bundled import DEMO_MODEL_NOTICE
from asr_gateway.heartbeat import nodes_key
from console.speak import demo_model_notice, speak_target
from tests.audio_clients import recording
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
from tests.console_helpers import PASSWORDS, login, running_console, write_configs
from tests.demo_quality import SEED_TEXT
from tests.redis_server import RedisServer, free_port, redis_server
from wsaudio.config import WebSocketSettings

__all__ = ["redis_server"]

IMG = screenshot_dir()
TRAILING_SILENCE_S = 2.0  # after each pass of the looped file, so the endpointer ends the utterance


def test_the_page_connects_where_the_console_says_or_to_the_door_on_the_browsers_host() -> None:
    door = WebSocketSettings(enabled=True, port=9093)
    derived = speak_target(None, door)
    assert (derived.url, derived.scheme, derived.port, derived.off) == (None, "ws", 9093, None)
    assert speak_target(None, door.model_copy(update={"tls": True})).scheme == "wss"
    given = speak_target("wss://asr.example/ws/v1/stream", WebSocketSettings())
    assert given.url == "wss://asr.example/ws/v1/stream" and given.off is None
    off = speak_target(None, WebSocketSettings())
    assert off.off is not None and "websocket: {enabled: true}" in off.off and "speak_url" in off.off
    assert "websocket.port" in (speak_target(None, WebSocketSettings(enabled=True, port=0)).off or "")


def test_without_the_door_the_page_says_how_to_turn_it_on(tmp_path: Path, redis_server: RedisServer) -> None:
    console_yaml = write_configs(tmp_path, redis_server.url)
    with running_console(console_yaml) as base:
        agent = login(base, "agent1")
        page = agent.get("/speak")
        assert page.status_code == 200
        assert "The gateway&#39;s WebSocket door is off" in page.text and 'id="speak-start" disabled' in page.text
        assert agent.get("/").text.count('href="/speak"') == 1  # in the navigation of every page
        with agent.__class__(base_url=base, timeout=10) as anonymous:
            assert anonymous.get("/speak").status_code == 303


def test_the_demo_notice_follows_the_live_heartbeats_and_else_the_config() -> None:
    demo = {"node": "a", "model": {"dir": "/m/demo", "demo": True}}
    real = {"node": "b", "model": {"dir": "/m/aishell", "demo": False}}
    assert demo_model_notice([], configured_demo=True) == DEMO_MODEL_NOTICE
    assert demo_model_notice([], configured_demo=False) is None
    assert demo_model_notice([real], configured_demo=True) is None  # what runs beats what is configured
    assert demo_model_notice([real, demo], configured_demo=False) == DEMO_MODEL_NOTICE  # a call may reach it
    assert demo_model_notice([{**demo, "stale": True}], configured_demo=False) is None
    assert demo_model_notice([{"node": "old"}], configured_demo=True) == DEMO_MODEL_NOTICE  # no model reported
    assert "asr-model pull NAME" in DEMO_MODEL_NOTICE and "asr-model install ARCHIVE" in DEMO_MODEL_NOTICE


def write_heartbeat(redis_url: str, node: str, demo: bool) -> None:
    report = {"node": node, "ts": time.time(), "model": {"dir": f"/models/{node}", "demo": demo}}
    with redis.Redis.from_url(redis_url) as client:
        client.hset(nodes_key("asr"), node, json.dumps(report))


@needs_chromium
def test_the_page_says_plainly_when_the_bundled_demo_model_listens(tmp_path: Path, redis_server: RedisServer) -> None:
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    door = f"websocket: {{enabled: true, host: 127.0.0.1, port: {free_port()}}}\n"
    console_yaml = write_configs(tmp_path, redis_server.url, door)  # engine.model_dir unset: the bundled model
    with running_console(console_yaml) as base, chromium(tmp_path / "chromium") as driver:
        sign_in(driver, base, "agent1", PASSWORDS["agent1"], "/speak")
        notice = WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "speak-model-notice"))
        assert notice.is_displayed()
        text = " ".join(notice.text.split())
        assert text.startswith("Synthetic voices only.") and "will not understand a person speaking" in text
        assert "asr-model pull NAME" in text and "asr-model install ARCHIVE" in text
        driver.save_screenshot(str(tmp_path / "console-speak-demo-notice.png"))
        for width in (LAPTOP_WIDTH, TABLET_WIDTH):
            driver.set_window_size(width, WINDOW_HEIGHT)
            assert_fits_width(driver, f"speak page with the demo notice at {width} px")

        write_heartbeat(redis_server.url, "node-real", demo=False)  # a gateway serving a real model
        driver.get(f"{base}/speak")
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.ID, "speak-start"))
        assert not driver.find_elements(By.ID, "speak-model-notice")
        write_heartbeat(redis_server.url, "node-demo", demo=True)
        driver.get(f"{base}/speak")
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.ID, "speak-model-notice"))


def fake_microphone_wav(path: Path) -> Path:
    """The bundled recording at 16 kHz with trailing silence, as a 16-bit PCM mono WAV."""
    pcm = np.concatenate([recording("hotline_seed", 16000), np.zeros(int(16000 * TRAILING_SILENCE_S), np.int16)])
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(pcm.astype("<i2").tobytes())
    return path


@needs_chromium
def test_speak_to_it_in_chromium_shows_the_recordings_final_text(tmp_path: Path, redis_server: RedisServer) -> None:
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.test_console_browser import ServiceThread, gateway_sections

    door = f"websocket: {{enabled: true, host: 127.0.0.1, port: {free_port()}}}\n"
    console_yaml = write_configs(tmp_path, redis_server.url, gateway_sections(tmp_path) + door)
    wav = fake_microphone_wav(tmp_path / "microphone.wav")
    flags = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             f"--use-file-for-fake-audio-capture={wav}")  # fmt: skip
    with (
        ServiceThread(console_yaml.parent / "gateway.yaml"),
        running_console(console_yaml) as base,
        chromium(tmp_path / "chromium", extra_flags=flags) as driver,
    ):
        sign_in(driver, base, "agent1", PASSWORDS["agent1"], "/speak")
        driver.find_element(By.ID, "speak-start").click()
        WebDriverWait(driver, 20).until(
            lambda d: d.find_element(By.ID, "speak-state").get_attribute("data-state") == "listening"
        )
        final: Any = WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#speak-finals li"))
        assert final[0].text == SEED_TEXT, [f.text for f in final]
        driver.save_screenshot(str(IMG / "console-speak.png"))
        driver.find_element(By.ID, "speak-stop").click()
        WebDriverWait(driver, 30).until(
            lambda d: d.find_element(By.ID, "speak-state").get_attribute("data-state") == "ended"
        )
        assert driver.find_element(By.ID, "speak-message").get_attribute("hidden") is not None
        for width in (LAPTOP_WIDTH, TABLET_WIDTH):
            driver.set_window_size(width, WINDOW_HEIGHT)
            assert_fits_width(driver, f"speak page at {width} px")

        # -- a WAV file instead of the microphone: streamed in real time, ended by its end ----------
        driver.find_element(By.ID, "speak-file").send_keys(str(wav))
        WebDriverWait(driver, 20).until(lambda d: not d.find_elements(By.CSS_SELECTOR, "#speak-finals li"))
        final = WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#speak-finals li"))
        assert final[0].text == SEED_TEXT
        WebDriverWait(driver, 30).until(
            lambda d: d.find_element(By.ID, "speak-state").get_attribute("data-state") == "ended"
        )
    with redis.Redis.from_url(redis_server.url) as client:
        events = [json.loads(fields[b"event"]) for _, fields in client.xrange("asr:events")]
    started = [e for e in events if e["event_type"] == "call.started"]
    assert [(e["source"], e["metadata"]) for e in started] == [("websocket", {})] * 2
    for call in started:
        finals = [
            e["text"] for e in events if e["call_id"] == call["call_id"] and e["event_type"] == "transcript.final"
        ]
        assert finals[0] == SEED_TEXT
        assert [e["event_type"] for e in events if e["call_id"] == call["call_id"]][-1] == "call.ended"
