"""What arrives on Telegram besides plain text: lone surrogates, media and other message
kinds, updates Roost does not handle, posts made on behalf of a chat.

Everything goes through the real aiogram against the fake Bot API, by long polling.
"""

from __future__ import annotations

import ast
import inspect
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bot.config.settings import Settings
from bot.contracts.messages import Attachment, InboundMessage
from bot.testing.app import scripted
from bot.testing.telegram import ALICE, FakeTelegram, user
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.telegram import TelegramChannel
from tests.test_telegram import GROUP, TgFactory, answered, last_user_text
from tests.test_telegram import make_tg as _make_tg  # noqa: F401  (the fixture)
from tests.test_telegram_intake import Inbox, StartTg
from tests.test_telegram_intake import start_tg as _start_tg  # noqa: F401  (the fixture)

if TYPE_CHECKING:
    # Only for annotations: importing aiogram before channels.telegram would build
    # all its types eagerly (see channels.telegram_lazy).
    from aiogram.types import Message

CHANNEL = {"id": -1009876543210, "type": "channel", "title": "Roost News",
           "username": "roost_news"}
"""The channel linked to the test group as its discussion group."""
TELEGRAM = user(777000, "Telegram")
"""The service account automatic forwards come "from"."""
ANONYMOUS_ADMIN = user(1087968824, "Group", "GroupAnonymousBot", is_bot=True)
CHANNEL_BOT = user(136817688, "Channel", "Channel_Bot", is_bot=True)
"""The ``from`` of a message a user posts in a group as one of their channels."""


def roost_tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("roost") and r.exc_info]


def media_message(fake: FakeTelegram, sender: dict[str, Any] = ALICE,
                  **content: Any) -> dict[str, Any]:
    """Push a private message that has ``content`` (a photo, a location...) and no text."""
    chat = {"id": sender["id"], "type": "private", "first_name": sender["first_name"]}
    return fake.push_update({"message": {"message_id": 700 + len(fake.calls), "date": 1,
                                         "chat": chat, "from": sender, **content}})


def file(unique: str, **fields: Any) -> dict[str, Any]:
    return {"file_id": f"FILE-{unique}", "file_unique_id": unique, **fields}


# -- lone surrogates ----------------------------------------------------------------------


