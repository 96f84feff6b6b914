"""Headless Debian Chromium for the console's browser tests (selenium + chromedriver): start it,
sign in, and check that a page fits the window's width."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMEDRIVER = Path("/usr/bin/chromedriver")
LAPTOP_WIDTH, TABLET_WIDTH = 1366, 768  # px: the widths the console's pages must fit
WINDOW_HEIGHT = 900

needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None or not CHROMEDRIVER.is_file(),
    reason="chromium and chromium-driver not installed",
)


SCREENSHOTS_ENV = "HOTLINE_ASR_SCREENSHOTS"


def screenshot_dir() -> Path:
    """Where the browser tests save their screenshots: ``$HOTLINE_ASR_SCREENSHOTS`` when set (e.g.
    ``docs/img`` to refresh the docs' pictures), else a folder under the system's temporary
    directory, so that a test run leaves the checkout as it was."""
    chosen = os.environ.get(SCREENSHOTS_ENV)
    folder = Path(chosen) if chosen else Path(tempfile.gettempdir()) / "hotline-asr-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def chromium(
    profile_dir: Path, width: int = LAPTOP_WIDTH, height: int = WINDOW_HEIGHT, extra_flags: tuple[str, ...] = ()
) -> Iterator[Any]:
    """A headless Chromium window of ``width`` x ``height`` px with a fresh profile, started with
    ``extra_flags`` besides ours (e.g. a fake capture device)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", f"--window-size={width},{height}", f"--user-data-dir={profile_dir}",
                 *extra_flags):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def sign_in(driver: Any, base: str, user: str, password: str, path: str = "/") -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base + path)
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "login-form"))
    driver.find_element(By.ID, "username").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.ID, "login-submit").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-page]"))


# Whether the page scrolls sideways, and which visible elements reach past the window's right
# edge (text cut off or hidden off-screen); an element inside a box that scrolls by itself
# (the diff, the audit log) is that box's business.
OVERFLOW_JS = """
const width = window.innerWidth;
const inScroller = (e) => {
  for (let p = e.parentElement; p; p = p.parentElement) {
    const o = getComputedStyle(p).overflowX;
    if (o === "auto" || o === "scroll") return true;
  }
  return false;
};
const past = [...document.querySelectorAll("body *")].filter((e) => {
  const r = e.getBoundingClientRect();
  return r.width > 0 && r.height > 0 && r.right > width + 0.5 && !inScroller(e);
}).map((e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + (e.className ? "." + e.className : ""));
return {scrollWidth: document.scrollingElement.scrollWidth, innerWidth: width, past: past.slice(0, 10)};
"""


def assert_fits_width(driver: Any, what: str) -> None:
    """No sideways scrolling and nothing past the right edge at the window's current width."""
    fit = driver.execute_script(OVERFLOW_JS)
    assert fit["scrollWidth"] <= fit["innerWidth"] and not fit["past"], (what, fit)
