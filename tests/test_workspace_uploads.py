"""send_file uploads what it opened: a file (or its directory) swapped for a link to
outside after the tool opened it never changes what reaches the platform.

Real channels (aiogram, discord.py, slack_sdk) against the fake platforms; the swap
happens between the tool's open and the channel's upload, where a model's ``exec``
loop could put it. The file is 11 MB: past Telegram's photo limit, so it streams.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.config.settings import Settings
from bot.contracts.media import MediaError
from bot.contracts.messages import OutboundFile, OutboundMessage
from bot.contracts.tools import SendFunc, ToolContext
from bot.testing.discord import DM_CHANNEL_ID, FakeDiscord
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.slack import CHANNEL, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from bot.testing.telegram import ALICE, FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy
from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from plugins import media_tools
from tests.test_telegram_intake import Inbox, StartTg
from tests.test_telegram_intake import start_tg as _start_tg  # noqa: F401  (the fixture)

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
SIZE = 11 * 1024 * 1024
INSIDE = b"inside " * (SIZE // 7)
SECRET = b"OUTSIDE-SECRET " * (SIZE // 15)


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    for root, data in ((ws, INSIDE), (outside, SECRET)):
        (root / "d").mkdir(parents=True)
        (root / "big.bin").write_bytes(data)
        (root / "d" / "big.bin").write_bytes(data)
    return ws, outside


def swap_then(send: SendFunc, ws: Path, outside: Path, path: str) -> SendFunc:
    """``send``, after ``path``'s first component became a link to outside."""
    async def swapped(message: OutboundMessage) -> str | None:
        first = ws / path.split("/")[0]
        if first.is_dir():
            shutil.rmtree(first)
        else:
            first.unlink()
        first.symlink_to(outside / path.split("/")[0])
        return await send(message)
    return swapped


async def send_file(ws: Path, channel: str, chat: str, send: SendFunc, path: str) -> str:
    [tool] = media_tools.roost_tools(Settings())
    ctx = ToolContext(user_id=chat, channel=channel, chat_id=chat, session_key="s",
                      run_id="r", workspace=ws, deadline=time.monotonic() + 120, send=send)
    return str(await tool.execute(ctx, {"path": path}))


PATHS = pytest.mark.parametrize("path", ["big.bin", "d/big.bin"])


@PATHS
async def test_telegram_uploads_the_file_send_file_opened(
        places: tuple[Path, Path], start_tg: StartTg, fake_telegram: FakeTelegram,
        path: str) -> None:
    ws, outside = places
    channel = await start_tg(Inbox())
    result = await send_file(ws, "telegram", str(ALICE["id"]),
                             swap_then(channel.send, ws, outside, path), path)
    assert result.startswith(f"Sent {path} (11.0 MB")
    [upload] = fake_telegram.uploads
    assert upload.method == "document"
    assert upload.data == INSIDE


@pytest.fixture
async def discord_channel(fake_discord: FakeDiscord) -> AsyncIterator[DiscordChannel]:
    fake_discord.upload_limit = 25 * 1024 * 1024  # a boosted server
    channel = DiscordChannel(Settings(**fake_discord.settings(), discord_max_upload_mb=25),
                             guild_ready_timeout=0.05, delivery=FAST)
    await channel.start(Inbox())
    yield channel
    await channel.stop()


@PATHS
async def test_discord_uploads_the_file_send_file_opened(
        places: tuple[Path, Path], discord_channel: DiscordChannel, fake_discord: FakeDiscord,
        path: str) -> None:
    ws, outside = places
    await send_file(ws, "discord", str(DM_CHANNEL_ID),
                    swap_then(discord_channel.send, ws, outside, path), path)
    [message] = fake_discord.posted(DM_CHANNEL_ID)
    [uploaded] = message.files
    assert uploaded.data == INSIDE


@pytest.fixture
async def slack_channel(fake_slack: FakeSlack) -> AsyncIterator[SlackChannel]:
    channel = SlackChannel(Settings(**fake_slack.settings()), host="127.0.0.1", policy=FAST)
    await channel.start(Inbox())
    fake_slack.events_url = channel.events_url
    yield channel
    await channel.stop()


@PATHS
async def test_slack_uploads_the_file_send_file_opened(
        places: tuple[Path, Path], slack_channel: SlackChannel, fake_slack: FakeSlack,
        path: str) -> None:
    ws, outside = places
    await send_file(ws, "slack", CHANNEL, swap_then(slack_channel.send, ws, outside, path),
                    path)
    [shared] = fake_slack.shared
    assert shared.data == INSIDE


async def test_a_file_given_by_path_alone_is_opened_once_and_never_through_a_link(
        places: tuple[Path, Path], start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    """A plugin's OutboundFile without ``source``: the channel opens the path once, a link
    as its last name refused, and uploads from that descriptor."""
    ws, outside = places
    (ws / "planted.bin").symlink_to(outside / "big.bin")
    channel = await start_tg(Inbox())
    chat = str(ALICE["id"])
    with pytest.raises(MediaError, match=r"planted\.bin"):
        await channel.send(OutboundMessage(channel="telegram", chat_id=chat, text="", files=(
            OutboundFile(str(ws / "planted.bin"), "planted.bin", "", SIZE),)))
    await channel.send(OutboundMessage(channel="telegram", chat_id=chat, text="", files=(
        OutboundFile(str(ws / "big.bin"), "big.bin", "", SIZE),)))
    [upload] = fake_telegram.uploads
    assert upload.data == INSIDE
