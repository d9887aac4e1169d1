"""Plumbing for the browser tests and the board benchmark: Debian's Chromium driven by
Playwright (the server they drive is harness.board_server.BoardServer). Also what the proxy
tests (tests/test_proxy.py) need: Debian's nginx.

Playwright is in requirements-test.txt, not requirements.txt: it is imported only by whoever
drives the browser, after `browser_missing()` said it is there. No Django import at module
level: bench/board.py uses this before configuring Django."""
from __future__ import annotations

import os

from harness import TEST_INSTALL

CHROMIUM = "/usr/bin/chromium"
NGINX = "/usr/sbin/nginx"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _not_installed(program: str, package: str) -> str | None:
    if not (os.path.exists(program) and os.access(program, os.X_OK)):
        return f"{program} is not installed (apt-get install {package})"
    return None


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if why := _not_installed(CHROMIUM, "chromium"):
        return why
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"playwright does not import ({exc}); {TEST_INSTALL}"
    return None


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def proxy_missing() -> str | None:
    """Why the proxy tests (Debian's nginx in front of two board servers) cannot run here."""
    if why := _not_installed(NGINX, "nginx"):
        return why
    try:
        import cryptography  # noqa: F401  (the test's self-signed certificate)
        import websockets.sync.client  # noqa: F401
    except ImportError as exc:
        return f"a package the proxy tests need is not installed ({exc})"
    return None
