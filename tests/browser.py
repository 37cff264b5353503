"""A real browser for tests: headless Chromium (Debian's ``chromium``), run once per page.

:func:`chromium` finds it, installing it with apt-get when the tests run as
root and it is missing (CI), or says why a test must skip. Each run gets a
new profile directory and the flags that keep Chromium from calling home,
so it touches nothing but the page's own server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
)
# Milliseconds of page time (JavaScript timers, fetches) before Chromium dumps or shoots the page.
SETTLE_MS = 4000


def chromium() -> tuple[str | None, str]:
    """(the Chromium executable, "") or (None, why there is none)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found, ""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None, "chromium is not installed and these tests are not root with apt-get: apt-get install chromium"
    environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]
    result = subprocess.run(install, capture_output=True, text=True, env=environment, timeout=900)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=environment, timeout=600)
        result = subprocess.run(install, capture_output=True, text=True, env=environment, timeout=900)
    found = shutil.which("chromium")
    return (found, "") if found else (None, f"apt-get install chromium failed: {result.stderr.strip()[-300:]}")


def _run(executable: str, url: str, *options: str, timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="p2ptrain-chromium-") as profile:
        command = [executable, *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={SETTLE_MS}", *options, url]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=profile)


def page_dom(executable: str, url: str) -> str:
    """The page's DOM as HTML once its scripts ran for ``SETTLE_MS`` of page time."""
    result = _run(executable, url, "--dump-dom")
    assert result.returncode == 0 and result.stdout, result.stderr[-2000:]
    return result.stdout


def screenshot(executable: str, url: str, path: Path, width: int = 1280, height: int = 1100) -> None:
    """A PNG of the page at ``width`` x ``height`` CSS pixels, once its scripts ran."""
    result = _run(executable, url, f"--screenshot={path}", f"--window-size={width},{height}")
    assert result.returncode == 0 and path.is_file(), result.stderr[-2000:]
