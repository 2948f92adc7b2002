"""What the Chromium end-to-end tests of the Control UI share: the ``roost run`` under test,
its UI accounts, screenshots, and the errors a page's JavaScript raised.

The fixtures (``browser``, ``roost_ui``, ``page``) are in this package's ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from playwright.async_api import Page

from bot.testing.telegram import FakeTelegram
from tests.browser import ARTIFACTS, SCREENSHOTS
from tests.cli_forks import run_roost

CHROMIUM_ARGS = (
    # CI runs as root, where Chromium's own sandbox cannot start.
    "--no-sandbox",
    # A container's /dev/shm may be a few MiB: shared memory goes to /tmp instead.
    "--disable-dev-shm-usage",
    # No traffic of Chromium's own: nothing but the page under test may leave the browser.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
)

ROLES = ("admin", "operator", "viewer")
"""One UI account of each role is added before ``roost run`` starts."""


@dataclass(frozen=True, slots=True)
class Account:
    """A UI account ``roost ui user add`` created."""

    name: str
    role: str
    password: str


@dataclass(slots=True)
class RoostUi:
    """A running ``roost run`` with its UI on :attr:`base_url` and its fake Telegram."""

    base_url: str
    telegram: FakeTelegram
    proc: asyncio.subprocess.Process
    cwd: Path
    log: Path
    accounts: dict[str, Account] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return self.base_url + path

    async def login(self, page: Page, role: str = "admin") -> Account:
        """Log ``page`` in through the login form as the account of ``role``."""
        account = self.accounts[role]
        await page.goto(self.url("/ui/login"))
        await page.get_by_label(re.compile("name", re.IGNORECASE)).fill(account.name)
        await page.get_by_label(re.compile("password", re.IGNORECASE)).fill(account.password)
        await page.get_by_role("button", name=re.compile("log ?in|sign ?in", re.IGNORECASE)) \
            .click()
        await page.wait_for_url(re.compile(r".*/ui/(?!login).*"))
        return account

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_ready(self) -> None:
        """Until ``roost run`` logged ``roost ready`` and answers ``/healthz``; fails with
        the log's tail if it exits first."""
        async with asyncio.timeout(60):  # a hang guard, not a measurement
            while b"roost ready" not in self.log.read_bytes():
                assert self.proc.returncode is None, self.log_text()[-3000:]
                await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as http, \
                    http.get(self.url("/healthz")) as reply:
                assert reply.status == 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def add_account(cwd: Path, env: dict[str, str], name: str, role: str) -> Account:
    """``roost ui user add NAME --role ROLE --password-stdin``, as an operator would."""
    password = secrets.token_urlsafe(12)
    result = run_roost(["ui", "user", "add", name, "--role", role, "--password-stdin"],
                       cwd=cwd, env=env, input=password + "\n", timeout=60)
    assert result.returncode == 0, result.stderr
    return Account(name, role, password)


@dataclass(slots=True)
class PageErrors:
    """What went wrong in a page: console errors (a refusal by the
    Content-Security-Policy is one), uncaught exceptions, resources that failed to load,
    and dialogs it opened; the UI's own confirmations are kept apart (they are no error)."""

    console: list[str] = field(default_factory=list)
    uncaught: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    confirms: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return [*self.console, *self.uncaught, *self.loads, *self.dialogs]


async def screenshot(page: Page, name: str) -> Path | None:
    """Save a full-page screenshot of ``page`` as ``ARTIFACTS/<name>.png`` (Playwright
    creates the directory) if :data:`~tests.browser.SCREENSHOTS` asks for screenshots."""
    if not SCREENSHOTS:
        return None
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


async def until(check: Callable[[], bool | Awaitable[bool]], what: str,
                limit: float = 15.0) -> None:
    """Poll ``check()`` until true; fails naming ``what`` after ``limit`` seconds (a hang
    guard, not a measurement)."""
    deadline = time.monotonic() + limit
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.05)