async def test_a_mention_after_a_lone_surrogate_is_answered_without_a_traceback(
        make_tg: TgFactory, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    provider = scripted({"reply": "fine"})
    app, _, _ = await make_tg(provider)
    # "hi " is 3 UTF-16 units, the lone surrogate 1, the space 1: the mention is at 5.
    text = "hi \ud83d @test_bot what time is it?"
    update = fake_telegram.group_message(
        text, entities=[{"type": "mention", "offset": 5, "length": 9}])
    [call] = await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    assert call.params["text"] == "fine"
    # The mention was cut where Telegram said it was; the core replaced the surrogate.
    assert last_user_text(provider) == "[Alice (id 42)]: hi \ufffd what time is it?"
    assert roost_tracebacks(caplog) == []


# -- media and other message kinds ----------------------------------------------------------

LOCATION = {"latitude": 51.5074, "longitude": -0.1278}

KINDS: dict[str, tuple[dict[str, Any], Attachment]] = {
    "photo": ({"photo": [file("p1", width=90, height=67, file_size=1200),
                         file("p2", width=1280, height=960, file_size=131_000)]},
              Attachment("photo", name="photo-700.jpg", url="FILE-p2", mime_type="image/jpeg",
                         size=131_000, width=1280, height=960)),
    "document": ({"document": file("d", file_name="report.pdf", mime_type="application/pdf",
                                   file_size=52_000)},
                 Attachment("document", name="report.pdf", url="FILE-d",
                            mime_type="application/pdf", size=52_000)),
    "voice": ({"voice": file("v", duration=12, mime_type="audio/ogg", file_size=20_480)},
              Attachment("voice", name="voice-700.ogg", url="FILE-v", mime_type="audio/ogg",
                         size=20_480, duration=12.0)),
    "audio": ({"audio": file("a", duration=185, performer="Artist", title="Song",
                             file_name="song.mp3", mime_type="audio/mpeg",
                             file_size=3_000_000)},
              Attachment("audio", name="song.mp3", url="FILE-a", mime_type="audio/mpeg",
                         size=3_000_000, duration=185.0)),
    "video": ({"video": file("vi", width=1920, height=1080, duration=30,
                             file_name="clip.mp4", mime_type="video/mp4", file_size=900_000)},
              Attachment("video", name="clip.mp4", url="FILE-vi", mime_type="video/mp4",
                         size=900_000, width=1920, height=1080, duration=30.0)),
    # Telegram sends a GIF as an animation and, for old clients, as a document too.
    "animation": ({"animation": file("an", width=320, height=240, duration=3,
                                     file_name="cat.gif.mp4", mime_type="video/mp4"),
                   "document": file("an", file_name="cat.gif.mp4", mime_type="video/mp4")},
                  Attachment("video", name="cat.gif.mp4", url="FILE-an", mime_type="video/mp4",
                             width=320, height=240, duration=3.0)),
    "video_note": ({"video_note": file("vn", length=240, duration=9, file_size=80_000)},
                   Attachment("video", name="video_note-700.mp4", url="FILE-vn",
                              mime_type="video/mp4", size=80_000, width=240, height=240,
                              duration=9.0)),
    "sticker": ({"sticker": file("s", type="regular", width=512, height=512, emoji="😀",
                                 set_name="HotCherry", is_animated=False, is_video=False)},
                Attachment("photo", name="sticker-700.webp", url="FILE-s",
                           mime_type="image/webp", width=512, height=512)),
    "animated sticker": ({"sticker": file("as", type="regular", width=512, height=512,
                                          is_animated=True, is_video=False)},
                         Attachment("file", name="sticker-700.tgs", url="FILE-as",
                                    mime_type="application/x-tgsticker", width=512,
                                    height=512)),
    "video sticker": ({"sticker": file("vs", type="regular", width=512, height=512,
                                       is_animated=False, is_video=True)},
                      Attachment("file", name="sticker-700.webm", url="FILE-vs",
                                 mime_type="video/webm", width=512, height=512)),
    "location": ({"location": LOCATION}, Attachment("location", name="51.5074,-0.1278")),
    "live location": ({"location": {**LOCATION, "live_period": 900}},
                      Attachment("location", name="51.5074,-0.1278 (live)")),
    "venue": ({"venue": {"location": LOCATION, "title": "Trafalgar Square",
                         "address": "London WC2N 5DN"}, "location": LOCATION},
              Attachment("venue", name="Trafalgar Square, London WC2N 5DN, 51.5074,-0.1278")),
    "contact": ({"contact": {"phone_number": "+441234567890", "first_name": "Ada",
                             "last_name": "Lovelace", "user_id": 77}},
                Attachment("contact", name="Ada Lovelace, +441234567890")),
    "poll": ({"poll": {"id": "5", "question": "Lunch?", "total_voter_count": 0,
                       "options": [{"persistent_id": "a", "text": "Pizza", "voter_count": 0},
                                   {"persistent_id": "b", "text": "Sushi", "voter_count": 0}],
                       "is_closed": False, "is_anonymous": True, "type": "regular",
                       "allows_multiple_answers": False, "allows_revoting": False,
                       "members_only": False}},
             Attachment("poll", name="Lunch?: Pizza / Sushi")),
    "dice": ({"dice": {"emoji": "🎲", "value": 4}}, Attachment("dice", name="🎲 showing 4")),
}


@pytest.mark.parametrize("kind", list(KINDS))
async def test_each_message_kind_arrives_as_an_attachment_files_with_their_file_id(
        start_tg: StartTg, fake_telegram: FakeTelegram, kind: str) -> None:
    content, expected = KINDS[kind]
    inbox = Inbox()
    update = media_message(fake_telegram, **content)
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(update["update_id"])
    [message] = inbox.messages
    assert message.attachments == (expected,)
    assert message.text == "" and message.sender_id == "42"


def test_every_field_the_attachment_code_reads_is_a_carrier() -> None:
    # A message with no carrier set skips the attachment code: a field read there but
    # missing from CARRIERS would make such messages arrive without their attachment.
    from aiogram.types import Message

    from channels.telegram import inbound, media

    read: set[str] = set()
    for function in (inbound.attachments_of, media.file_attachments):
        for node in ast.walk(ast.parse(inspect.getsource(function))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "message":
                read.add(node.attr)
    assert read - {"message_id"} <= set(inbound.CARRIERS)
    assert set(inbound.CARRIERS) <= set(Message.model_fields)
    assert {"photo", "document", "voice", "sticker", "venue", "poll", "live_photo"} <= read


async def test_a_caption_is_the_text_and_the_media_its_attachment(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = Inbox()
    update = media_message(fake_telegram, caption="what is this?",
                           photo=[file("p", width=800, height=600, file_size=64_000)])
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(update["update_id"])
    [message] = inbox.messages
    assert message.text == "what is this?"
    assert message.attachments == (Attachment("photo", name="photo-700.jpg", url="FILE-p",
                                              mime_type="image/jpeg", size=64_000,
                                              width=800, height=600),)


async def test_a_location_alone_reaches_the_model_as_a_note_and_is_answered(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "That is Trafalgar Square."})
    app, _, _ = await make_tg(provider)
    update = media_message(fake_telegram, location=LOCATION)
    [call] = await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    assert call.params["text"] == "That is Trafalgar Square."
    assert "location (51.5074,-0.1278)" in last_user_text(provider)


async def test_a_hostile_description_is_cut_and_cleaned(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = Inbox()
    update = media_message(fake_telegram, contact={
        "phone_number": "+1\x00555", "first_name": "\ud83d" + "A" * 1_000_000})
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(update["update_id"])
    [message] = inbox.messages
    [contact] = message.attachments
    assert contact.name.startswith("\ufffdAAA") and len(contact.name) <= 700
    assert "\x00" not in contact.name and contact.name.endswith("+1555")


async def test_updates_roost_does_not_handle_are_confirmed_and_logged_once_per_kind(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="roost.channels.telegram")
    inbox = Inbox()
    chat = {"id": GROUP, "type": "supergroup", "title": "Test group"}
    member = {"user": fake_telegram.bot_user, "status": "member"}
    for n in range(2):
        # Served although polling asks for messages only: a proxy or an old
        # allowed_updates setting may send anything.
        fake_telegram.push_raw({"update_id": 900 + 4 * n, "callback_query": {
            "id": f"cb{n}", "from": ALICE, "chat_instance": "ci", "data": "press"}})
        fake_telegram.push_raw({"update_id": 901 + 4 * n, "my_chat_member": {
            "chat": chat, "from": ALICE, "date": 1, "old_chat_member": {
                "user": fake_telegram.bot_user, "status": "left"},
            "new_chat_member": member}})
        fake_telegram.push_raw({"update_id": 902 + 4 * n, "message": {
            "message_id": 50 + n, "date": 1, "chat": chat, "from": ALICE,
            "new_chat_members": [user(500 + n, "Newcomer")]}})
        fake_telegram.push_raw({"update_id": 903 + 4 * n, "future_kind": {"x": n}})
    last = fake_telegram.private_message("and a real one")
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(last["update_id"])
    assert inbox.texts() == ["and a real one"]
    assert fake_telegram.pending_updates == 0
    ignored = [r.getMessage() for r in caplog.records
               if r.name == "roost.channels.telegram" and "does not handle" in r.getMessage()]
    assert len(ignored) == 4, ignored
    for kind in ("callback_query", "my_chat_member", "new_chat_members message",
                 "future_kind"):
        assert sum(kind in line for line in ignored) == 1, kind
    assert all(r.levelno == logging.DEBUG for r in caplog.records
               if r.name.startswith("roost") and "does not handle" in r.getMessage())


# -- posts on behalf of a chat -------------------------------------------------------------


def automatic_forward(fake: FakeTelegram, text: str, *, mention: bool) -> dict[str, Any]:
    """Push a post of the linked channel, as Telegram forwards it into the group."""
    entities = [{"type": "mention", "offset": len(text) + 1, "length": 9}] if mention else None
    origin = {"type": "channel", "chat": CHANNEL, "message_id": 55, "date": 1}
    return fake.group_message(f"{text} @test_bot" if mention else text, sender=TELEGRAM,
                              entities=entities, sender_chat=CHANNEL,
                              is_automatic_forward=True, forward_origin=origin)


async def test_an_automatic_forward_speaks_as_its_channel_under_the_group_policy(
        make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    provider = scripted({"reply": "Congratulations on the release."})
    app, _, _ = await make_tg(provider)
    quiet = automatic_forward(fake_telegram, "Maintenance tonight.", mention=False)
    await answered(fake_telegram, app, quiet)
    assert provider.requests == []  # not addressed to the bot: context only
    asked = automatic_forward(fake_telegram, "Version 2 is out!", mention=True)
    [call] = await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, asked)
    assert call.params["chat_id"] == GROUP
    assert last_user_text(provider) == "[Roost News (id -1009876543210)]: Version 2 is out!"
    assert "777000" not in str(provider.requests[-1].messages)


async def test_automatic_forwards_are_dropped_when_configured_to_be_ignored(
        make_tg: TgFactory, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="roost.channels.telegram")
    provider = scripted({"reply": "for Alice"})
    app, _, _ = await make_tg(provider, telegram_automatic_forwards="ignore")
    forward = automatic_forward(fake_telegram, "Version 2 is out!", mention=True)
    await answered(fake_telegram, app, forward)
    assert provider.requests == [] and fake_telegram.sent_texts() == []
    assert "forwarded automatically" in caplog.text
    asked = fake_telegram.mention("is it out?")
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, asked)
    assert fake_telegram.sent_texts() == ["for Alice"]
    assert "Version 2" not in str(provider.requests[-1].messages)


@pytest.mark.parametrize("placeholder", [ANONYMOUS_ADMIN, CHANNEL_BOT],
                         ids=["anonymous-admin", "posting-as-a-channel"])
async def test_a_message_sent_on_behalf_of_a_chat_comes_from_that_chat(
        make_tg: TgFactory, fake_telegram: FakeTelegram, placeholder: dict[str, Any]) -> None:
    provider = scripted({"reply": "noted"})
    app, _, _ = await make_tg(provider)
    # An anonymous admin speaks as the group itself; a user may post as their channel.
    speaker = {"id": GROUP, "type": "supergroup", "title": "Test group"} \
        if placeholder is ANONYMOUS_ADMIN else CHANNEL
    update = fake_telegram.mention("please pin the rules", sender=placeholder,
                                   sender_chat=speaker)
    await fake_telegram.wait_for("sendMessage")
    await answered(fake_telegram, app, update)
    assert last_user_text(provider) == \
        f"[{speaker['title']} (id {speaker['id']})]: please pin the rules"
    assert placeholder["first_name"] not in str(provider.requests[-1].messages)


async def test_a_translation_bug_skips_its_update_with_one_line_and_no_traceback(
        tmp_path: Path, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    inbox = Inbox()
    settings = Settings(data_dir=tmp_path, telegram_bot_token=fake_telegram.token,
                        telegram_api_base=fake_telegram.base_url)
    channel = TelegramChannel(settings, polling_timeout=1)
    translate = channel.translator.translate

    def buggy(message: Message, *, event_id: str = "") -> InboundMessage | None:
        if message.text == "trip":
            raise KeyError("a bug in translation")
        return translate(message, event_id=event_id)

    monkeypatch.setattr(channel.translator, "translate", buggy)
    tripped = fake_telegram.private_message("trip")
    after = fake_telegram.private_message("after")
    await channel.start(inbox)
    try:
        await fake_telegram.wait_confirmed(after["update_id"])
    finally:
        await channel.stop()
    assert inbox.texts() == ["after"]
    [warning] = [r for r in caplog.records if r.name.startswith("roost")
                 and r.levelno >= logging.WARNING]
    assert warning.exc_info is None
    assert f"update {tripped['update_id']} could not be translated" in warning.getMessage()
    assert "KeyError" in warning.getMessage() and "test_telegram_inbound.py" in warning.getMessage()


async def test_a_megabyte_sender_name_is_cut(start_tg: StartTg,
                                             fake_telegram: FakeTelegram) -> None:
    inbox = Inbox()
    update = fake_telegram.private_message("hi", sender=user(42, "N" * 2**20))
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(update["update_id"])
    [message] = inbox.messages
    assert message.sender_name.startswith("NNN") and len(message.sender_name) <= 300
