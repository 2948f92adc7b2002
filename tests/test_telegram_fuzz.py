"""Fuzz: real-shaped Telegram updates and their mutations, by long polling into a running Roost.

The corpus holds update shapes as the Bot API documents them (and aiogram's own
tests use): messages of every common kind, an edit, a channel post, a callback
query, a membership change, an automatic forward. Hypothesis mutates them (wrong
types, missing fields, megabyte strings, null bytes, lone surrogates, nesting
far past any decoder's depth, huge and negative ids, unknown fields) and the
fake Bot API serves them to the real aiogram. After every batch an ordinary
message from a new user must be answered, polling must still run, and Roost's
own loggers must have logged no traceback and at most one warning per bad update.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bot.testing.app import scripted
from bot.testing.fuzz import DEEP, HUGE, MEGABYTE, Mutation, Mutator, as_json
from bot.testing.telegram import ALICE, FakeTelegram, user
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import Limits
from channels.telegram import MAX_UPDATE_ID, TelegramChannel
from tests.test_telegram import TgFactory
from tests.test_telegram import make_tg as _make_tg  # noqa: F401  (the fixture)

DATE = 1_700_000_000
BOT = user(123456, "TestBot", "test_bot", is_bot=True)
"""The fake's bot (its token is ``123456:...``)."""
TELEGRAM = user(777000, "Telegram")
PRIVATE = {"id": 42, "first_name": "Alice", "username": "alice", "type": "private"}
GROUP = {"id": -1001234567890, "title": "Test group", "type": "supergroup"}
FORUM = {**GROUP, "is_forum": True}
CHANNEL = {"id": -1009876543210, "title": "Roost News", "username": "roost_news",
           "type": "channel"}


def message(chat: dict[str, Any], sender: dict[str, Any] | None = ALICE,
            **fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"message_id": 1001, "date": DATE, "chat": chat}
    if sender is not None:
        data["from"] = sender
    return {**data, **fields}


def mention(offset: int = 0) -> list[dict[str, Any]]:
    return [{"type": "mention", "offset": offset, "length": 9}]


def media(unique: str, **fields: Any) -> dict[str, Any]:
    return {"file_id": f"AgACAgIAAxkBAAI{unique}", "file_unique_id": unique, **fields}


CORPUS: dict[str, dict[str, Any]] = {
    "private text": {"message": message(PRIVATE, text="hello there")},
    "private command": {"message": message(PRIVATE, text="/start deep-link", entities=[
        {"type": "bot_command", "offset": 0, "length": 6}])},
    "group mention": {"message": message(GROUP, text="@test_bot what's up? 😀",
                                         entities=mention())},
    "text mention": {"message": message(GROUP, text="TestBot, hi", entities=[
        {"type": "text_mention", "offset": 0, "length": 7, "user": BOT}])},
    "reply to the bot": {"message": message(GROUP, text="and then?", reply_to_message=message(
        GROUP, BOT, message_id=1000, text="earlier"))},
    "forum topic message": {"message": message(
        FORUM, text="@test_bot in the topic", entities=mention(), message_thread_id=7,
        is_topic_message=True, reply_to_message=message(
            FORUM, message_id=7, message_thread_id=7,
            forum_topic_created={"name": "Topic", "icon_color": 7322096}))},
    "photo with caption": {"message": message(
        PRIVATE, caption="what is this?", caption_entities=[
            {"type": "bold", "offset": 0, "length": 4}],
        photo=[media("p1", width=90, height=67, file_size=1200),
               media("p2", width=1280, height=960, file_size=131_000)])},
    "document": {"message": message(PRIVATE, document=media(
        "d", file_name="report.pdf", mime_type="application/pdf", file_size=52_000))},
    "voice": {"message": message(PRIVATE, voice=media(
        "v", duration=12, mime_type="audio/ogg", file_size=20_480))},
    "sticker": {"message": message(PRIVATE, sticker=media(
        "s", type="regular", width=512, height=512, emoji="😀", set_name="HotCherry",
        is_animated=False, is_video=False))},
    "location": {"message": message(PRIVATE, location={"latitude": 51.5074,
                                                       "longitude": -0.1278})},
    "contact": {"message": message(PRIVATE, contact={
        "phone_number": "+441234567890", "first_name": "Ada", "user_id": 77})},
    "poll": {"message": message(GROUP, poll={
        "id": "5", "question": "Lunch?", "total_voter_count": 0, "type": "regular",
        "options": [{"persistent_id": "a", "text": "Pizza", "voter_count": 0},
                    {"persistent_id": "b", "text": "Sushi", "voter_count": 0}],
        "is_closed": False, "is_anonymous": True, "allows_multiple_answers": False,
        "allows_revoting": False, "members_only": False})},
    "edited message": {"edited_message": message(PRIVATE, text="hello (edited)",
                                                 edit_date=DATE + 60)},
    "channel post": {"channel_post": message(CHANNEL, None, sender_chat=CHANNEL,
                                             text="New release")},
    "callback query": {"callback_query": {
        "id": "4382bfdwdsb323b2d9", "from": ALICE, "chat_instance": "-5",
        "data": "Data from button callback",
        "message": message(PRIVATE, BOT, text="pick one")}},
    "my_chat_member": {"my_chat_member": {
        "chat": GROUP, "from": ALICE, "date": DATE,
        "old_chat_member": {"user": BOT, "status": "left"},
        "new_chat_member": {"user": BOT, "status": "member"}}},
    "automatic forward": {"message": message(
        GROUP, TELEGRAM, sender_chat=CHANNEL, is_automatic_forward=True,
        forward_origin={"type": "channel", "chat": CHANNEL, "message_id": 55, "date": DATE},
        text="Version 2 @test_bot", entities=mention(10))},
    "anonymous admin": {"message": message(
        GROUP, user(1087968824, "Group", "GroupAnonymousBot", is_bot=True),
        sender_chat=GROUP, text="@test_bot pin this", entities=mention())},
    "new members": {"message": message(GROUP, new_chat_members=[user(500, "Newcomer")])},
}

