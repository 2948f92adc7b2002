"""Discord files: attachments in (CDN download) and uploads out, real discord.py against the fake.

The fake serves attachment URLs signed and expiring like Discord's CDN and
takes multipart message creation as the API does (10 MiB, 413/40005 beyond).
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import OutboundFile, OutboundMessage
from bot.testing.app import scripted, settle
from bot.testing.discord import CHANNEL_ID, DM_CHANNEL_ID, USER_ID, FakeDiscord
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.inbox import RecordingInbox as Inbox
from channels.delivery import DeliveryPolicy
from channels.discord import DiscordChannel
from plugins.scripted_provider import ScriptedProvider
from tests.conftest import AppFactory
from workspaces import workspace_dir

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
MB = 1024 * 1024

Start = Callable[..., Awaitable[tuple[DiscordChannel, Inbox]]]


@pytest.fixture
async def start(fake_discord: FakeDiscord) -> AsyncIterator[Start]:
    channels: list[DiscordChannel] = []

    async def factory(**settings: object) -> tuple[DiscordChannel, Inbox]:
        inbox = Inbox()
        channel = DiscordChannel(Settings(**fake_discord.settings(), **settings),
                                 guild_ready_timeout=0.05, delivery=FAST)
        await channel.start(inbox)
        channels.append(channel)
        return channel, inbox

    yield factory
    for channel in channels:
        await channel.stop()


def png(width: int = 64, height: int = 48) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def a_file(tmp_path: Path, name: str, data: bytes, caption: str = "") -> OutboundFile:
    path = tmp_path / name
    path.write_bytes(data)
    return OutboundFile(path=str(path), name=name, mime_type="application/octet-stream",
                        size=len(data), caption=caption)


# -- inbound -----------------------------------------------------------------------------


async def test_an_image_with_text_arrives_as_a_photo_and_downloads_byte_for_byte(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel, inbox = await start()
    data = png(640, 480)
    attachment = fake_discord.attachment(data, "receipt.png", "image/png", width=640,
                                         height=480, channel_id=DM_CHANNEL_ID)
    await fake_discord.dm("what is the total?", attachments=[attachment])
    [message] = await inbox.wait_for(1)

    assert message.text == "what is the total?"
    [received] = message.attachments
    assert (received.kind, received.name, received.mime_type) == ("photo", "receipt.png",
                                                                  "image/png")
    assert (received.size, received.width, received.height) == (len(data), 640, 480)
    assert received.url == attachment["url"]
    assert await channel.download(received, 20 * MB) == data
    # The CDN wants no token, and gets none.
    [(_, headers, status)] = fake_discord.cdn_requests
    assert status == 200 and "Authorization" not in headers


async def test_a_file_sent_while_roost_was_away_arrives_with_the_catch_up(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel, inbox = await start()
    data = png(32, 32)
    missed = fake_discord.message_payload("while you were out", channel_id=DM_CHANNEL_ID,
                                          guild=False, attachments=[fake_discord.attachment(
                                              data, "m.png", "image/png",
                                              channel_id=DM_CHANNEL_ID)])
    fake_discord.user_messages[int(missed["id"])] = missed  # in the history, never dispatched
    await channel.catch_up({str(DM_CHANNEL_ID): str(int(missed["id"]) - 1)})
    [message] = await inbox.wait_for(1)
    assert message.text == "while you were out"
    assert await channel.download(message.attachments[0], MB) == data


async def test_a_message_with_only_a_file_is_a_message(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel, inbox = await start()
    pdf = b"%PDF-1.4\n" + b"x" * 5000 + b"\n%%EOF\n"
    await fake_discord.dm("", attachments=[fake_discord.attachment(
        pdf, "scan.pdf", "application/pdf", channel_id=DM_CHANNEL_ID)])
    [message] = await inbox.wait_for(1)
    assert message.text == ""
    [received] = message.attachments
    assert (received.kind, received.name, received.size) == ("document", "scan.pdf", len(pdf))
    assert await channel.download(received, len(pdf)) == pdf


async def test_a_voice_message_is_voice_with_its_duration(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    _, inbox = await start()
    await fake_discord.dm("", attachments=[fake_discord.attachment(
        b"OggS" + b"\0" * 400, "voice-message.ogg", "audio/ogg", voice_seconds=12.5,
        channel_id=DM_CHANNEL_ID)])
    [message] = await inbox.wait_for(1)
    [received] = message.attachments
    assert (received.kind, received.duration, received.mime_type) == ("voice", 12.5,
                                                                      "audio/ogg")


async def test_a_guild_message_keeps_every_attachment_in_order(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    _, inbox = await start()
    files = [fake_discord.attachment(b"a" * 10, "a.txt", "text/plain; charset=utf-8"),
             fake_discord.attachment(b"b" * 20, "clip.mp4", "video/mp4"),
             fake_discord.attachment(b"c" * 30, "blob")]
    await fake_discord.guild_message("look", mention=True, attachments=files)
    [message] = await inbox.wait_for(1)
    assert [(a.kind, a.name, a.mime_type, a.size) for a in message.attachments] == [
        ("document", "a.txt", "text/plain", 10), ("video", "clip.mp4", "video/mp4", 20),
        ("file", "blob", "", 30)]


async def test_a_file_over_the_limit_is_refused_without_reading_it_whole(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel, inbox = await start()
    data = b"z" * 300_000
    declared = fake_discord.attachment(data, "big.bin", "application/octet-stream",
                                       channel_id=DM_CHANNEL_ID)
    chunked = fake_discord.attachment(data, "big2.bin", "application/octet-stream",
                                      channel_id=DM_CHANNEL_ID, chunked=True, size=10)
    await fake_discord.dm("two big ones", attachments=[declared, chunked])
    [message] = await inbox.wait_for(1)
    first, second = message.attachments

    with pytest.raises(MediaTooLarge) as by_header:
        await channel.download(first, 100_000)
    assert by_header.value.size == len(data) and by_header.value.limit == 100_000
    # No Content-Length and a size that lies: the reading stops one byte past the limit.
    with pytest.raises(MediaTooLarge) as by_reading:
        await channel.download(second, 100_000)
    assert by_reading.value.size == 100_001
    assert await channel.download(second, len(data)) == data


@pytest.mark.parametrize(("fault", "reason"), [
    ("expired", "Discord no longer serves note.txt (HTTP 404"),
    (500, "downloading note.txt from Discord failed (HTTP 500)"),
    ("reset", "downloading note.txt from Discord failed (ServerDisconnectedError"),
])
async def test_a_download_that_fails_is_one_media_error_and_the_text_stays(
    fake_discord: FakeDiscord, start: Start, fault: object, reason: str,
) -> None:
    channel, inbox = await start()
    attachment = fake_discord.attachment(b"data", "note.txt", "text/plain",
                                         channel_id=DM_CHANNEL_ID)
    await fake_discord.dm("read this", attachments=[attachment])
    [message] = await inbox.wait_for(1)
    if fault == "expired":
        fake_discord.expire(attachment["url"])
    else:
        # Past every retry (aiohttp itself tries a GET again after some resets).
        fake_discord.fail_cdn(fault, count=20)  # type: ignore[arg-type]
    with pytest.raises(MediaError) as failed:
        await channel.download(message.attachments[0], MB)
    assert reason in str(failed.value) and "\n" not in str(failed.value)
    assert not isinstance(failed.value, MediaTooLarge)
    assert message.text == "read this"


async def test_a_download_failing_once_is_retried(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel, inbox = await start()
    await fake_discord.dm("read this", attachments=[fake_discord.attachment(
        b"data", "note.txt", "text/plain", channel_id=DM_CHANNEL_ID)])
    [message] = await inbox.wait_for(1)
    fake_discord.fail_cdn(503)
    assert await channel.download(message.attachments[0], MB) == b"data"
    assert [status for _, _, status in fake_discord.cdn_requests] == [503, 200]


async def test_an_attachment_without_a_link_is_a_media_error(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel, inbox = await start()
    attachment = fake_discord.attachment(b"data", "x.bin", channel_id=DM_CHANNEL_ID)
    await fake_discord.dm("hi", attachments=[{**attachment, "url": "file:///etc/passwd"}])
    [message] = await inbox.wait_for(1)
    with pytest.raises(MediaError, match="no Discord download link"):
        await channel.download(message.attachments[0], MB)
    assert not fake_discord.cdn_requests


# -- outbound ----------------------------------------------------------------------------


async def test_a_reply_with_a_file_posts_the_text_then_uploads_the_file(
    fake_discord: FakeDiscord, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    data = png(300, 200)
    last = await channel.send(OutboundMessage(
        channel="discord", chat_id=str(DM_CHANNEL_ID), text="here is your chart",
        files=(a_file(tmp_path, "chart.png", data, caption="Sales, **2026**"),)))

    text, upload = fake_discord.posted(DM_CHANNEL_ID)
    assert text.content == "here is your chart" and not text.files
    assert upload.content == "Sales, **2026**"
    [uploaded] = upload.files
    assert (uploaded.filename, uploaded.data) == ("chart.png", data)
    assert last == str(upload.id)
    # What Discord now serves for the upload is the same file.
    served = fake_discord.posted(DM_CHANNEL_ID)[-1].files[0].url
    assert served.startswith("http://127.0.0.1:")


async def test_a_file_alone_in_a_group_replies_to_the_message(
    fake_discord: FakeDiscord, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    await channel.send(OutboundMessage(
        channel="discord", chat_id=str(CHANNEL_ID), text="", chat_type="group", reply_to="77",
        files=(a_file(tmp_path, "a.txt", b"one"), a_file(tmp_path, "b.txt", b"two"))))
    first, second = fake_discord.posted(CHANNEL_ID)
    assert [f.data for f in first.files + second.files] == [b"one", b"two"]
    assert first.reference is not None and first.reference["message_id"] == 77
    assert second.reference is None


async def test_a_file_over_the_upload_limit_is_refused_before_anything_is_posted(
    fake_discord: FakeDiscord, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    big = a_file(tmp_path, "video.mp4", b"\0" * (10 * MB + 1))
    with pytest.raises(MediaTooLarge, match=r"video\.mp4 is 10\.0 MB; Discord takes files "
                                            r"up to 10 MB") as refused:
        await channel.send(OutboundMessage(channel="discord", chat_id=str(DM_CHANNEL_ID),
                                           text="the video", files=(big,)))
    assert refused.value.limit == 10 * MB
    assert not fake_discord.posted()
    assert not fake_discord.calls_to("POST", r"/messages$")


async def test_a_file_discord_refuses_as_too_large_is_media_too_large(
    fake_discord: FakeDiscord, start: Start, tmp_path: Path,
) -> None:
    # Configured for a boosted server, but this one takes 10 MiB: Discord answers 413.
    channel, _ = await start(discord_max_upload_mb=25)
    big = a_file(tmp_path, "scan.pdf", b"%" * (11 * MB))
    with pytest.raises(MediaTooLarge, match="Discord refused it as too large"):
        await channel.send(OutboundMessage(channel="discord", chat_id=str(DM_CHANNEL_ID),
                                           text="", files=(big,)))
    [call] = fake_discord.calls_to("POST", r"/messages$")
    assert call.status == 413
    assert not fake_discord.posted()


async def test_an_upload_whose_answer_was_lost_is_not_posted_twice(
    fake_discord: FakeDiscord, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    fake_discord.inject("reset_after", method="POST", path=r"/messages$")
    await channel.send(OutboundMessage(
        channel="discord", chat_id=str(DM_CHANNEL_ID), text="", delivery_id="roost-41",
        files=(a_file(tmp_path, "report.csv", b"a,b\n1,2\n"),)))
    [posted] = fake_discord.posted(DM_CHANNEL_ID)
    assert posted.files[0].data == b"a,b\n1,2\n"
    assert len(fake_discord.calls_to("POST", r"/messages$")) == 2


async def test_a_missing_file_is_a_media_error(
    fake_discord: FakeDiscord, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    gone = OutboundFile(path=str(tmp_path / "gone.txt"), name="gone.txt",
                        mime_type="text/plain", size=3)
    with pytest.raises(MediaError, match=r"cannot read gone\.txt"):
        await channel.send(OutboundMessage(channel="discord", chat_id=str(DM_CHANNEL_ID),
                                           text="x", files=(gone,)))
    assert not fake_discord.posted()


# -- through a running Roost ---------------------------------------------------------------


async def roost(make_app: AppFactory, fake: FakeDiscord, *turns: dict[str, Any],
                **settings: Any) -> tuple[Roost, ScriptedProvider, Path]:
    """A Roost with the real Discord channel; its provider and Alice's workspace."""
    provider = scripted(*turns)
    app, _, _ = await make_app(provider, **fake.settings(), **settings)
    await app.add_channel(DiscordChannel(app.settings, guild_ready_timeout=0.05, delivery=FAST))
    return app, provider, workspace_dir(app.settings.workspaces_dir, "discord", str(USER_ID))


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


