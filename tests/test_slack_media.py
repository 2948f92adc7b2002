"""Slack files: ``files`` on messages in (``url_private`` with the bot token) and uploads out.

The real slack-bolt / slack_sdk against the fake Slack, which serves
``url_private`` only to the bot token with ``files:read`` (a 302 to its login
page otherwise, as Slack does) and implements the upload flow
(``files.getUploadURLExternal``, the upload POST, ``files.completeUploadExternal``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import Attachment, OutboundFile, OutboundMessage
from bot.testing.app import scripted, settle
from bot.testing.inbox import RecordingInbox as Inbox
from bot.testing.slack import ALICE, BOT_TOKEN, CHANNEL, DM_CHANNEL, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy
from channels.slack import SlackChannel
from channels.slack.media import MAX_UPLOAD
from plugins.scripted_provider import ScriptedProvider
from tests.conftest import AppFactory
from tests.media_helpers import jpeg
from workspaces import workspace_dir

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
MB = 1024 * 1024

Start = Callable[[], Awaitable[tuple[SlackChannel, Inbox]]]


@pytest.fixture
async def start(fake_slack: FakeSlack) -> AsyncIterator[Start]:
    channels: list[SlackChannel] = []

    async def factory() -> tuple[SlackChannel, Inbox]:
        inbox = Inbox()
        channel = SlackChannel(Settings(**fake_slack.settings()), host="127.0.0.1",
                               policy=FAST)
        await channel.start(inbox)
        fake_slack.events_url = channel.events_url
        channels.append(channel)
        return channel, inbox

    yield factory
    for channel in channels:
        await channel.stop()


def a_file(tmp_path: Path, name: str, data: bytes, caption: str = "") -> OutboundFile:
    path = tmp_path / name
    path.write_bytes(data)
    return OutboundFile(path=str(path), name=name, mime_type="application/octet-stream",
                        size=len(data), caption=caption)


JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40 + b"\xff\xd9"


# -- inbound -----------------------------------------------------------------------------


async def test_an_image_with_text_arrives_as_a_photo_and_downloads_byte_for_byte(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel, inbox = await start()
    shared = fake_slack.file(JPEG, "receipt.jpg", "image/jpeg", width=1280, height=960)
    delivery = await fake_slack.post_event(fake_slack.direct_message(
        "what is the total?", files=[shared], subtype="file_share"))
    assert delivery.status == 200
    [message] = await inbox.wait_for(1)

    assert message.text == "what is the total?"
    [received] = message.attachments
    assert (received.kind, received.name, received.mime_type) == ("photo", "receipt.jpg",
                                                                  "image/jpeg")
    assert (received.size, received.width, received.height) == (len(JPEG), 1280, 960)
    assert received.url == shared["url_private_download"]
    assert await channel.download(received, 20 * MB) == JPEG
    [(_, headers, status)] = fake_slack.file_requests
    assert status == 200 and headers["Authorization"] == f"Bearer {BOT_TOKEN}"


async def test_over_socket_mode_a_shared_file_arrives_and_downloads_the_same(
    fake_slack: FakeSlack,
) -> None:
    inbox = Inbox()
    channel = SlackChannel(Settings(**fake_slack.settings(socket_mode=True)), policy=FAST)
    await channel.start(inbox)
    try:
        envelope = await fake_slack.socket_event(fake_slack.direct_message(
            "look", subtype="file_share", files=[fake_slack.file(JPEG, "a.jpg", "image/jpeg")]))
        await fake_slack.wait_for_ack(envelope)
        [message] = inbox.messages
        assert await channel.download(message.attachments[0], MB) == JPEG
    finally:
        await channel.stop()


async def test_a_message_with_only_a_file_is_a_message(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel, inbox = await start()
    pdf = b"%PDF-1.4\n" + b"x" * 3000 + b"\n%%EOF\n"
    await fake_slack.post_event(fake_slack.direct_message(
        "", files=[fake_slack.file(pdf, "scan.pdf", "application/pdf")], subtype="file_share"))
    [message] = await inbox.wait_for(1)
    assert message.text == ""
    [received] = message.attachments
    assert (received.kind, received.name) == ("document", "scan.pdf")
    assert await channel.download(received, len(pdf)) == pdf


async def test_a_clip_recorded_in_slack_is_voice_with_its_duration(
    fake_slack: FakeSlack, start: Start,
) -> None:
    _, inbox = await start()
    await fake_slack.post_event(fake_slack.direct_message("", subtype="file_share", files=[
        fake_slack.file(b"\0" * 900, "audio_message.m4a", "audio/mp4", audio_ms=4200)]))
    [message] = await inbox.wait_for(1)
    [received] = message.attachments
    assert (received.kind, received.duration) == ("voice", 4.2)


async def test_file_objects_of_the_wrong_shape_cost_nothing_but_themselves(
    fake_slack: FakeSlack, start: Start,
) -> None:
    _, inbox = await start()
    good = fake_slack.file(b"abc", "a.txt", "text/plain")
    await fake_slack.post_event(fake_slack.direct_message("see", subtype="file_share", files=[
        "not an object", {"id": "F1", "mode": "hidden_by_limit"},
        {**good, "size": "3", "original_w": -5, "name": ["x"]}, good]))
    [message] = await inbox.wait_for(1)
    hidden, odd, plain = message.attachments
    assert (hidden.kind, hidden.url, hidden.size) == ("file", "slack-file:F1", 0)
    assert (odd.size, odd.width) == (0, 0) and odd.name.startswith("document-")
    assert (plain.name, plain.size, plain.kind) == ("a.txt", 3, "document")


async def test_a_minimal_file_object_is_fetched_through_files_info(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel, inbox = await start()
    full = fake_slack.file(JPEG, "shared.jpg", "image/jpeg")
    minimal = {"id": full["id"], "file_access": "check_file_info", "created": full["created"],
               "user": "U0GUEST"}  # as Slack Connect sends it
    await fake_slack.post_event(fake_slack.direct_message("from the other org",
                                                          subtype="file_share", files=[minimal]))
    [message] = await inbox.wait_for(1)
    [received] = message.attachments
    assert received.url == f"slack-file:{full['id']}"
    assert await channel.download(received, MB) == JPEG
    [info] = fake_slack.sent("files.info")
    assert info.params["file"] == full["id"] and info.token == BOT_TOKEN
    with pytest.raises(MediaError, match="file_not_found"):
        await channel.download(Attachment(kind="file", name="x", url="slack-file:F0NONE"), MB)
    fake_slack.scopes.discard("files:read")
    with pytest.raises(MediaError, match="lacks the files:read scope"):
        await channel.download(received, MB)


async def test_a_file_over_the_limit_is_refused_without_reading_it_whole(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel, inbox = await start()
    data = b"q" * 200_000
    await fake_slack.post_event(fake_slack.direct_message("big", subtype="file_share", files=[
        fake_slack.file(data, "big.bin", size=10)]))
    [message] = await inbox.wait_for(1)
    with pytest.raises(MediaTooLarge) as refused:
        await channel.download(message.attachments[0], 50_000)
    assert refused.value.limit == 50_000


@pytest.mark.parametrize("denial", ["redirect", "403"])
async def test_without_files_read_the_download_names_the_missing_scope(
    fake_slack: FakeSlack, start: Start, denial: str,
) -> None:
    channel, inbox = await start()
    fake_slack.scopes.discard("files:read")
    fake_slack.denial = denial
    await fake_slack.post_event(fake_slack.direct_message("read this", subtype="file_share",
                                                          files=[fake_slack.file(b"x", "x.txt",
                                                                                 "text/plain")]))
    [message] = await inbox.wait_for(1)
    with pytest.raises(MediaError, match="lacks the files:read scope") as failed:
        await channel.download(message.attachments[0], MB)
    assert not isinstance(failed.value, MediaTooLarge) and "\n" not in str(failed.value)
    assert message.text == "read this"
    # The redirect is not followed: the token never goes to the login page.
    assert [status for _, _, status in fake_slack.file_requests] == [
        302 if denial == "redirect" else 403]


async def test_a_download_that_fails_is_one_media_error(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel, _ = await start()
    shared = fake_slack.file(b"data", "x.txt", "text/plain")
    attachment = Attachment(kind="document", name="x.txt", url=shared["url_private"])
    fake_slack.fail("url_private", 500, times=3)  # every try of the policy
    with pytest.raises(MediaError, match=r"downloading x\.txt from Slack failed \(HTTP 500\)"):
        await channel.download(attachment, MB)
    gone = Attachment(kind="document", name="y.txt",
                      url=shared["url_private"].replace(shared["id"], "F0NOPE"))
    with pytest.raises(MediaError, match=r"no longer has y\.txt"):
        await channel.download(gone, MB)
    fake_slack.inject("reset_before", "url_private", times=20)
    with pytest.raises(MediaError, match=r"from Slack failed \(ServerDisconnected"):
        await channel.download(attachment, MB)


async def test_a_download_failing_once_is_retried(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel, _ = await start()
    shared = fake_slack.file(b"data", "x.txt", "text/plain")
    fake_slack.fail("url_private", 503)
    assert await channel.download(Attachment(kind="document", name="x.txt",
                                             url=shared["url_private"]), MB) == b"data"
    assert [status for _, _, status in fake_slack.file_requests] == [503, 200]


@pytest.mark.parametrize("url", [
    "https://evil.example/files-pri/T-F/x.txt", "http://files.slack.com/files-pri/T-F/x.txt",
    "file:///etc/passwd", "",
])
async def test_the_bot_token_goes_to_no_link_but_slacks(
    fake_slack: FakeSlack, start: Start, url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    channel, _ = await start()
    with caplog.at_level(logging.DEBUG), pytest.raises(MediaError):
        await channel.download(Attachment(kind="file", name="x.txt", url=url), MB)
    assert not fake_slack.file_requests
    assert BOT_TOKEN not in caplog.text


# -- outbound ----------------------------------------------------------------------------


async def test_the_bot_token_is_never_logged_while_files_go_in_and_out(
    fake_slack: FakeSlack, start: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        channel, _ = await start()
        shared = fake_slack.file(JPEG, "in.jpg", "image/jpeg")
        fake_slack.fail("url_private", 502)  # a retry logs what failed
        attachment = Attachment(kind="photo", name="in.jpg", url=shared["url_private"])
        assert await channel.download(attachment, MB) == JPEG
        await channel.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL, text="out",
                                           files=(a_file(tmp_path, "out.txt", b"out"),)))
    assert fake_slack.shared and "retrying" in caplog.text
    assert BOT_TOKEN not in caplog.text


async def test_a_reply_with_a_file_posts_the_text_then_shares_the_file_in_the_thread(
    fake_slack: FakeSlack, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    data = JPEG * 3
    ts = await channel.send(OutboundMessage(
        channel="slack", chat_id=CHANNEL, chat_type="group", text="here it is",
        reply_to="1763900000.000100",
        files=(a_file(tmp_path, "chart.jpg", data, caption="Sales **2026**"),)))

    [text] = fake_slack.visible(CHANNEL)
    assert text.text == "here it is" and text.ts == ts
    assert text.thread_ts == "1763900000.000100"
    [shared] = fake_slack.shared
    assert (shared.channel, shared.thread_ts, shared.name, shared.data) == (
        CHANNEL, "1763900000.000100", "chart.jpg", data)
    assert shared.initial_comment == "Sales *2026*"
    [ask] = fake_slack.sent("files.getUploadURLExternal")
    assert ask.params["filename"] == "chart.jpg" and ask.params["length"] == str(len(data))
    assert ask.token == BOT_TOKEN


async def test_a_file_alone_is_shared_in_a_dm(
    fake_slack: FakeSlack, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    await channel.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL, text="",
                                       files=(a_file(tmp_path, "notes.md", b"# hi\n"),)))
    assert not fake_slack.sent("chat.postMessage")
    [shared] = fake_slack.shared
    assert (shared.channel, shared.thread_ts, shared.data) == (DM_CHANNEL, None, b"# hi\n")


async def test_without_files_write_the_upload_names_the_missing_scope(
    fake_slack: FakeSlack, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    fake_slack.scopes.discard("files:write")
    with pytest.raises(MediaError, match="lacks the files:write scope"):
        await channel.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL, text="",
                                           files=(a_file(tmp_path, "a.txt", b"a"),)))
    assert not fake_slack.shared


async def test_a_file_over_a_gigabyte_is_refused_before_anything_is_posted(
    fake_slack: FakeSlack, start: Start, tmp_path: Path,
) -> None:
    channel, _ = await start()
    path = tmp_path / "huge.iso"
    with path.open("wb") as out:  # sparse: no gigabyte written
        out.truncate(MAX_UPLOAD + 1)
    huge = OutboundFile(path=str(path), name="huge.iso", mime_type="application/octet-stream",
                        size=MAX_UPLOAD + 1)
    with pytest.raises(MediaTooLarge, match="Slack takes files up to 1 GB"):
        await channel.send(OutboundMessage(channel="slack", chat_id=DM_CHANNEL, text="iso",
                                           files=(huge,)))
    assert not fake_slack.sent("chat.postMessage")
    assert not fake_slack.sent("files.getUploadURLExternal")


# -- through a running Roost ---------------------------------------------------------------


async def roost(make_app: AppFactory, fake: FakeSlack, *turns: dict[str, Any],
                **settings: Any) -> tuple[Roost, ScriptedProvider, Path]:
    """A Roost with the real Slack channel (Events API); its provider and Alice's workspace."""
    provider = scripted(*turns)
    app, _, _ = await make_app(provider, **fake.settings(), **settings)
    channel = SlackChannel(app.settings, host="127.0.0.1", policy=FAST)
    await app.add_channel(channel)
    fake.events_url = channel.events_url
    return app, provider, workspace_dir(app.settings.workspaces_dir, "slack", ALICE)


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def visible(fake: FakeSlack) -> list[str]:
    return [m.text for m in fake.visible()]


