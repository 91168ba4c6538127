"""A served dashboard and a headless Chromium to look at it (Debian's chromium and
chromium-driver, driven by Selenium): used by the browser test and scripts/dashboard_screenshot.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def missing() -> str | None:
    """Why a browser cannot be started here, or ``None``."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium (the test extra) is not installed"
    for program in ("chromium", "chromedriver"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install chromium chromium-driver)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def served(url: str, *, token: str | None = None, refresh: int = 0) -> Iterator[str]:
    """``agentlease dashboard`` on a free loopback port, in a process of its own; yields its
    base URL once it answers."""
    port = free_port()
    command = [sys.executable, "-m", "agentlease", "dashboard", "--backend", url]
    command += ["--port", str(port), "--refresh", str(refresh)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("AGENTLEASE_DASHBOARD_TOKEN", None)
    if token is not None:
        env["AGENTLEASE_DASHBOARD_TOKEN"] = token
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(base + "/", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    _, err = process.communicate(timeout=10)
                    raise RuntimeError(f"the dashboard did not start: {err}") from None
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate(timeout=10)


@contextmanager
def browser(width: int = 1280, height: int = 800) -> Iterator[Any]:
    """A headless Chromium, through chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in (
        "--headless=new",
        "--no-sandbox",  # runs as root in containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    service = Service(executable_path=shutil.which("chromedriver") or "chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
