"""The Airflow UI in headless Chromium, driven by Selenium through Debian's
``chromedriver`` (package ``chromium-driver``, built from the same sources as
its ``chromium``; scripts/bootstrap.sh installs both). Nothing is downloaded:
the driver and the browser are given by path, and Selenium Manager is told to
stay offline.

    with browser() as driver:
        driver.get(stack.url)
        ...
        save_screenshot(driver, "grid.png")

chromedriver listens on a free port of 127.0.0.1 and accepts local clients
only; Chromium opens no port (it talks to chromedriver over a pipe). Leaving
the context quits both, then kills whatever of their process tree is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.airflow_stack import _descendants, _start_time

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMEDRIVER_NAMES = ("chromedriver",)
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                  "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe")
WAIT = 120.0  # seconds: the UI's first load on a busy 2-core machine


def chromium_binary() -> str | None:
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


def chromedriver_binary() -> str | None:
    return next((path for path in map(shutil.which, CHROMEDRIVER_NAMES) if path), None)


def missing() -> str | None:
    """Why no browser can run here (None when it can)."""
    if chromium_binary() is None or chromedriver_binary() is None:
        return "Chromium and chromedriver drive the UI tests: run scripts/bootstrap.sh (make setup) to install them"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is a dev dependency: run make setup"
    return None


@contextlib.contextmanager
def browser(*, width: int = 1600, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium WebDriver whose window is ``width`` x ``height``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    reason = missing()
    if reason:
        raise RuntimeError(reason)
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never look for drivers online
    profile = tempfile.mkdtemp(prefix="eos-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium_binary()
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    service = Service(executable_path=chromedriver_binary(), service_args=["--allowed-ips=127.0.0.1"],
                      log_output=os.path.join(profile, "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    tree: set[tuple[int, int]] = set()
    try:
        driver.set_window_size(width, height)
        # the viewport, not the window with its (headless) frame, is what a screenshot captures
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        yield driver
    finally:
        if service.process is not None:
            tree = _descendants({service.process.pid})
        with contextlib.suppress(Exception):
            driver.quit()
        for pid, start in tree:  # a Chromium helper that outlived quit()
            if _start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str, timeout: float = WAIT) -> Any:
    """Until ``condition(driver)`` is truthy; the error says what was awaited and
    what the page showed instead."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(condition)
    except TimeoutException:
        text = driver.execute_script("return document.body ? document.body.innerText : ''") or ""
        raise TimeoutError(f"{what}: not after {timeout:.0f}s at {driver.current_url}; the page shows:\n"
                           f"{text[:2000]}") from None


def page_text(driver: Any) -> str:
    return driver.execute_script("return document.body ? document.body.innerText : ''") or ""


def open_ui(driver: Any, url: str, *, local_storage: Mapping[str, str] | None = None,
            ready_text: tuple[str, ...] = ()) -> None:
    """Load a page of the Airflow UI (signing in: with all-admins the UI's login
    sets its token cookie by itself), set ``local_storage`` for its origin and
    reload, then wait until the page shows every string of ``ready_text``."""
    import json

    driver.get(url)
    wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete", "page load")
    if local_storage:
        driver.execute_script("".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});"
                                      for k, v in local_storage.items()))
        driver.get(url)
    if ready_text:
        wait_for(driver, lambda d: all(t in page_text(d) for t in ready_text), f"the page showing {ready_text}")


def save_screenshot(driver: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    if not driver.save_screenshot(str(path)):
        raise RuntimeError(f"Chromium could not write the screenshot {path}")
    return path
