"""Chromium end-to-end fixtures for the Control UI: one browser per test session, one
``roost run`` per test module.

``browser`` is Debian's Chromium (a system binary, never a downloaded build) driven by
Playwright: its headless shell (``chromium-headless-shell``, what Playwright itself runs
headless) where installed, as .ci/run installs it, else the full ``chromium`` in its new
headless mode. ``roost_ui`` starts ``roost run`` as a separate process against a
:class:`~bot.testing.telegram.FakeTelegram` with a scripted model (the module's
``SCRIPT``, else :data:`DEFAULT_SCRIPT`) and ``ROOST_HTTP_PORT`` on a free port, after
adding one UI account per role with ``roost ui user add``. ``page`` is a fresh browser
context (no cookies) in which any console error, uncaught error or dialog fails the test.

Test modules here mark themselves ``pytestmark = [pytest.mark.e2e,
pytest.mark.asyncio(loop_scope="session")]``: the browser lives on the session's loop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from playwright.async_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Error,
    Page,
    Response,
    async_playwright,
)

from bot.testing.telegram import FakeTelegram
from tests.browser import ARTIFACTS
from tests.browser.harness import (
    CHROMIUM_ARGS,
    ROLES,
    PageErrors,
    RoostUi,
    add_account,
    free_port,
)
from tests.test_cli import clean_env

DEFAULT_SCRIPT = """\
loop: true
turns:
  - match: "^slow"
    steps:
      - delay: 60
        reply: "finished slowly"
  - match: "^fail"
    steps:
      - tool_calls: [{name: read_file, arguments: {path: "no/such/file.md"}}]
      - reply: "That failed: {error_id}"
  - match: "^write"
    steps:
      - tool_calls: [{name: write_file, arguments: {path: "ui-note.txt", content: "<b>hi</b>"}}]
      - reply: "written"
  - reply: "echo: {message}"
"""
"""The model of a module that names no ``SCRIPT``: ``slow...`` takes a minute (to be
stopped), ``fail...`` fails a tool and quotes the error ID, ``write...`` writes a file
(which waits for approval: :data:`DEFAULT_CONFIG`), anything else is echoed."""
DEFAULT_CONFIG = '[agents.default]\ntools = { approve = ["write_file"] }\n'
"""The ``roost.toml`` of a module that names no ``CONFIG``."""


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless, for the whole test session: the headless shell, the same
    engine without the browser's own windowing and far cheaper to run,
    else the full browser."""
    executable = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    assert executable, \
        "chromium-headless-shell is not installed (.ci/run installs it with apt)"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, args=list(CHROMIUM_ARGS))
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def roost_ui(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RoostUi]:
    """``roost run`` for this module: fake Telegram, scripted model, UI on a free port, one
    account per role. Telegram users 42-49 are on the DM allowlist; anyone else pairs."""
    cwd = tmp_path_factory.mktemp("roost-ui")
    (cwd / "script.yaml").write_text(getattr(request.module, "SCRIPT", DEFAULT_SCRIPT))
    (cwd / "roost.toml").write_text(getattr(request.module, "CONFIG", DEFAULT_CONFIG))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # each worker starts its own
    log = ARTIFACTS / f"{request.module.__name__.rsplit('.', 1)[-1]}{worker}.roost.log"
    port = free_port()
    async with FakeTelegram() as telegram:
        env = clean_env(
            ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(cwd / "script.yaml"),
            ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0",
            ROOST_DM_POLICY="pairing",
            ROOST_DM_ALLOWLIST=",".join(f"telegram:{n}" for n in range(42, 50)),
            ROOST_HTTP_PORT=str(port), ROOST_LOG_LEVEL="INFO",
            TELEGRAM_BOT_TOKEN=telegram.token, TELEGRAM_API_BASE=telegram.base_url)
        accounts = {role: await asyncio.to_thread(add_account, cwd, env, f"{role}-user", role)
                    for role in ROLES}
        with log.open("wb") as sink:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "run", cwd=cwd, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=sink, stderr=sink)
        ui = RoostUi(f"http://127.0.0.1:{port}", telegram, proc, cwd, log, accounts)
        try:
            await ui.wait_ready()
            yield ui
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    async with asyncio.timeout(15):
                        await proc.wait()
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


@pytest.fixture
def page_errors() -> PageErrors:
    """The console errors, uncaught errors and dialogs of this test's ``page``."""
    return PageErrors()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Browser, page_errors: PageErrors) -> AsyncIterator[Page]:
    """A fresh browser context and page; a console error, an uncaught error, a resource
    of a page that failed to load or a dialog other than the UI's confirmations
    (accepted) fails the test (``page_errors`` holds them)."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    tab = await context.new_page()

    def on_console(message: ConsoleMessage) -> None:
        # A failed load is logged here too; it is judged by on_response instead (a page
        # answered 401 or 403 on purpose is no error).
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            page_errors.console.append(f"{message.text} at {message.location}")

    def on_response(response: Response) -> None:
        # What a page loads (scripts, styles, images, htmx requests, streams) must load.
        if response.status >= 400 and response.request.resource_type != "document":
            page_errors.loads.append(f"{response.status} {response.url}")

    def on_error(error: Error) -> None:
        page_errors.uncaught.append(str(error))

    async def on_dialog(dialog: Dialog) -> None:
        # The UI asks before an action (ui.js); any other dialog is something a page ran.
        if dialog.type == "confirm":
            page_errors.confirms.append(dialog.message)
            await dialog.accept()
        else:
            page_errors.dialogs.append(f"{dialog.type}: {dialog.message}")
            await dialog.dismiss()

    tab.on("console", on_console)
    tab.on("pageerror", on_error)
    tab.on("response", on_response)
    tab.on("dialog", on_dialog)
    try:
        yield tab
    finally:
        await context.close()
    assert not page_errors.all(), page_errors.all()
