"""Telegram media: files people send (attachments with their file id, downloaded through
getFile and the file URL) and files Roost sends (sendPhoto, sendDocument).

The channel runs the real aiogram against the fake Bot API, which holds files,
serves them under ``/file/bot<token>/<path>``, takes multipart uploads and
checks them as the real server does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import random
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bot.app.roost import Roost
from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import Attachment, InboundMessage, OutboundFile, OutboundMessage
from bot.testing.app import scripted
from bot.testing.telegram import ALICE, FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from bot.testing.transcribe import FakeTranscriber
from channels.telegram import TelegramChannel
from plugins.scripted_provider import ScriptedProvider
from tests.media_samples import jpeg, ogg_opus, pdf, png
from tests.test_telegram import TgFactory, answered
from tests.test_telegram import make_tg as _make_tg  # noqa: F401  (the fixture)
from tests.test_telegram_intake import Inbox, StartTg
from tests.test_telegram_intake import start_tg as _start_tg  # noqa: F401  (the fixture)
from workspaces import workspace_dir

MB = 1024 * 1024
GROUP = -1001234567890


def image(width: int, height: int, fmt: str = "JPEG", *, seed: int = 1) -> bytes:
    """An image of noise (so it does not compress to nothing) in ``fmt``."""
    rng = random.Random(seed)
    img = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


async def received(start_tg: StartTg, fake: FakeTelegram, update: dict[str, object],
                   **options: object) -> tuple[TelegramChannel, InboundMessage]:
    """Start a channel, wait until it took ``update``; the channel and the message."""
    inbox = Inbox()
    channel = await start_tg(inbox, **options)
    update_id = update["update_id"]
    assert isinstance(update_id, int)
    await fake.wait_confirmed(update_id)
    [message] = inbox.messages
    return channel, message


def outbound(tmp_path: Path, name: str, data: bytes, *, text: str = "", caption: str = "",
             chat_id: int = ALICE["id"], mime: str = "",
             reply_to: str | None = None) -> OutboundMessage:
    """A reply carrying ``data`` as the file ``name`` (written to ``tmp_path``)."""
    path = tmp_path / name
    path.write_bytes(data)
    return OutboundMessage(channel="telegram", chat_id=str(chat_id), text=text,
                           chat_type="group" if chat_id < 0 else "direct", reply_to=reply_to,
                           files=(OutboundFile(str(path), name, mime, len(data), caption),))


# -- inbound: attachments and downloads ------------------------------------------------


async def test_a_photo_with_a_caption_arrives_as_an_attachment_downloaded_byte_for_byte(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    data = image(640, 480)
    update = fake_telegram.photo(data, caption="what is this?")
    channel, message = await received(start_tg, fake_telegram, update)
    assert message.text == "what is this?"
    [photo] = message.attachments
    assert (photo.kind, photo.mime_type, photo.width, photo.height, photo.size) == \
        ("photo", "image/jpeg", 640, 480, len(data))
    assert photo.name == f"photo-{update['message']['message_id']}.jpg"  # type: ignore[index]
    assert await channel.download(photo, 20 * MB) == data
    [get_file] = fake_telegram.sent("getFile")
    assert get_file.params["file_id"] == photo.url


async def test_a_photo_without_a_caption_is_a_message_with_no_text_and_its_photo(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    data = image(300, 200, seed=2)
    update = fake_telegram.photo(data)
    channel, message = await received(start_tg, fake_telegram, update)
    assert message.text == ""
    [photo] = message.attachments
    assert photo.kind == "photo" and photo.url
    assert await channel.download(photo, 20 * MB) == data


async def test_the_largest_photo_size_under_the_cap_is_taken(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    sizes = [{"file_id": f"F{n}", "file_unique_id": f"U{n}", "width": w, "height": h,
              "file_size": size}
             for n, (w, h, size) in enumerate([(90, 67, 1_200), (800, 600, 64_000),
                                               (1280, 960, 131_000), (2560, 1920, 400_000)])]
    update = fake_telegram.media_message({"photo": sizes})
    # 0.2 MB: the 400 KB size is over it, the 131 KB one the largest under it.
    _, message = await received(start_tg, fake_telegram, update,
                                settings={"media_max_file_mb": 0.2})
    [photo] = message.attachments
    assert (photo.url, photo.width, photo.size) == ("F2", 1280, 131_000)


async def test_when_every_photo_size_is_over_the_cap_the_largest_is_taken(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    sizes = [{"file_id": "small", "file_unique_id": "u1", "width": 320, "height": 240,
              "file_size": 300_000},
             {"file_id": "big", "file_unique_id": "u2", "width": 1280, "height": 960,
              "file_size": 900_000}]
    update = fake_telegram.media_message({"photo": sizes})
    _, message = await received(start_tg, fake_telegram, update,
                                settings={"media_max_file_mb": 0.1})
    # The core refuses it by its declared size, naming the file and the limit.
    [photo] = message.attachments
    assert (photo.url, photo.size) == ("big", 900_000)


async def test_a_document_keeps_its_name_and_type_and_downloads_byte_for_byte(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    data = b"%PDF-1.4\n" + bytes(range(256)) * 300
    update = fake_telegram.document(data, "Q3 report.pdf", "application/pdf",
                                    caption="summarize this")
    channel, message = await received(start_tg, fake_telegram, update)
    assert message.text == "summarize this"
    [document] = message.attachments
    assert (document.kind, document.name, document.mime_type, document.size) == \
        ("document", "Q3 report.pdf", "application/pdf", len(data))
    assert await channel.download(document, 20 * MB) == data


async def test_a_document_without_a_name_gets_one_from_its_type(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    update = fake_telegram.document(b"a,b\n1,2\n", None, "text/csv")
    _, message = await received(start_tg, fake_telegram, update)
    [document] = message.attachments
    assert document.name == f"document-{update['message']['message_id']}.csv"  # type: ignore[index]


async def test_a_voice_note_arrives_with_its_duration_and_downloads(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    data = b"OggS" + bytes(5000)
    update = fake_telegram.voice(data, duration=12)
    channel, message = await received(start_tg, fake_telegram, update)
    [voice] = message.attachments
    assert (voice.kind, voice.mime_type, voice.duration) == ("voice", "audio/ogg", 12.0)
    assert voice.name.endswith(".ogg")
    assert await channel.download(voice, 20 * MB) == data


async def test_a_photo_in_a_group_is_for_the_bot_when_its_caption_mentions_it(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    handle = f"@{fake_telegram.username}"
    update = fake_telegram.media_message(
        {"photo": fake_telegram.photo_sizes(image(100, 80))}, caption=f"{handle} what is it?",
        group=True, entities=[{"type": "mention", "offset": 0, "length": len(handle)}])
    _, message = await received(start_tg, fake_telegram, update)
    assert message.mentioned and message.text == "what is it?"
    assert [a.kind for a in message.attachments] == ["photo"]


async def test_a_hostile_file_name_is_cut_to_255_characters_keeping_its_extension(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    update = fake_telegram.document(b"x", "\ud83d" + "a/b\x00" * 200_000 + ".pdf",
                                    "application/pdf\n" + "x" * 10_000)
    _, message = await received(start_tg, fake_telegram, update)
    [document] = message.attachments
    assert len(document.name) <= 255 and document.name.endswith(".pdf")
    assert "\x00" not in document.name and document.name.startswith("\ufffd")
    assert len(document.mime_type) <= 128 and "\n" not in document.mime_type


async def test_a_file_declared_over_the_limit_is_refused_without_fetching_it(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    update = fake_telegram.document(bytes(3000), "big.bin")
    channel, message = await received(start_tg, fake_telegram, update)
    [document] = message.attachments
    with pytest.raises(MediaTooLarge) as caught:
        await channel.download(document, 1000)
    assert (caught.value.size, caught.value.limit) == (3000, 1000)
    assert fake_telegram.calls_of("getFile") == [] and fake_telegram.downloads == []


async def test_a_file_bigger_than_declared_is_cut_off_at_the_limit(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    held = fake_telegram.add_file(bytes(200_000), name="liar.bin")
    # A forged declaration: 10 bytes. The file server says otherwise, and so do the bytes.
    liar = Attachment("document", name="liar.bin", url=held.file_id, size=10)
    channel = await start_tg(Inbox())
    with pytest.raises(MediaTooLarge) as caught:
        await channel.download(liar, 50_000)
    assert caught.value.size > 50_000 and caught.value.limit == 50_000


async def test_a_file_over_telegrams_20_mb_for_bots_is_a_clear_refusal(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    fake_telegram.download_limit = 1000  # stands in for 20 MB: getFile answers "too big"
    update = fake_telegram.document(bytes(2000), "scan.pdf", "application/pdf")
    channel, message = await received(start_tg, fake_telegram, update)
    [document] = message.attachments
    with pytest.raises(MediaTooLarge, match="over 20 MB") as caught:
        await channel.download(document, 50 * MB)
    assert caught.value.limit == 20 * MB
    assert fake_telegram.downloads == []


async def test_a_download_that_keeps_failing_with_5xx_is_a_media_error_without_the_token(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    update = fake_telegram.photo(image(64, 64))
    channel, message = await received(start_tg, fake_telegram, update)
    fake_telegram.fail_download("html", 502, times=10)
    with pytest.raises(MediaError) as caught:
        await channel.download(message.attachments[0], 20 * MB)
    assert not isinstance(caught.value, MediaTooLarge)
    reason = str(caught.value)
    assert "502" in reason and "\n" not in reason and fake_telegram.token not in reason
    assert len(fake_telegram.downloads) == 3  # the policy's three attempts


@pytest.mark.parametrize("kind", ["status", "html", "reset", "cut"])
async def test_a_download_failing_once_is_retried(
        start_tg: StartTg, fake_telegram: FakeTelegram, kind: str) -> None:
    data = image(120, 90, seed=3)
    update = fake_telegram.photo(data)
    channel, message = await received(start_tg, fake_telegram, update)
    fake_telegram.fail_download(kind, 500)
    assert await channel.download(message.attachments[0], 20 * MB) == data
    assert len(fake_telegram.downloads) == 2


async def test_an_unknown_file_id_is_a_media_error_naming_telegrams_reason(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    channel = await start_tg(Inbox())
    with pytest.raises(MediaError, match="invalid file_id"):
        await channel.download(Attachment("photo", name="x.jpg", url="nope"), MB)


async def test_a_download_after_stop_is_a_media_error(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    update = fake_telegram.photo(image(32, 32))
    channel, message = await received(start_tg, fake_telegram, update)
    await channel.stop()
    with pytest.raises(MediaError, match="stopped"):
        await channel.download(message.attachments[0], MB)


# -- outbound: photos and documents ------------------------------------------------------


async def test_an_image_is_sent_as_a_photo_with_its_caption(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    data = image(800, 600, "PNG")
    sent = await channel.send(outbound(tmp_path, "chart.png", data, caption="**Sales** by month"))
    [call] = fake_telegram.sent("sendPhoto")
    [upload] = fake_telegram.uploads
    assert upload.method == "photo" and upload.data == data and upload.chat_id == ALICE["id"]
    assert call.params["caption"] == "<b>Sales</b> by month" and call.params["parse_mode"] == "HTML"
    assert sent == str(upload.message_id)
    assert fake_telegram.sent("sendMessage") == []


async def test_a_file_that_is_not_a_photo_goes_as_a_document_under_its_name(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    data = b"name,total\nreceipt,42.50\n"
    await channel.send(outbound(tmp_path, "totals.csv", data, caption="the totals"))
    [upload] = fake_telegram.uploads
    assert (upload.method, upload.name, upload.data, upload.caption) == \
        ("document", "totals.csv", data, "the totals")
    assert fake_telegram.calls_of("sendPhoto") == []


@pytest.mark.parametrize(("width", "height", "fmt"), [
    (2100, 100, "PNG"),   # a ratio over 20
    (6000, 4100, "JPEG"),  # width + height over 10,000
    (64, 64, "GIF"),      # would lose its animation as a photo
])
async def test_an_image_telegram_would_not_take_as_a_photo_goes_as_a_document(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path,
        width: int, height: int, fmt: str) -> None:
    channel = await start_tg(Inbox())
    data = image(width, height, fmt) if fmt != "JPEG" else \
        _blank(width, height)
    await channel.send(outbound(tmp_path, f"wide.{fmt.lower()}", data))
    [upload] = fake_telegram.uploads
    assert upload.method == "document" and upload.data == data
    assert fake_telegram.calls_of("sendPhoto") == []


def _blank(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(out, "JPEG")
    return out.getvalue()


async def test_a_photo_telegram_refuses_as_a_photo_is_sent_again_as_a_document(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    fake_telegram.fail("sendPhoto", 400, description="Bad Request: PHOTO_INVALID_DIMENSIONS")
    data = image(200, 200)
    await channel.send(outbound(tmp_path, "odd.jpg", data))
    [upload] = fake_telegram.uploads
    assert upload.method == "document" and upload.name == "odd.jpg" and upload.data == data


async def test_a_caption_telegram_cannot_parse_is_sent_as_plain_text(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    fake_telegram.fail("sendDocument", 400)  # "can't parse entities"
    await channel.send(outbound(tmp_path, "notes.txt", b"notes", caption="**bold**"))
    [upload] = fake_telegram.uploads
    assert upload.caption == "**bold**"


async def test_short_text_with_one_file_becomes_its_caption_in_a_group_reply(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    await channel.send(outbound(tmp_path, "plot.png", image(300, 200, "PNG"),
                                text="Here is the plot.", chat_id=GROUP, reply_to="555"))
    [call] = fake_telegram.sent("sendPhoto")
    assert call.params["caption"] == "Here is the plot."
    assert call.params["reply_parameters"]["message_id"] == 555
    assert fake_telegram.sent("sendMessage") == []


async def test_text_goes_first_and_threads_the_reply_then_the_files_follow(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    message = outbound(tmp_path, "a.txt", b"first", text="Two files for you.",
                       caption="one", chat_id=GROUP, reply_to="555")
    second = tmp_path / "b.txt"
    second.write_bytes(b"second")
    message = dataclasses.replace(message, files=(
        *message.files, OutboundFile(str(second), "b.txt", "text/plain", 6, "two")))
    last = await channel.send(message)
    [text] = fake_telegram.sent("sendMessage")
    assert text.params["text"] == "Two files for you."
    assert text.params["reply_parameters"]["message_id"] == 555
    documents = fake_telegram.sent("sendDocument")
    assert [u.name for u in fake_telegram.uploads] == ["a.txt", "b.txt"]
    assert all("reply_parameters" not in d.params for d in documents)
    assert last == str(fake_telegram.uploads[-1].message_id)


async def test_a_draft_becomes_the_text_and_the_file_follows_it(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    draft = await channel.send(OutboundMessage(channel="telegram", chat_id=str(ALICE["id"]),
                                               text="Drawing the chart..."))
    message = dataclasses.replace(outbound(tmp_path, "chart.png", image(200, 100, "PNG")),
                                  text="Here is the chart.", replace=draft)
    last = await channel.send(message)
    assert fake_telegram.visible(ALICE["id"]) == ["Here is the chart.", ""]
    [edit] = fake_telegram.sent("editMessageText")
    assert str(edit.params["message_id"]) == draft
    assert last == str(fake_telegram.uploads[0].message_id)


async def test_a_caption_longer_than_telegram_takes_follows_the_file_as_text(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    long = "word " * 400  # 2,000 characters: over the 1,024 of a caption
    await channel.send(outbound(tmp_path, "data.bin", b"\x00\x01", caption=long))
    [upload] = fake_telegram.uploads
    assert upload.caption is None
    [text] = fake_telegram.sent("sendMessage")
    assert text.params["text"].strip() == long.strip()


async def test_a_file_over_50_mb_raises_before_anything_is_sent(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    path = tmp_path / "huge.bin"
    with path.open("wb") as handle:
        handle.truncate(51 * MB)  # sparse: nothing is written, nothing is read
    message = OutboundMessage(channel="telegram", chat_id=str(ALICE["id"]), text="here",
                              files=(OutboundFile(str(path), "huge.bin", "", 51 * MB),))
    with pytest.raises(MediaTooLarge, match="50 MB") as caught:
        await channel.send(message)
    assert caught.value.limit == 50 * MB
    assert fake_telegram.calls_of("sendMessage") == []
    assert fake_telegram.calls_of("sendDocument") == []


async def test_telegrams_413_for_an_upload_is_media_too_large(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    fake_telegram.upload_limit = 1000
    with pytest.raises(MediaTooLarge):
        await channel.send(outbound(tmp_path, "blob.bin", bytes(5000)))
    [call] = fake_telegram.calls_of("sendDocument")
    assert call.status == 413
    assert fake_telegram.uploads == []


async def test_a_missing_file_is_a_media_error(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(Inbox())
    message = OutboundMessage(channel="telegram", chat_id=str(ALICE["id"]), text="",
                              files=(OutboundFile(str(tmp_path / "gone.png"), "gone.png",
                                                  "image/png", 10),))
    with pytest.raises(MediaError, match=r"gone\.png"):
        await channel.send(message)
    assert fake_telegram.calls == [c for c in fake_telegram.calls
                                   if c.method in ("getMe", "deleteWebhook", "getUpdates")]


# -- the fake checks uploads as Telegram does ---------------------------------------------


async def test_the_fake_refuses_an_upload_without_its_file_and_a_non_image_photo(
        fake_telegram: FakeTelegram) -> None:
    import aiohttp

    url = f"{fake_telegram.base_url}/bot{fake_telegram.token}"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/sendPhoto", data={"chat_id": "42"}) as response:
            assert response.status == 400
            assert (await response.json())["description"] == \
                "Bad Request: there is no photo in the request"
        form = aiohttp.FormData()
        form.add_field("chat_id", "42")
        form.add_field("photo", b"not an image", filename="x.jpg")
        async with session.post(f"{url}/sendPhoto", data=form) as response:
            assert response.status == 400
            assert (await response.json())["description"] == \
                "Bad Request: IMAGE_PROCESS_FAILED"
        async with session.get(f"{fake_telegram.base_url}/file/bot{fake_telegram.token}/"
                               "photos/none.jpg") as response:
            assert response.status == 404


# -- through a running Roost ---------------------------------------------------------------


async def roost(make_tg: TgFactory, fake: FakeTelegram, *turns: dict[str, Any],
                **settings: Any) -> tuple[Roost, ScriptedProvider, Path]:
    """A Roost on the real Telegram channel; its provider and Alice's workspace."""
    provider = scripted(*turns)
    app, _, _ = await make_tg(provider, **settings)
    return app, provider, workspace_dir(app.settings.workspaces_dir, "telegram",
                                        str(ALICE["id"]))


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


