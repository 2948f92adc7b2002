"""The health and metrics server: /healthz, /readyz and /metrics scraped over HTTP.

A real Telegram channel polls the fake Bot API: readiness follows its
``getUpdates`` (503 with a line saying so while they fail, 200 again after the
next success) and the store's ability to take a write. ``roost status`` reads
/readyz of the running server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from bot.app.cli import cli
from bot.app.http import HealthServer
from bot.app.roost import Roost
from bot.config.settings import SetupError
from bot.contracts.channel import Channel, ChannelHealth
from bot.testing.app import ChatChannel, create_app, scripted
from bot.testing.discord import FakeDiscord
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.slack import FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from bot.testing.telegram import FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy
from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel

FAST = DeliveryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)

Scrape = Callable[[str], Awaitable[tuple[int, str]]]


@pytest.fixture(name="scrape")
async def scrape_fixture() -> AsyncIterator[Scrape]:
    """``await scrape(url)``: (status, body) of one GET."""
    async with aiohttp.ClientSession() as session:
        async def get(url: str) -> tuple[int, str]:
            async with session.get(url) as response:
                return response.status, await response.text()

        yield get


async def until(scrape: Scrape, url: str, check: Callable[[int, str], bool],
                limit: float = 10.0) -> tuple[int, str]:
    """Scrape ``url`` until ``check(status, body)`` holds; fails after ``limit`` seconds."""
    last: tuple[int, str] = (0, "")
    try:
        async with asyncio.timeout(limit):
            while True:
                last = await scrape(url)
                if check(*last):
                    return last
                await asyncio.sleep(0.01)  # pacing only; the condition is what is awaited
    except TimeoutError:
        pytest.fail(f"{url} never matched; last answer {last}")


@pytest.fixture(name="app")
async def app_fixture(tmp_path: Path) -> AsyncIterator[Roost]:
    app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=tmp_path)
    yield app
    await app.close()


async def serve(app: Roost, **options: Any) -> HealthServer:
    server = HealthServer(app, "127.0.0.1", 0, **options)
    await server.start()
    app.http = server  # app.close() stops it
    return server


async def test_healthz_answers_while_readyz_waits_for_an_expected_channel(
        app: Roost, scrape: Scrape) -> None:
    server = await serve(app, expected=["telegram"])
    assert await scrape(f"{server.url}/healthz") == (200, "ok\n")
    assert await scrape(f"{server.url}/readyz") == (503, "telegram: not started\n")


async def test_readyz_follows_telegram_polling_503_while_getupdates_fails_then_200(
        app: Roost, scrape: Scrape, fake_telegram: FakeTelegram) -> None:
    settings = app.settings.model_copy(update={
        "telegram_bot_token": SecretStr(fake_telegram.token),
        "telegram_api_base": fake_telegram.base_url})
    server = await serve(app, expected=["telegram"])
    channel = TelegramChannel(settings, polling_timeout=1, policy=FAST, poll_backoff=0.2)
    assert channel.health() == ChannelHealth(False, "connecting")
    await app.add_channel(channel)
    readyz = f"{server.url}/readyz"
    assert await until(scrape, readyz, lambda s, _: s == 200) == (200, "ready\n")

    fake_telegram.fail("getUpdates", 502, times=2)
    _, body = await until(scrape, readyz, lambda s, _: s == 503)
    assert body == "telegram: getUpdates failing (server error: Bad Gateway)\n"
    assert fake_telegram.token not in body
    assert (await scrape(f"{server.url}/healthz"))[0] == 200  # alive all the same

    await until(scrape, readyz, lambda s, _: s == 200)
    # It recovered by polling again: every scripted failure was used up first.
    failed = [c for c in fake_telegram.calls_of("getUpdates") if c.status == 502]
    assert len(failed) == 2


async def test_readyz_reports_a_store_that_takes_no_write_and_recovers(
        app: Roost, scrape: Scrape) -> None:
    server = await serve(app, store_timeout=0.05)
    readyz = f"{server.url}/readyz"
    assert await scrape(readyz) == (200, "ready\n")
    async with app.store.lock:  # a write that never ends, as a wedged disk would
        assert await scrape(readyz) == (503, "store: no write within 0.05s\n")
    assert await scrape(readyz) == (200, "ready\n")


async def test_readyz_lists_every_failing_part_one_line_each(
        app: Roost, scrape: Scrape) -> None:
    class Down(ChatChannel):
        def health(self) -> ChannelHealth:
            return ChannelHealth(False, "socket closed (code 1006)")

    await app.add_channel(Down("slack"))
    await app.add_channel(ChatChannel("console"))
    server = await serve(app, expected=["discord"])
    status, body = await scrape(f"{server.url}/readyz")
    assert status == 503
    assert body.splitlines() == ["discord: not started", "slack: socket closed (code 1006)"]


async def test_readyz_says_shutting_down_once_close_begins(
        app: Roost, scrape: Scrape) -> None:
    server = await serve(app)
    server.begin_shutdown()
    assert await scrape(f"{server.url}/readyz") == (503, "roost: shutting down\n")


async def test_a_port_in_use_is_a_setup_error_naming_it(app: Roost) -> None:
    first = await serve(app)
    second = HealthServer(app, "127.0.0.1", first.port)
    with pytest.raises(SetupError, match=rf"127\.0\.0\.1:{first.port}.*ROOST_HTTP_PORT"):
        await second.start()


async def test_serve_http_is_off_without_a_port_and_on_with_one(tmp_path: Path) -> None:
    off, _ = await create_app(scripted({"reply": "hi"}), data_dir=tmp_path / "off")
    try:
        assert await off.serve_http() is None
    finally:
        await off.close()
    on, _ = await create_app(scripted({"reply": "hi"}), data_dir=tmp_path / "on",
                             http_port=_free_port())
    try:
        server = await on.serve_http()
        assert server is not None and server.port == on.settings.http_port
    finally:
        await on.close()
    assert on.http is not None and on.http.closing


# -- roost status ----------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def roost_status(port: int | None, tmp_path: Path) -> tuple[int, str]:
    env = {"ROOST_DATA_DIR": str(tmp_path), "ROOST_HTTP_HOST": "127.0.0.1",
           "ROOST_HTTP_PORT": "" if port is None else str(port)}
    # click's runner is synchronous and `roost status` makes a blocking request.
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["status"], env=env,
                                     obj={})
    return result.exit_code, result.output


async def test_roost_status_prints_readyz_and_exits_0_when_ready(
        app: Roost, tmp_path: Path) -> None:
    server = await serve(app)
    assert await roost_status(server.port, tmp_path) == (0, "ready\n")


async def test_roost_status_exits_1_with_the_failing_parts_when_not_ready(
        app: Roost, tmp_path: Path) -> None:
    server = await serve(app, expected=["telegram"])
    code, output = await roost_status(server.port, tmp_path)
    assert (code, output) == (1, "not ready:\ntelegram: not started\n")


async def test_roost_status_exits_2_when_nothing_answers_or_no_port_is_set(
        tmp_path: Path) -> None:
    port = _free_port()  # closed again: nothing listens there
    code, output = await roost_status(port, tmp_path)
    assert code == 2 and f"cannot reach 127.0.0.1:{port}" in output
    code, output = await roost_status(None, tmp_path)
    assert code == 2 and "ROOST_HTTP_PORT" in output


# -- Discord and Slack readiness -------------------------------------------------------


async def health_until(channel: Channel, ready: bool, limit: float = 20.0) -> ChannelHealth:
    """Poll ``channel.health()`` until its ``ready`` is ``ready``."""
    try:
        async with asyncio.timeout(limit):
            while True:
                health = channel.health()
                if health.ready is ready:
                    return health
                await asyncio.sleep(0.01)  # pacing only; the condition is what is awaited
    except TimeoutError:
        pytest.fail(f"{channel.name} never became ready={ready}: {channel.health()}")


@pytest.mark.slow
async def test_discord_is_ready_on_ready_and_not_from_a_dropped_session_until_ready_again(
        tmp_path: Path, scrape: Scrape, fake_discord: FakeDiscord) -> None:
    app, _ = await create_app(scripted({"reply": "hi"}), data_dir=tmp_path,
                              **fake_discord.settings())
    try:
        server = await serve(app, expected=["discord"])
        channel = DiscordChannel(app.settings, guild_ready_timeout=0.05)
        assert channel.health() == ChannelHealth(False, "connecting")
        await app.add_channel(channel)  # returns once READY came
        assert await scrape(f"{server.url}/readyz") == (200, "ready\n")
        await fake_discord.invalidate_session()  # the session cannot be resumed
        down = await health_until(channel, False)
        assert down.detail == "gateway disconnected; reconnecting"
        assert await scrape(f"{server.url}/readyz") == (
            503, "discord: gateway disconnected; reconnecting\n")
        # discord.py waits 5 s before IDENTIFYing again (Discord's identify limit).
        await fake_discord.wait_identified(count=2, limit=20)
        await health_until(channel, True)
    finally:
        await app.close()


@pytest.mark.parametrize("socket_mode", [False, True], ids=["events-api", "socket-mode"])
async def test_slack_is_ready_once_auth_test_passed_and_it_listens_or_is_connected(
        tmp_path: Path, scrape: Scrape, fake_slack: FakeSlack, socket_mode: bool) -> None:
    app, _ = await create_app(scripted({"reply": "hi"}), data_dir=tmp_path,
                              **fake_slack.settings(socket_mode=socket_mode))
    try:
        server = await serve(app, expected=["slack"])
        channel = SlackChannel(app.settings, host="127.0.0.1")
        assert channel.health() == ChannelHealth(False, "connecting")
        await app.add_channel(channel)
        assert [c.method for c in fake_slack.calls][:1] == ["auth.test"]
        assert await scrape(f"{server.url}/readyz") == (200, "ready\n")
        await channel.stop()
        assert channel.health() == ChannelHealth(False, "stopped")
    finally:
        await app.close()



# -- roost run -------------------------------------------------------------------------


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.e2e
def test_roost_run_serves_health_readiness_and_metrics_and_roost_status_reads_them(
        tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import time

    from tests.cli_forks import run_roost
    from tests.roost_forks import popen

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(PYTHONUNBUFFERED="1", ROOST_PROVIDER="scripted", ROOST_CONSOLE="1",
               ROOST_HTTP_PORT=str(port))
    proc = popen(["run"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        lines: list[str] = []
        while "roost ready" not in (line := proc.stderr.readline()):
            lines.append(line)
            assert line and time.monotonic() < deadline, f"never ready: {lines}"
        assert any(f"health and metrics on http://127.0.0.1:{port}" in x for x in lines)
        base = f"http://127.0.0.1:{port}"
        assert _get(f"{base}/healthz") == (200, "ok\n")
        assert _get(f"{base}/readyz") == (200, "ready\n")
        status, metrics = _get(f"{base}/metrics")
        assert status == 200 and "roost_queue_depth 0.0" in metrics
        checked = run_roost(["status"], cwd=tmp_path, env=env, timeout=30)
        assert (checked.returncode, checked.stdout) == (0, "ready\n")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        gone = run_roost(["status"], cwd=tmp_path, env=env, timeout=30)
        assert gone.returncode == 2 and "cannot reach" in gone.stderr
    finally:
        if proc.poll() is None:
            proc.kill()


# -- webhooks on the same server --------------------------------------------------------


async def test_slack_events_share_the_server_when_slack_port_is_the_http_port(
        tmp_path: Path, scrape: Scrape, fake_slack: FakeSlack) -> None:
    port = _free_port()
    app, _ = await create_app(scripted({"reply": "over the shared port"}, loop=True),
                              data_dir=tmp_path, **fake_slack.settings(port=port))
    try:
        server = HealthServer(app, "127.0.0.1", port)
        await server.start()
        app.http = server
        channel = SlackChannel(app.settings, host="127.0.0.1")
        await app.add_channel(channel)
        assert channel.events_url == f"{server.url}/slack/events"
        fake_slack.events_url = channel.events_url
        delivery = await fake_slack.post_event(fake_slack.direct_message("hello"))
        assert delivery.status == 200
        await fake_slack.wait_for("chat.postMessage")
        assert [m.text for m in fake_slack.visible()] == ["over the shared port"]
        assert await scrape(f"{server.url}/readyz") == (200, "ready\n")
        forged = await fake_slack.post_event(fake_slack.direct_message("x"), forge=True)
        assert forged.status == 401  # the channel's own checks run on the shared server
        await channel.stop()
        gone = await fake_slack.post_event(fake_slack.direct_message("late"))
        assert gone.status == 404
        assert await scrape(f"{server.url}/healthz") == (200, "ok\n")
    finally:
        await app.close()


async def test_the_telegram_webhook_shares_the_server_when_its_port_is_the_http_port(
        tmp_path: Path, scrape: Scrape, fake_telegram: FakeTelegram) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/telegram/hook"
    app, _ = await create_app(
        scripted({"reply": "webhook answer"}, loop=True), data_dir=tmp_path,
        telegram_bot_token=fake_telegram.token, telegram_api_base=fake_telegram.base_url,
        telegram_webhook_url=url, telegram_webhook_port=port,
        telegram_webhook_secret="s3cret")
    try:
        server = HealthServer(app, "127.0.0.1", port)
        await server.start()
        app.http = server
        channel = TelegramChannel(app.settings, policy=FAST)
        await app.add_channel(channel)
        assert channel.health().ready and channel.polling is None  # webhook, not polling
        update = fake_telegram.private_message("via the shared port")
        uid = update["update_id"]
        await fake_telegram.wait_until(lambda: (uid, 200) in fake_telegram.webhook_attempts)
        await fake_telegram.wait_for("sendMessage")
        assert fake_telegram.sent_texts() == ["webhook answer"]
        assert await scrape(f"{server.url}/readyz") == (200, "ready\n")
        async with aiohttp.ClientSession() as client, client.post(url, data=b"{}") as resp:
            assert resp.status == 401  # no secret token header
    finally:
        await app.close()


async def test_a_telegram_token_refused_while_polling_leaves_it_not_ready_for_good(
        app: Roost, fake_telegram: FakeTelegram) -> None:
    settings = app.settings.model_copy(update={
        "telegram_bot_token": SecretStr(fake_telegram.token),
        "telegram_api_base": fake_telegram.base_url})
    channel = TelegramChannel(settings, polling_timeout=1, policy=FAST, poll_backoff=0.01)
    fake_telegram.fail("getUpdates", 401)  # the token was revoked after getMe
    await app.add_channel(channel)
    assert channel.polling is not None
    await asyncio.wait_for(channel.polling, 10)  # polling stops: retrying cannot help
    assert channel.health() == ChannelHealth(False, "the bot token was refused; polling "
                                                    "stopped")
