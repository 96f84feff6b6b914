"""The archive in the console, against SQLite and a real PostgreSQL: a supervisor finds calls by
words, tag, address, agent, route and dates, page after page; an agent cannot search, cannot
open another agent's archived call (404, as for live calls) and opens their own once it is no
longer live (``/calls/ID`` leads to the archived record); every search and view is in the access
log (admins only). Then the search page in headless Chromium, at 1366 and 768 px, with
screenshots (console-archive-*.png in browser_helpers.screenshot_dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from archive.store import open_store
from tests.archive_db import postgres, store_url
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
from tests.redis_server import RedisServer, redis_server
from tests.test_archive_store import T0, a_call, as_json

__all__ = ["postgres", "redis_server", "store_url"]


def archived_console(tmp_path: Path, redis_url: str, db: str) -> Path:
    console_yaml = write_configs(tmp_path, redis_url)
    with console_yaml.open("a", encoding="utf-8") as out:
        out.write(f"archive_db: {db}\n")
    store = open_store(db)
    try:
        store.apply(as_json(a_call("mine", "1001", "新华路十二号井盖发生了破损", "市政设施/井盖", T0)))
        store.apply(as_json(a_call("theirs", "1002", "路灯一直不亮很危险", "市政设施/路灯", T0 + 1000)))
        for n in range(60):
            store.apply(as_json(a_call(f"noise-{n:02d}", "1003", f"楼上噪音扰民第{n}次", "环境/噪音", T0 + 5000 + n)))
    finally:
        store.close()
    return console_yaml


def test_search_access_rules_and_access_log(tmp_path: Path, redis_server: RedisServer, store_url: str) -> None:
    with running_console(archived_console(tmp_path, redis_server.url, store_url)) as base:
        sup, agent, admin = login(base, "sup"), login(base, "agent1"), login(base, "admin")

        def found(**params: str) -> list[str]:
            answer = sup.get("/api/archive/calls", params=params)
            assert answer.status_code == 200, answer.text
            return [c["call_id"] for c in answer.json()["calls"]]

        assert found(phrase="井盖发生了破损") == ["mine"] and found(tag="市政设施") == ["theirs", "mine"]
        assert found(address="新华路", agent="1002") == ["theirs"] and found(route="nowhere") == []
        assert found(**{"from": "2026-12-01", "to": "2026-12-01", "phrase": "路灯"}) == []
        assert found(**{"from": "2026-11-30", "to": "2026-12-31", "phrase": "路灯"}) == ["theirs"]
        assert sup.get("/api/archive/calls", params={"from": "yesterday"}).status_code == 400

        pages, after = [], None
        while True:
            answer = sup.get("/api/archive/calls", params={"tag": "环境/噪音", **({"after": after} if after else {})})
            pages.append([c["call_id"] for c in answer.json()["calls"]])
            if (after := answer.json()["next_after"]) is None:
                break
        assert [len(p) for p in pages] == [50, 10] and len({c for p in pages for c in p}) == 60

        page = sup.get("/archive", params={"phrase": "井盖"})
        assert page.status_code == 200 and 'data-call-id="mine"' in page.text and "theirs" not in page.text
        assert sup.get("/archive/calls/theirs").status_code == 200

        assert agent.get("/archive").status_code == 403 and agent.get("/api/archive/calls").status_code == 403
        assert agent.get("/api/archive/calls/theirs").status_code == 404
        assert agent.get("/archive/calls/theirs").status_code == 404
        assert agent.get("/calls/theirs").status_code == 404  # not live, not theirs: the 404 page
        assert agent.get("/calls/mine").headers["location"] == "/archive/calls/mine"
        mine = agent.get("/archive/calls/mine")
        assert mine.status_code == 200 and "新华路十二号井盖发生了破损" in mine.text
        assert agent.get("/api/archive/calls/mine").json()["call"]["agent"] == "1001"

        assert sup.get("/api/archive/access").status_code == 403 and agent.get("/api/archive/access").status_code == 403
        log = admin.get("/api/archive/access").json()["access"]
        seen = [(e["user"], e["action"], e["what"]) for e in reversed(log)]
        assert ("sup", "search", {"phrase": "井盖发生了破损"}) in seen
        assert ("sup", "view", {"call_id": "theirs"}) in seen and ("agent1", "view", {"call_id": "mine"}) in seen
        assert ("agent1", "view-refused", {"call_id": "theirs"}) in seen
        assert all(e["at"].endswith("Z") for e in log)


@needs_chromium
def test_search_page_in_a_browser(tmp_path: Path, redis_server: RedisServer) -> None:
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    images = screenshot_dir()
    console_yaml = archived_console(tmp_path, redis_server.url, f"sqlite://{tmp_path / 'archive.db'}")
    with running_console(console_yaml) as base, chromium(tmp_path / "chromium") as driver:
        sign_in(driver, base, "sup", PASSWORDS["sup"], "/archive")
        form = WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "archive-search"))[0]
        form.find_element(By.NAME, "tag").send_keys("市政设施")
        driver.execute_script("arguments[0].value = '2026-11-30'", form.find_element(By.NAME, "from"))
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        rows = WebDriverWait(driver, 10).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#archive-results tr[data-call-id]")
        )
        assert [r.get_attribute("data-call-id") for r in rows] == ["theirs", "mine"]
        assert "新华路十二号井盖发生了破损" in rows[1].text and "1001" in rows[1].text
        for width in (LAPTOP_WIDTH, TABLET_WIDTH):
            driver.set_window_size(width, WINDOW_HEIGHT)
            assert_fits_width(driver, f"archive search at {width} px")
        driver.save_screenshot(str(images / "console-archive-search-768.png"))
        driver.set_window_size(LAPTOP_WIDTH, WINDOW_HEIGHT)
        driver.save_screenshot(str(images / "console-archive-search-1366.png"))

        rows[1].find_element(By.CSS_SELECTOR, "a").click()
        finals = WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#archive-finals .utt"))
        assert "新华路十二号井盖发生了破损" in finals[0].text
        assert "agent 1001" in driver.find_element(By.ID, "archive-call-info").text
        assert_fits_width(driver, "archived call page")
        driver.save_screenshot(str(images / "console-archive-call-1366.png"))

        driver.get(base + "/archive?tag=环境/噪音")
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "archive-more"))[0].click()
        rows = WebDriverWait(driver, 10).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#archive-results tr[data-call-id]")
        )
        assert len(rows) == 10 and not driver.find_elements(By.ID, "archive-more")