async def test_a_photo_with_text_reaches_the_run_stored_byte_for_byte(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    app, provider, workspace = await roost(make_app, fake_slack, {"reply": "a red receipt"})
    data = jpeg(640, 480)
    await fake_slack.post_event(fake_slack.direct_message("what is the total?", files=[
        fake_slack.file(data, "receipt.jpg", "image/jpeg", width=640, height=480)],
        subtype="file_share"))
    await fake_slack.wait_for("chat.postMessage")
    await settle(app)
    assert visible(fake_slack) == ["a red receipt"]

    user = provider.requests[-1].messages[-1]
    path = f"inbox/{today()}/receipt.jpg"
    assert user.content.startswith(f"what is the total?\n\n[photo: {path}, 640×480")
    [part] = user.parts
    assert (part.kind, part.path, part.mime_type) == ("image", path, "image/jpeg")
    assert (workspace / path).read_bytes() == data


async def test_a_photo_without_text_is_a_run_of_its_own(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    app, provider, _ = await roost(make_app, fake_slack, {"reply": "a photo"})
    await fake_slack.post_event(fake_slack.direct_message("", subtype="file_share", files=[
        fake_slack.file(jpeg(64, 48), "image.jpg", "image/jpeg")]))
    await fake_slack.wait_for("chat.postMessage")
    await settle(app)
    assert visible(fake_slack) == ["a photo"]
    [part] = provider.requests[-1].messages[-1].parts
    assert part.kind == "image"


async def test_an_oversize_file_is_refused_in_the_chat_and_the_text_still_runs(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    app, provider, workspace = await roost(make_app, fake_slack, {"reply": "noted"},
                                           media_max_file_mb=1)
    await fake_slack.post_event(fake_slack.direct_message("please summarize", files=[
        fake_slack.file(b"%PDF-1.4".ljust(3 * MB, b"\0"), "bigscan.pdf", "application/pdf")],
        subtype="file_share"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await settle(app)
    assert visible(fake_slack) == ["bigscan.pdf is 3 MB; files over 1 MB are not accepted",
                                   "noted"]
    assert not fake_slack.file_requests  # refused on the declared size
    assert provider.requests[-1].messages[-1].content.startswith("please summarize")
    assert not (workspace / "inbox").exists()


async def test_a_missing_files_read_scope_is_told_and_the_text_still_runs(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    app, provider, _ = await roost(make_app, fake_slack, {"reply": "answered"})
    fake_slack.scopes.discard("files:read")
    await fake_slack.post_event(fake_slack.direct_message("and this?", files=[
        fake_slack.file(jpeg(10, 10), "p.jpg", "image/jpeg")], subtype="file_share"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await settle(app)
    notice, reply = visible(fake_slack)
    assert "lacks the files:read scope" in notice and reply == "answered"
    user = provider.requests[-1].messages[-1]
    assert user.content.startswith("and this?") and not user.parts


async def test_send_file_shares_a_workspace_file_in_the_chat(
    fake_slack: FakeSlack, make_app: AppFactory,
) -> None:
    app, _, workspace = await roost(make_app, fake_slack, {"steps": [
        {"tool_calls": [{"name": "send_file",
                         "arguments": {"path": "report.csv", "caption": "The report"}}]},
        {"reply": "done"}]})
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "report.csv").write_bytes(b"a,b\n1,2\n")
    await fake_slack.post_event(fake_slack.direct_message("send me the report"))
    await fake_slack.wait_for("chat.postMessage")
    await settle(app)
    [shared] = fake_slack.shared
    assert (shared.channel, shared.name, shared.data, shared.initial_comment) == (
        DM_CHANNEL, "report.csv", b"a,b\n1,2\n", "The report")
    assert visible(fake_slack) == ["done"]
