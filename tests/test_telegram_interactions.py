"""Buttons, presses, edits and reactions on Telegram, through the real aiogram against the
fake Bot API: inline keyboards out, callback queries in and answered (late and repeated
answers refused as Telegram refuses them), people's edits in with their message's id,
reactions in (only when asked for) and the bot's own reactions out, dropped rather than
delaying a reply."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiogram.exceptions import TelegramBadRequest
from aiogram.methods import SetMessageReaction
from aiogram.types import ReactionTypeEmoji

from bot.contracts.messages import (
    Button,
    ButtonPress,
    InboundMessage,
    MessageEdit,
    OutboundFile,
    OutboundMessage,
    ReactionEvent,
)
from bot.testing.inbox import RecordingInbox
from bot.testing.telegram import ALICE, BOB, FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from bot.testing.telegram.interactions import QUERY_TOO_OLD
from channels.telegram import TelegramChannel
from tests.test_telegram_intake import StartTg
from tests.test_telegram_intake import start_tg as _start_tg  # noqa: F401  (the fixture)

ROWS = ((Button("Approve", "ap:1", "success"), Button("Deny", "dn:1", "danger")),
        (Button("Approve for this session", "as:1"),))
KEYBOARD = {"inline_keyboard": [
    [{"text": "Approve", "callback_data": "ap:1"}, {"text": "Deny", "callback_data": "dn:1"}],
    [{"text": "Approve for this session", "callback_data": "as:1"}]]}


async def prompt(channel: TelegramChannel, fake: FakeTelegram, chat: int = ALICE["id"]) -> int:
    """Send a message with the approval buttons; its id."""
    sent = await channel.send(OutboundMessage(channel="telegram", chat_id=str(chat),
                                              text="Run `ls`?", buttons=ROWS))
    assert sent is not None
    return int(sent)


async def test_buttons_go_out_as_an_inline_keyboard_under_the_last_piece(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    channel = await start_tg(RecordingInbox())
    mid = await prompt(channel, fake_telegram)
    assert fake_telegram.messages[(ALICE["id"], mid)]["reply_markup"] == KEYBOARD
    long_reply = "word " * 1500  # two pieces
    last = await channel.send(OutboundMessage(channel="telegram", chat_id=str(ALICE["id"]),
                                              text=long_reply, buttons=ROWS))
    assert last is not None
    first, second = fake_telegram.sent()[-2:]
    assert "reply_markup" not in first.params
    assert second.params["reply_markup"] == KEYBOARD


async def test_a_press_is_handed_in_and_answered_once(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = RecordingInbox()
    channel = await start_tg(inbox)
    mid = await prompt(channel, fake_telegram)
    update = fake_telegram.press(mid, "ap:1")
    [press] = await inbox.wait_event(ButtonPress)
    assert (press.channel, press.chat_id, press.message_id, press.data) == \
        ("telegram", str(ALICE["id"]), str(mid), "ap:1")
    assert (press.user_id, press.user_name, press.chat_type) == (str(ALICE["id"]), "Alice",
                                                                 "direct")
    assert press.press_id == update["callback_query"]["id"]
    await channel.answer_press(press, "Approved", alert=True)
    query = fake_telegram.interactions.queries[press.press_id]
    assert (query.answered, query.text, query.show_alert) == (True, "Approved", True)
    # A second answer is refused by Telegram; the adapter logs it and goes on.
    await channel.answer_press(press, "again")
    assert fake_telegram.calls_of("answerCallbackQuery")[-1].error == QUERY_TOO_OLD
    assert query.text == "Approved"


async def test_a_press_answered_too_late_is_logged_not_raised(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    inbox = RecordingInbox()
    channel = await start_tg(inbox)
    mid = await prompt(channel, fake_telegram)
    fake_telegram.interactions.answer_within = 0.0
    fake_telegram.press(mid, "dn:1")
    [press] = await inbox.wait_event(ButtonPress)
    with caplog.at_level(logging.INFO, logger="roost.channels.telegram"):
        await channel.answer_press(press, "Denied")
    [call] = fake_telegram.calls_of("answerCallbackQuery")
    assert (call.status, call.error) == (400, QUERY_TOO_OLD)
    assert any("was not answered in time" in r.getMessage() for r in caplog.records)


async def test_a_persons_edit_arrives_with_the_original_message_id(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = RecordingInbox()
    await start_tg(inbox)
    update = fake_telegram.private_message("the total is 41")
    [original] = await inbox.wait_for(1)
    fake_telegram.edit_by_user(update, "the total is 42")
    [edit] = await inbox.wait_event(MessageEdit)
    assert isinstance(edit.message, InboundMessage)
    assert edit.message.message_id == original.message_id
    assert edit.message.text == "the total is 42"
    assert edit.message.event_id != original.event_id
    assert edit.edited_at > 0
    assert inbox.texts() == ["the total is 41"]  # an edit is not a new message


async def test_reactions_arrive_only_because_they_are_asked_for(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = RecordingInbox()
    channel = await start_tg(inbox)
    mid = await prompt(channel, fake_telegram)
    fake_telegram.user_reaction(ALICE["id"], mid, "👍")
    [added] = await inbox.wait_event(ReactionEvent)
    assert (added.message_id, added.user_id, added.emoji, added.added) == \
        (str(mid), str(ALICE["id"]), "👍", True)
    fake_telegram.user_reaction(ALICE["id"], mid, "👎", old="👍")
    events = await inbox.wait_event(ReactionEvent, 3)
    assert [(e.emoji, e.added) for e in events[1:]] == [("👍", False), ("👎", True)]
    polls = fake_telegram.calls_of("getUpdates")
    assert "message_reaction" in polls[-1].params["allowed_updates"]
    assert {"callback_query", "edited_message"} <= set(polls[-1].params["allowed_updates"])


async def test_the_fake_withholds_reactions_from_a_bot_that_did_not_ask(
        fake_telegram: FakeTelegram) -> None:
    fake_telegram.user_reaction(ALICE["id"], 5, "👍")
    fake_telegram.private_message("hi")
    served = await fake_telegram.queue.get_updates({"allowed_updates": ["message"]})
    assert [next(k for k in u if k != "update_id") for u in served] == ["message"]
    served = await fake_telegram.queue.get_updates({})
    assert [next(k for k in u if k != "update_id") for u in served] == ["message"]


async def test_the_bots_reaction_is_set_replaced_and_removed(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    channel = await start_tg(RecordingInbox())
    update = fake_telegram.private_message("hello")
    chat, mid = ALICE["id"], update["message"]["message_id"]
    await fake_telegram.wait_confirmed(update["update_id"])
    reactions = fake_telegram.interactions.reactions
    assert await channel.react(str(chat), str(mid), "👀")
    assert reactions[(chat, mid)] == ["👀"]
    assert await channel.react(str(chat), str(mid), "👍")
    assert reactions[(chat, mid)] == ["👍"]
    assert await channel.react(str(chat), str(mid), "❤️")  # as keyboards type it
    assert reactions[(chat, mid)] == ["❤"]
    assert await channel.react(str(chat), str(mid), None)
    assert (chat, mid) not in reactions
    # Not on Telegram's list: not sent at all.
    calls = len(fake_telegram.calls_of("setMessageReaction"))
    assert not await channel.react(str(chat), str(mid), "✅")
    assert len(fake_telegram.calls_of("setMessageReaction")) == calls
    # A message that is gone: False, no exception.
    assert not await channel.react(str(chat), "999999", "👀")
    assert fake_telegram.calls_of("setMessageReaction")[-1].error == \
        "Bad Request: message to react not found"


async def test_the_fake_refuses_a_reaction_off_the_list_as_telegram_does(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    channel = await start_tg(RecordingInbox())
    mid = await prompt(channel, fake_telegram)
    assert channel.bot is not None
    with pytest.raises(TelegramBadRequest, match="REACTION_INVALID"):
        await channel.bot(SetMessageReaction(chat_id=ALICE["id"], message_id=mid,
                                             reaction=[ReactionTypeEmoji(emoji="✅")]))


async def test_a_reaction_gives_way_to_a_reply_waiting_out_a_rate_limit(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    channel = await start_tg(RecordingInbox())
    update = fake_telegram.private_message("hello")
    await fake_telegram.wait_confirmed(update["update_id"])
    fake_telegram.fail("sendMessage", 429, retry_after=1)
    reply = asyncio.ensure_future(channel.send(OutboundMessage(
        channel="telegram", chat_id=str(ALICE["id"]), text="the answer")))
    await fake_telegram.wait_for("sendMessage", ok=False)
    await fake_telegram.wait_until(lambda: fake_telegram.calls_of("sendMessage")[0].status
                                   == 429)
    # The reply waits out the chat's window; the reaction is dropped, not queued.
    assert not await channel.react(str(ALICE["id"]), str(update["message"]["message_id"]),
                                   "👀")
    assert fake_telegram.calls_of("setMessageReaction") == []
    assert await reply is not None
    assert fake_telegram.sent_texts(ALICE["id"]) == ["the answer"]
    assert fake_telegram.violations == []
    # With the chat free again it is set.
    assert await channel.react(str(ALICE["id"]), str(update["message"]["message_id"]), "👀")


async def test_the_outcome_edit_replaces_text_and_removes_the_buttons(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    channel = await start_tg(RecordingInbox())
    mid = await prompt(channel, fake_telegram)
    assert await channel.edit(str(ALICE["id"]), str(mid), "Approved by Alice")
    shown = fake_telegram.messages[(ALICE["id"], mid)]
    assert shown["text"] == "Approved by Alice" and "reply_markup" not in shown
    # Again, identical: Telegram says "not modified"; that is done, not an error.
    assert await channel.edit(str(ALICE["id"]), str(mid), "Approved by Alice")
    assert "message is not modified" in fake_telegram.calls_of("editMessageText")[-1].error
    # Buttons can be put back (or changed) with the text unchanged.
    assert await channel.edit(str(ALICE["id"]), str(mid), "Approved by Alice",
                              buttons=ROWS[:1])
    assert fake_telegram.messages[(ALICE["id"], mid)]["reply_markup"] == \
        {"inline_keyboard": KEYBOARD["inline_keyboard"][:1]}
    assert not await channel.edit(str(ALICE["id"]), "999999", "gone")
    assert fake_telegram.calls_of("editMessageText")[-1].error == \
        "Bad Request: message to edit not found"


async def test_a_press_in_a_group_names_the_presser(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = RecordingInbox()
    channel = await start_tg(inbox)
    group = -1001234567890
    fake_telegram.group_message("hi", chat_id=group)
    mid = await prompt(channel, fake_telegram, chat=group)
    fake_telegram.press(mid, "ap:1", chat_id=group, sender=BOB)
    [press] = await inbox.wait_event(ButtonPress)
    assert (press.chat_id, press.chat_type, press.user_id) == (str(group), "group",
                                                               str(BOB["id"]))


async def test_buttons_stay_under_the_text_of_a_reply_with_a_file(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    channel = await start_tg(RecordingInbox())
    path = tmp_path / "command.txt"
    path.write_bytes(b"ls -la /tmp\n")
    command = OutboundFile(path=str(path), name="command.txt", mime_type="text/plain",
                           size=path.stat().st_size)
    await channel.send(OutboundMessage(channel="telegram", chat_id=str(ALICE["id"]),
                                       text="Run this command?", buttons=ROWS,
                                       files=(command,)))
    [text] = fake_telegram.sent()
    assert (text.params["text"], text.params["reply_markup"]) == ("Run this command?",
                                                                  KEYBOARD)
    [document] = fake_telegram.sent("sendDocument")
    assert "caption" not in document.params


async def test_an_edit_that_drops_the_mention_arrives_unaddressed(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = RecordingInbox()
    await start_tg(inbox)
    update = fake_telegram.mention("what is 6 * 7?")
    [original] = await inbox.wait_for(1)
    assert original.mentioned
    fake_telegram.edit_by_user(update, "never mind")
    [edit] = await inbox.wait_event(MessageEdit)
    assert (edit.message.message_id, edit.message.mentioned, edit.message.chat_type) == \
        (original.message_id, False, "group")