async def test_through_roost_a_photo_with_a_caption_reaches_the_model_stored_byte_for_byte(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    app, provider, workspace = await roost(make_tg, fake_telegram, {"reply": "a receipt"})
    data = jpeg(640, 480)
    update = fake_telegram.photo(data, caption="what is the total?")
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    assert fake_telegram.visible(ALICE["id"]) == ["a receipt"]
    user = provider.requests[-1].messages[-1]
    path = f"inbox/{today()}/photo-{update['message']['message_id']}.jpg"
    assert f"what is the total?\n\n[photo: {path}, 640×480" in str(user.content)
    [part] = user.parts
    assert (part.kind, part.path, part.mime_type, part.width) == ("image", path, "image/jpeg",
                                                                  640)
    assert (workspace / path).read_bytes() == data


async def test_through_roost_a_photo_without_a_caption_is_a_run_of_its_own(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    app, provider, _ = await roost(make_tg, fake_telegram, {"reply": "a photo"})
    update = fake_telegram.photo(jpeg(64, 48))
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    assert fake_telegram.visible(ALICE["id"]) == ["a photo"]
    [part] = provider.requests[-1].messages[-1].parts
    assert part.kind == "image"


async def test_through_roost_a_pdf_reaches_the_model_as_a_document(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    app, provider, workspace = await roost(make_tg, fake_telegram, {"reply": "42.00 EUR"})
    data = pdf("Total: 42.00 EUR", "Thank you")
    update = fake_telegram.document(data, "receipt.pdf", "application/pdf",
                                    caption="summarize this")
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    user = provider.requests[-1].messages[-1]
    path = f"inbox/{today()}/receipt.pdf"
    [part] = user.parts
    assert (part.kind, part.path, part.mime_type) == ("document", path, "application/pdf")
    assert "2 pages" in str(user.content)
    assert (workspace / path).read_bytes() == data


async def test_through_roost_a_voice_note_is_transcribed(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    async with FakeTranscriber(api_key="sk-voice") as whisper:
        whisper.transcript("remind me to call the dentist")
        app, provider, _ = await roost(make_tg, fake_telegram, {"reply": "Noted."},
                                       plugins={"plugins.transcribe": {
                                           "base_url": whisper.base_url,
                                           "api_key": "sk-voice"}})
        data = ogg_opus(12)
        update = fake_telegram.voice(data, duration=12)
        await fake_telegram.wait_for("sendMessage")
        await answered(fake_telegram, app, update)
        [upload] = whisper.uploads
    assert upload.filename.endswith(".ogg")
    assert "[voice 0:12] remind me to call the dentist" in \
        str(provider.requests[-1].messages[-1].content)
    assert fake_telegram.visible(ALICE["id"]) == ["Noted."]


async def test_through_roost_an_oversize_file_is_refused_in_the_chat_and_the_text_runs(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    app, provider, workspace = await roost(make_tg, fake_telegram, {"reply": "noted"},
                                           media_max_file_mb=1)
    update = fake_telegram.document(b"%PDF-1.4".ljust(3 * MB, b"\0"), "bigscan.pdf",
                                    "application/pdf", caption="please summarize")
    await fake_telegram.wait_for("sendMessage", 2)
    await answered(fake_telegram, app, update)
    assert fake_telegram.visible(ALICE["id"]) == [
        "bigscan.pdf is 3 MB; files over 1 MB are not accepted", "noted"]
    assert fake_telegram.calls_of("getFile") == [] and fake_telegram.downloads == []
    assert str(provider.requests[-1].messages[-1].content).startswith("please summarize")
    assert not (workspace / "inbox").exists()


async def test_through_roost_a_download_that_fails_is_told_and_the_text_runs(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    app, provider, _ = await roost(make_tg, fake_telegram, {"reply": "answered"})
    fake_telegram.fail_download("html", 502, times=10)
    update = fake_telegram.photo(jpeg(32, 32), caption="and this?")
    await fake_telegram.wait_for("sendMessage", 2)
    await answered(fake_telegram, app, update)
    notice, reply = fake_telegram.visible(ALICE["id"])
    assert "could not fetch" in notice and "502" in notice and reply == "answered"
    user = provider.requests[-1].messages[-1]
    assert str(user.content).startswith("and this?") and not user.parts


@pytest.mark.parametrize(("name", "method"), [("chart.png", "photo"),
                                              ("report.csv", "document")])
async def test_through_roost_send_file_delivers_a_workspace_file(
        make_tg: TgFactory, fake_telegram: FakeTelegram, name: str, method: str) -> None:
    app, _, workspace = await roost(make_tg, fake_telegram, {"steps": [
        {"tool_calls": [{"name": "send_file",
                         "arguments": {"path": name, "caption": "Here it is"}}]},
        {"reply": "done"}]})
    data = png(400, 300) if name.endswith(".png") else b"a,b\n1,2\n"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / name).write_bytes(data)
    update = fake_telegram.private_message("send it to me")
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    [upload] = fake_telegram.uploads
    assert (upload.method, upload.name, upload.data, upload.caption) == \
        (method, name, data, "Here it is")
    assert fake_telegram.visible(ALICE["id"]) == ["Here it is", "done"]