async def answered(app: Roost, fake: FakeDiscord, text: str) -> None:
    await fake.wait_for_call("POST", r"/messages$")
    await settle(app)
    assert text in fake.visible()


async def test_a_photo_with_text_reaches_the_run_stored_byte_for_byte(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, provider, workspace = await roost(make_app, fake_discord, {"reply": "a red receipt"})
    data = png(640, 480)
    await fake_discord.dm("what is the total?", attachments=[fake_discord.attachment(
        data, "receipt.png", "image/png", width=640, height=480, channel_id=DM_CHANNEL_ID)])
    await answered(app, fake_discord, "a red receipt")

    user = provider.requests[-1].messages[-1]
    path = f"inbox/{today()}/receipt.png"
    assert user.content.startswith(f"what is the total?\n\n[photo: {path}, 640×480")
    [part] = user.parts
    assert (part.kind, part.path, part.mime_type) == ("image", path, "image/png")
    assert (workspace / path).read_bytes() == data


async def test_a_photo_without_text_is_a_run_of_its_own(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, provider, _ = await roost(make_app, fake_discord, {"reply": "a red square"})
    await fake_discord.dm("", attachments=[fake_discord.attachment(
        png(), "image.png", "image/png", channel_id=DM_CHANNEL_ID)])
    await answered(app, fake_discord, "a red square")
    [part] = provider.requests[-1].messages[-1].parts
    assert part.kind == "image"


async def test_an_oversize_file_is_refused_in_the_chat_and_the_text_still_runs(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, provider, workspace = await roost(make_app, fake_discord, {"reply": "noted"},
                                           media_max_file_mb=1)
    await fake_discord.dm("please summarize", attachments=[fake_discord.attachment(
        b"%PDF-1.4".ljust(3 * MB, b"\0"), "bigscan.pdf", "application/pdf",
        channel_id=DM_CHANNEL_ID)])
    await answered(app, fake_discord, "noted")
    assert "bigscan.pdf is 3 MB; files over 1 MB are not accepted" in fake_discord.visible()
    assert not fake_discord.cdn_requests  # refused on the declared size
    assert provider.requests[-1].messages[-1].content.startswith("please summarize")
    assert not (workspace / "inbox").exists()


async def test_a_download_failure_keeps_the_text(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, provider, _ = await roost(make_app, fake_discord, {"reply": "answered"})
    attachment = fake_discord.attachment(png(), "gone.png", "image/png",
                                         channel_id=DM_CHANNEL_ID)
    fake_discord.expire(attachment["url"])
    await fake_discord.dm("and this?", attachments=[attachment])
    await answered(app, fake_discord, "answered")
    [notice] = [t for t in fake_discord.visible() if t != "answered"]
    assert notice.startswith("I could not fetch gone.png: Discord no longer serves gone.png")
    user = provider.requests[-1].messages[-1]
    assert user.content.startswith("and this?") and not user.parts


async def test_send_file_uploads_a_workspace_file_to_the_chat(
    fake_discord: FakeDiscord, make_app: AppFactory,
) -> None:
    app, _, workspace = await roost(make_app, fake_discord, {"steps": [
        {"tool_calls": [{"name": "send_file",
                         "arguments": {"path": "charts/sales.png", "caption": "Sales"}}]},
        {"reply": "done"}]})
    chart = workspace / "charts" / "sales.png"
    chart.parent.mkdir(parents=True)
    chart.write_bytes(data := png(300, 200))
    await fake_discord.dm("send me the chart")
    await fake_discord.wait_for_call("POST", r"/messages$", count=2)
    await settle(app)
    [upload] = [m for m in fake_discord.posted(DM_CHANNEL_ID) if m.files]
    assert upload.content == "Sales"
    assert [(f.filename, f.data) for f in upload.files] == [("sales.png", data)]
    assert "done" in fake_discord.visible()
