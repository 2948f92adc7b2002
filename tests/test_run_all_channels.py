"""`roost run` serves Telegram, Discord and Slack at once, in one process."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

import pytest

from bot.testing.discord import FakeDiscord
from bot.testing.slack import FakeSlack
from bot.testing.telegram import FakeTelegram
from tests.roost_processes import start_roost, until_logged
from tests.test_cli import clean_env

SCRIPT = "turns:\n  - reply: 'hello from roost'\nloop: true\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.e2e
async def test_roost_run_answers_on_every_configured_platform(
    tmp_path: Path, fake_telegram: FakeTelegram, fake_discord: FakeDiscord,
    fake_slack: FakeSlack,
) -> None:
    (tmp_path / "script.yaml").write_text(SCRIPT)
    port = free_port()
    env = clean_env(
        ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(tmp_path / "script.yaml"),
        ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
        TELEGRAM_BOT_TOKEN=fake_telegram.token, TELEGRAM_API_BASE=fake_telegram.base_url,
        DISCORD_BOT_TOKEN=fake_discord.token, DISCORD_API_BASE=fake_discord.api_base,
        DISCORD_GATEWAY_URL=fake_discord.gateway_url,
        SLACK_BOT_TOKEN=fake_slack.bot_token, SLACK_SIGNING_SECRET=fake_slack.signing_secret,
        SLACK_API_BASE=fake_slack.base_url, ROOST_SLACK_PORT=str(port),
    )
    proc = await start_roost(tmp_path, env, fork=False)  # exec'd: the real entry path
    try:
        line = (await until_logged(proc, b"roost ready"))[-1]
        assert b"channels=telegram,discord,slack" in line

        fake_telegram.private_message("hi telegram")
        (sent,) = await fake_telegram.wait_for("sendMessage", limit=10)
        assert sent.params["text"] == "hello from roost"

        await fake_discord.dm("hi discord")
        await fake_discord.wait_for_call("POST", "/messages", limit=10)
        assert "hello from roost" in fake_discord.visible()

        fake_slack.events_url = f"http://127.0.0.1:{port}/slack/events"
        await fake_slack.post_event(fake_slack.direct_message("hi slack"))
        (posted,) = await fake_slack.wait_for("chat.postMessage", limit=10)
        assert posted.params["text"] == "hello from roost"

        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert (tmp_path / "data" / "roost.db").stat().st_size > 0