MUTATOR = Mutator([  # hostile values, Telegram's command and mention syntax among them
    None, True, False, 0, -1, 1.5, float("inf"), -(2**63), 2**63, 2**64 + 1, -(2**100),
    10**300, "", "x", "\x00", "a\x00b\x00", "\ud83d", "\udc00x\ud83d", MEGABYTE,
    "😀" * 100_000, "@test_bot", "/start", "/help@test_bot", "private", "supergroup",
    "channel", "mention", [], [1, "a", None], {}, {"id": 1}, {"a": {"b": {"c": []}}},
    DEEP, [DEEP], {"id": DEEP}, HUGE,
])

mutations = MUTATOR.strategy(max_node=500)
bad_updates = st.tuples(st.sampled_from(sorted(CORPUS)), st.lists(mutations, max_size=3))


def set_to(name: str, value: Any, *path: str | int) -> tuple[str, list[Mutation]]:
    """Corpus update ``name`` with the node at ``path`` replaced by ``value``."""
    return name, [MUTATOR.replacing({**CORPUS[name], "update_id": 0}, value, *path)]


WHOLE_CORPUS: list[tuple[str, list[Mutation]]] = [(name, []) for name in CORPUS]
"""Every real shape as it is: none may cost a warning."""
SURROGATE_MENTION = [set_to("group mention", "\udc00x\ud83d", "message", "text")]
"""A lone surrogate in a text with a mention entity (the entity offsets are UTF-16)."""
LONG_NUMBER = [set_to("private text", HUGE, "message", "message_id"), ("private text", [])]
"""A number longer than Python decodes, in the same getUpdates answer as a good update."""
MONSTERS = [set_to("group mention", MEGABYTE, "message", "text"),
            set_to("photo with caption", DEEP, "message", "caption"),
            set_to("contact", "a\x00b\x00", "message", "contact", "first_name")]


@dataclass
class Fuzzed:
    """The Roost every example talks to, and where the next ids come from."""

    channel: TelegramChannel
    update_ids: Iterator[int] = field(default_factory=lambda: itertools.count(10_000_000))
    senders: Iterator[int] = field(default_factory=lambda: itertools.count(7_000_000))


@pytest.fixture(name="fuzzed")
async def fuzzed(make_tg: TgFactory) -> Fuzzed:
    """One app for every example: what must survive is the process that saw them all."""
    _, channel, _ = await make_tg(scripted({"reply": "ok"}, loop=True),
                                  channel={"limits": Limits(), "poll_backoff": 0.01})
    return Fuzzed(channel)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(bad_updates, min_size=1, max_size=3))
@example(batch=WHOLE_CORPUS)
@example(batch=SURROGATE_MENTION)
@example(batch=LONG_NUMBER)
@example(batch=MONSTERS)
async def test_roost_survives_mutated_updates_and_answers_the_next_message(
        fuzzed: Fuzzed, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture,
        batch: list[tuple[str, list[Mutation]]]) -> None:
    logged = len(caplog.records)
    for name, changes in batch:
        update: Any = copy.deepcopy(CORPUS[name])
        update["update_id"] = next(fuzzed.update_ids)
        for value in update.values():
            if isinstance(value, dict) and "message_id" in value:
                value["message_id"] = update["update_id"]
        for change in changes:
            update = MUTATOR.apply(update, change)
        update_id = update.get("update_id") if isinstance(update, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool) \
                or not 0 < update_id <= MAX_UPDATE_ID:
            # Queued under an ordinary id of the server's, as if a proxy had
            # garbled it on the way: a later update's offset confirms it.
            update_id = next(fuzzed.update_ids)
        fake_telegram.push_json(as_json(update), update_id)
    # The next people: someone new in a private chat and in a group. New chats:
    # the corpus group's history grows by megabytes over the examples, and its
    # compaction is not what this measures. Update ids come from the same
    # sequence as the batch's: an id the fake made up could equal a later one.
    sender = user(next(fuzzed.senders), "Next")
    chat = {"id": sender["id"], "type": "private", "first_name": "Next"}
    group = {**GROUP, "id": -1005000000000 - sender["id"]}
    direct, grouped = next(fuzzed.update_ids), next(fuzzed.update_ids)
    fake_telegram.push_update({"update_id": direct, "message": message(
        chat, sender, message_id=direct, text="are you there?")})
    fake_telegram.push_update({"update_id": grouped, "message": message(
        group, sender, message_id=grouped, text="@test_bot and here?", entities=mention())})

    def answered() -> bool:
        replies = fake_telegram.sent()
        return any(c.params.get("chat_id") == sender["id"] for c in replies) and any(
            c.params.get("chat_id") == group["id"] for c in replies)

    await fake_telegram.wait_until(answered, limit=15)
    polling = fuzzed.channel.polling
    assert polling is not None and not polling.done()
    ours = [r for r in caplog.records[logged:] if r.name.startswith("roost")]
    assert [r for r in ours if r.exc_info] == [], [r.getMessage()[:300] for r in ours]
    warnings = [r for r in ours if r.levelno >= logging.WARNING]
    assert len(warnings) <= len(batch), [w.getMessage()[:300] for w in warnings]
    assert all("\n" not in w.getMessage() for w in warnings)
