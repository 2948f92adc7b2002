"""Discord under hostile input: malformed gateway payloads, shutdown, redelivered replies.

The real discord.py runs against the fake Discord. A payload the library or
the adapter cannot use costs one warning line and never a traceback, the
client stays connected, and the next ordinary message reaches the core.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from bot.config.settings import Settings
from bot.contracts.messages import OutboundMessage
from bot.testing.app import scripted, settle
from bot.testing.discord import (
    CHANNEL_ID,
    DM_CHANNEL_ID,
    GUILD_ID,
    THREAD_ID,
    FakeDiscord,
    user_payload,
)
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.inbox import RecordingInbox as Inbox
from channels.delivery import DeliveryPolicy
from channels.discord import DiscordChannel
from tests.conftest import AppFactory
from tests.test_slack_hostile import (
    RoostLog,
    roost_log_fixture,  # noqa: F401  (the fixture)
)

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
MESSAGES = r"^/channels/\d+/messages$"


Start = Callable[[Inbox], Awaitable[DiscordChannel]]


@pytest.fixture
async def start(fake_discord: FakeDiscord) -> AsyncIterator[Start]:
    channels: list[DiscordChannel] = []

    async def factory(handler: Inbox) -> DiscordChannel:
        channel = DiscordChannel(Settings(**fake_discord.settings()), guild_ready_timeout=0.05,
                                 delivery=FAST)
        await channel.start(handler)
        channels.append(channel)
        return channel

    yield factory
    for channel in channels:
        await channel.stop()


def _changed(payload: dict[str, Any], /, **fields: Any) -> dict[str, Any]:
    changed = copy.deepcopy(payload)
    changed.update(fields)
    return changed


def _without(payload: dict[str, Any], key: str) -> dict[str, Any]:
    changed = copy.deepcopy(payload)
    del changed[key]
    return changed


HUGE = "9" * 40
MESSAGE_MUTATIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "author-is-text": lambda d: _changed(d, author="mallory"),
    "no-author": lambda d: _without(d, "author"),
    "huge-id": lambda d: _changed(d, id=HUGE),
    "negative-id": lambda d: _changed(d, id="-5"),
    "zero-id": lambda d: _changed(d, id="0"),
    "huge-channel-id": lambda d: _changed(d, channel_id=HUGE),
    "huge-author-id": lambda d: _changed(d, author=user_payload(int(HUGE), "big")),
    "content-is-a-number": lambda d: _changed(d, content=5),
    "content-is-null": lambda d: _changed(d, content=None),
    "content-is-nested": lambda d: _changed(d, content=[[[[["deep"]]]]]),
    "mentions-is-text": lambda d: _changed(d, mentions="everyone"),
    "mentions-of-numbers": lambda d: _changed(d, mentions=[5]),
    "attachment-without-id": lambda d: _changed(d, attachments=[{"id": "x"}]),
    "embeds-of-numbers": lambda d: _changed(d, embeds=[5]),
    "reference-to-no-id": lambda d: _changed(d, type=19, message_reference={"message_id": "x"}),
    "member-is-text": lambda d: _changed(d, member="x", guild_id=str(GUILD_ID)),
    "payload-is-a-list": lambda d: [d],
    "payload-is-text": lambda d: "MESSAGE_CREATE",
    "payload-is-null": lambda d: None,
}


@pytest.mark.parametrize("name", list(MESSAGE_MUTATIONS))
async def test_a_malformed_message_costs_one_warning_and_the_next_message_gets_through(
    fake_discord: FakeDiscord, start: Start, roost_log: RoostLog, name: str,
) -> None:
    inbox = Inbox()
    await start(inbox)
    payload = MESSAGE_MUTATIONS[name](fake_discord.message_payload(
        "hostile", channel_id=DM_CHANNEL_ID, guild=False))
    mark = roost_log.mark()
    await fake_discord.dispatch("MESSAGE_CREATE", payload)
    await fake_discord.dm("hello")
    await inbox.wait_for_text("hello")
    assert [m.text for m in inbox.messages] == ["hello"]
    warnings = [r.getMessage() for r in roost_log.since(mark)]
    assert len(warnings) == 1 and "malformed" in warnings[0], warnings
    assert roost_log.tracebacks() == []


@pytest.mark.parametrize("content", ["nul\x00byte", "lone \ud83d surrogate", "x" * 100_000],
                         ids=["null-byte", "lone-surrogate", "100k-chars"])
async def test_odd_but_valid_content_and_unknown_fields_reach_the_core_quietly(
    fake_discord: FakeDiscord, start: Start, roost_log: RoostLog, content: str,
) -> None:
    inbox = Inbox()
    await start(inbox)
    payload = fake_discord.message_payload(content, channel_id=DM_CHANNEL_ID, guild=False)
    payload.update(brand_new_field={"nested": [1, 2]}, another=None)
    mark = roost_log.mark()
    await fake_discord.push_message(payload)
    # InboundMessage replaces lone surrogates; the adapter passes text through.
    expected = content.replace("\ud83d", "\ufffd")
    assert (await inbox.wait_for_text(expected)).event_id == payload["id"]
    assert roost_log.since(mark) == [] and roost_log.tracebacks() == []


INTERACTION_MUTATIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "data-is-text": lambda d: _changed(d, data="help"),
    "options-is-text": lambda d: _changed(d, data={"id": "7", "name": "help", "type": 1,
                                                   "options": "x"}),
    "options-of-numbers": lambda d: _changed(d, data={"id": "7", "name": "help", "type": 1,
                                                      "options": [5]}),
    "name-is-a-number": lambda d: _changed(d, data={"id": "7", "name": 5, "type": 1}),
    "args-are-an-object": lambda d: _changed(d, data={"id": "7", "name": "help", "type": 1,
                                                      "options": [{"name": "args", "type": 3,
                                                                   "value": {"a": [1]}}]}),
    "id-is-text": lambda d: _changed(d, id="x"),
    "huge-id": lambda d: _changed(d, id=HUGE),
    "huge-channel-id": lambda d: _changed(d, channel_id=HUGE, channel={"id": HUGE, "type": 1}),
    "no-user": lambda d: _without(d, "user"),
    "payload-is-a-list": lambda d: [d],
}


@pytest.mark.parametrize("name", list(INTERACTION_MUTATIONS))
async def test_a_malformed_interaction_costs_one_warning_and_the_next_command_gets_through(
    fake_discord: FakeDiscord, start: Start, roost_log: RoostLog, name: str,
) -> None:
    inbox = Inbox()
    await start(inbox)
    payload = INTERACTION_MUTATIONS[name](fake_discord.interaction_payload(
        "status", channel_id=DM_CHANNEL_ID, guild=False))
    mark = roost_log.mark()
    await fake_discord.dispatch("INTERACTION_CREATE", payload)
    await fake_discord.interaction("help", channel_id=DM_CHANNEL_ID, guild=False)
    await inbox.wait_for_text("/help")
    assert [m.text for m in inbox.messages] == ["/help"]
    warnings = [r.getMessage() for r in roost_log.since(mark)]
    assert len(warnings) == 1 and "malformed" in warnings[0], warnings
    assert roost_log.tracebacks() == []


async def test_a_message_in_a_guild_discord_py_has_not_cached_is_a_group_message(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    inbox = Inbox()
    await start(inbox)
    payload = fake_discord.message_payload("who am I?", channel_id=987654321)
    payload["guild_id"] = "123456789"  # a guild the client never received
    await fake_discord.push_message(payload)
    message = await inbox.wait_for_text("who am I?")
    # Never a DM: a DM is always answered, a group message only when addressed.
    assert (message.chat_type, message.group_id, message.mentioned) == \
        ("group", "123456789", False)


# -- stop_intake -----------------------------------------------------------------------------


async def test_after_stop_intake_messages_wait_for_the_catch_up_and_replies_still_go_out(
    fake_discord: FakeDiscord, start: Start, roost_log: RoostLog,
) -> None:
    inbox = Inbox()
    first = await start(inbox)
    await fake_discord.dm("recorded")
    recorded = await inbox.wait_for_text("recorded")
    await first.stop_intake()
    mark = roost_log.mark()
    late = await fake_discord.dm("said during the shutdown")
    await roost_log.wait_for(lambda r: "arrived while shutting down" in r.getMessage(), mark)
    assert [m.text for m in inbox.messages] == ["recorded"]
    # Runs still finishing during the grace period can reply.
    await first.send(OutboundMessage("discord", str(DM_CHANNEL_ID), "a reply in flight"))
    assert fake_discord.visible() == ["a reply in flight"]
    await first.stop()

    # After the restart, the core's cursor (its last recorded message) covers it.
    second = await start(inbox)
    await second.catch_up({recorded.chat_id: recorded.event_id})
    assert (await inbox.wait_for_text("said during the shutdown")).event_id == str(late)


# -- delivery_id -----------------------------------------------------------------------------


async def test_a_reply_redelivered_after_a_restart_is_not_posted_twice(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    reply = OutboundMessage("discord", str(CHANNEL_ID), ("word " * 600).strip(),
                            chat_type="group", delivery_id="roost-41")
    first = await start(Inbox())
    posted = await first.send(reply)
    await first.stop()
    assert len(fake_discord.posted()) == 2  # 3,000 characters are two messages

    # A new process: the core did not record the delivery and sends it again.
    second = await start(Inbox())
    assert await second.send(reply) == posted
    assert len(fake_discord.posted()) == 2
    nonces = [c.body["nonce"] for c in fake_discord.calls_to("POST", MESSAGES)]
    assert nonces == ["roost-41", "roost-41.1"] * 2
    assert all(c.body["enforce_nonce"] is True for c in fake_discord.calls_to("POST", MESSAGES))


async def test_a_long_delivery_id_becomes_a_stable_nonce_within_discords_limit(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel = await start(Inbox())
    reply = OutboundMessage("discord", str(DM_CHANNEL_ID), "once",
                            delivery_id="roost-" + "7" * 40)
    first = await channel.send(reply)
    assert await channel.send(reply) == first
    [nonce, again] = [c.body["nonce"] for c in fake_discord.calls_to("POST", MESSAGES)]
    assert nonce == again and len(nonce) <= 25
    assert fake_discord.visible() == ["once"]


# -- thread cursors --------------------------------------------------------------------------


async def test_a_thread_with_a_cursor_of_its_own_is_read_once_from_that_cursor(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    thread_cursor = fake_discord.missed("recorded in the thread", channel_id=THREAD_ID)
    in_thread = fake_discord.missed("missed in the thread", channel_id=THREAD_ID)
    channel_cursor = fake_discord.missed("recorded in the channel", channel_id=CHANNEL_ID)
    inbox = Inbox()
    channel = await start(inbox)
    await channel.catch_up({str(CHANNEL_ID): str(channel_cursor),
                            f"{CHANNEL_ID}:{THREAD_ID}": str(thread_cursor)})
    assert [m.event_id for m in inbox.messages] == [str(in_thread)]
    reads = fake_discord.calls_to("GET", rf"^/channels/{THREAD_ID}/messages$")
    assert [c.query["after"] for c in reads] == [str(thread_cursor)]


async def test_logging_is_quiet_for_an_ordinary_conversation(
    fake_discord: FakeDiscord, start: Start, roost_log: RoostLog,
) -> None:
    inbox = Inbox()
    await start(inbox)
    await fake_discord.dm("hello")
    await inbox.wait_for_text("hello")
    assert roost_log.since(0, logging.WARNING) == []


async def test_an_attachment_whose_name_has_a_lone_surrogate_is_recorded_and_answered(
    fake_discord: FakeDiscord, make_app: AppFactory, roost_log: RoostLog,
) -> None:
    app, _, _ = await make_app(scripted({"reply": "got it"}), **fake_discord.settings())
    await app.add_channel(DiscordChannel(app.settings, guild_ready_timeout=0.05, delivery=FAST))
    payload = fake_discord.message_payload("see attached", channel_id=DM_CHANNEL_ID,
                                           guild=False)
    # On the fake CDN, so fetching it (and failing on the mangled URL) stays on 127.0.0.1.
    attachment = fake_discord.attachment(b"\x89PNG", "cat.png", channel_id=DM_CHANNEL_ID)
    payload["attachments"] = [{**attachment, "filename": "cat \ud83d.png",
                               "url": attachment["url"] + "\udc00",
                               "content_type": "image/png\ud83d"}]
    await fake_discord.push_message(payload)
    await fake_discord.wait_for_call("POST", MESSAGES)
    await settle(app)
    assert "got it" in fake_discord.visible()
    assert roost_log.tracebacks() == []
