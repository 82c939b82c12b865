"""A headless Chromium driven by Selenium for the console tests: the system's browser and driver
(Debian's ``chromium`` and ``chromium-driver``), a fresh profile, no network but the test server;
and what a user does with it (visit, sign in, fill, click, wait for the status or an error)."""

import os
import shutil
import tempfile
from pathlib import Path

from _server import TOKEN

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,800"]
#: where the tests save their screenshots (docs/img for the documentation); unset: none
SHOTS = os.environ.get("DYNTC_SCREENSHOTS")
WAIT_S = 30  # generous for a busy 2-core machine; every wait ends as soon as its condition holds


def missing() -> str | None:
    """Why a browser test cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[console-test]')"
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    return None


def start_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dyntc-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.implicitly_wait(0)
    driver.profile_dir = profile
    return driver


def stop_browser(driver) -> None:
    driver.quit()
    shutil.rmtree(driver.profile_dir, ignore_errors=True)


def viewport(driver, width: int, height: int) -> None:
    """Make the page's viewport `width` x `height` CSS pixels (the window is larger by its frame)."""
    driver.set_window_size(width, height)
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    if inner != [width, height]:
        driver.set_window_size(2 * width - inner[0], 2 * height - inner[1])


def shot(driver, name: str) -> None:
    """Save a screenshot of the viewport as `name`.png when DYNTC_SCREENSHOTS names a folder."""
    if not SHOTS:
        return
    folder = Path(SHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(folder / f"{name}.png"))


# ---------------------------------------------------------------------------------------- what a user does


def wait(driver, condition, what: str, timeout: float = WAIT_S):
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    # an element looked up while the page is being replaced (a navigation, or <main> swapped) may be
    # missing, stale or detached under the lookup: look again at the next poll
    return WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=(WebDriverException,)).until(
        condition, message=f"waited for {what}")


def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def visit(driver, url: str) -> None:
    driver.get(url)
    wait(driver, lambda d: d.execute_script("return document.body.dataset.ready === '1'"), f"{url} to load")


def sign_in(driver, token: str = TOKEN) -> None:
    box = by_id(driver, "token-input")
    box.clear()
    box.send_keys(token)
    box.submit()
    if token == TOKEN:
        wait(driver, lambda d: by_id(d, "signed-in").is_displayed(), "the signed-in state")


def status_says(driver, words: str) -> None:
    wait(driver, lambda d: words in by_id(d, "status").text, f"the status to say {words!r}")


def error_says(driver, words: str) -> str:
    wait(driver, lambda d: by_id(d, "error").is_displayed() and words in by_id(d, "error").text,
         f"an error saying {words!r}")
    return by_id(driver, "error").text


def fill(driver, element_id: str, text: str) -> None:
    box = by_id(driver, element_id)
    box.clear()
    box.send_keys(text)


def click(driver, selector: str) -> None:
    css(driver, selector)[0].click()
