"""No configured secret reaches a log line, whichever logger writes it."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from bot.config.settings import Settings
from bot.observability import redact
from tests.roost_forks import spawn

TOKEN = "123456:SECRET-bot-token-value"
API_KEY = "sk-ant-secret-api-key-0123456789"
LOGGERS = ("aiogram.dispatcher", "some.lib", "roost.channels.telegram", "x", "httpx", "roost")


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    previous = root.level
    root.setLevel(logging.DEBUG)
    # Other tests in this worker (the CLI's logging setup) may have quieted these
    # loggers; this test is about what reaches a handler, so it sets them itself.
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [(logger.level, logger.disabled, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.NOTSET)
        logger.disabled, logger.propagate = False, True
    try:
        yield stream
    finally:
        for logger, (level, disabled, propagate) in zip(loggers, saved, strict=True):
            logger.setLevel(level)
            logger.disabled, logger.propagate = disabled, propagate
        root.removeHandler(handler)
        root.setLevel(previous)
        redact.install([])


def test_secrets_are_masked_in_messages_arguments_tracebacks_and_stacks(
        captured: io.StringIO) -> None:
    settings = Settings(telegram_bot_token=TOKEN, anthropic_api_key=API_KEY,
                        plugins={"weather": {"api_key": "weather-secret-key"}})
    redact.install(redact.secrets_of(settings))
    third_party = logging.getLogger("aiogram.dispatcher")
    third_party.error("Failed to fetch updates - https://api.telegram.org/bot%s/getUpdates", TOKEN)
    # Libraries do format secrets into their messages themselves.
    logging.getLogger("some.lib").warning(f"key={API_KEY} and weather-secret-key")  # noqa: G004
    try:
        raise RuntimeError(f"request to /bot{TOKEN}/sendMessage failed")
    except RuntimeError:
        logging.getLogger("roost.channels.telegram").exception("sending failed")
    logging.getLogger("x").info("stack", stack_info=True, extra={"unused": TOKEN})
    logging.getLogger("httpx").info("GET https://user:hunter22@example.com/path")
    output = captured.getvalue()
    for secret in (TOKEN, API_KEY, "weather-secret-key", "hunter22"):
        assert secret not in output
    assert "bot********/getUpdates" in output
    assert "https://user:********@example.com/path" in output
    assert "RuntimeError: request to /bot********/sendMessage failed" in output


@pytest.mark.parametrize("url", [
    "https://bob:hunter22@example.com/p?x=1",
    "https://example.com/hook?api_key=hunter22&sig=hunter23&access_token=hunter24#frag",
    "postgresql://roost:hunter22@db:5432/roost?sslpassword=hunter23",
    "https://hunter22@github.com/org/repo.git",
    "https://h.example/?X-Amz-Signature=hunter22&Secret=hunter23&pwd=hunter24&q=kept",
])
def test_a_log_line_masks_a_url_exactly_as_config_show_does(
        captured: io.StringIO, url: str) -> None:
    redact.install([])
    logging.getLogger("some.lib").warning("calling %s failed", url)
    shown = Settings(openai_base_url=url).masked()["openai_base_url"]
    assert captured.getvalue() == f"some.lib calling {shown} failed\n"
    assert "hunter" not in shown
    assert "q=kept" in shown or "q=kept" not in url  # only secrets are masked


def test_a_record_without_secrets_is_left_as_it_was(captured: io.StringIO) -> None:
    redact.install([TOKEN])
    logging.getLogger("roost").info("run %s completed in %d ms", "abc", 12)
    assert captured.getvalue() == "roost run abc completed in 12 ms\n"


def test_url_credentials_are_masked_in_linear_time_even_in_megabyte_messages() -> None:
    # A megabyte of letters before a URL used to make every log line of it quadratic
    # (an SDK logs whole payloads at debug level): this would not finish.
    huge = "a" * 1_000_000
    text = f"{huge} see https://bob:hunter22@example.org/x and {'a:' * 100_000}"
    clean = redact.redact(text)
    assert "hunter22" not in clean and clean.startswith(huge)
    assert redact.redact("postgres://u:pw@db/x, ftp+ssl://a:b@h") == (
        f"postgres://u:{redact.MASK}@db/x, ftp+ssl://a:{redact.MASK}@h")


@pytest.mark.e2e
async def test_roost_run_never_logs_the_token_when_telegram_redirects_in_a_loop(
        tmp_path: Path) -> None:
    """aiogram's own error names the request URL, which carries the bot token."""
    async def handle(request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        if method == "getMe":
            return web.json_response({"ok": True, "result": {
                "id": 123456, "is_bot": True, "first_name": "B", "username": "b_bot"}})
        if method in ("deleteWebhook", "setMyCommands"):
            return web.json_response({"ok": True, "result": True})
        raise web.HTTPFound(str(request.url))

    app = web.Application()
    app.router.add_route("*", "/bot{token}/{method}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOST_", "TELEGRAM_"))}
    env.update(TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_BASE=f"http://127.0.0.1:{port}",
               ANTHROPIC_API_KEY=API_KEY, ROOST_DATA_DIR=str(tmp_path / "data"),
               ROOST_LOG_LEVEL="DEBUG", ROOST_LOAD_PLUGINS="")
    proc = await spawn(["run"], cwd=Path.cwd(), env=env, stdout=asyncio.subprocess.PIPE,
                       stderr=asyncio.subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        seen = b""
        async with asyncio.timeout(30):
            while b"getUpdates" not in seen:
                line = await proc.stdout.readline()
                assert line, f"roost run ended early:\n{seen.decode()}"
                seen += line
        proc.send_signal(signal.SIGTERM)
        rest, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await runner.cleanup()
    output = (seen + rest).decode()
    assert "bot********/getUpdates" in output
    assert TOKEN not in output and TOKEN.split(":")[1] not in output
    assert API_KEY not in output
