"""Buttons, presses, edits, deletions and reactions on Discord, through the real discord.py
against the fake: components out, a type-3 interaction acknowledged within Discord's 3 s
and handed in (a late one refused with 10062, as Discord does), edits with the original
id (partial updates and embed unfurls skipped), deletions, reactions in, and the bot's
reaction set, replaced and removed, dropped rather than waited for under a 429."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bot.config.settings import Settings
from bot.contracts.messages import (
    Button,
    ButtonPress,
    MessageDeletion,
    MessageEdit,
    OutboundMessage,
    ReactionEvent,
)
from bot.testing.discord import BOT_ID, CHANNEL_ID, DM_CHANNEL_ID, USER_ID, FakeDiscord
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.inbox import RecordingInbox
from channels.delivery import DeliveryPolicy
from channels.discord import DiscordChannel

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
ROWS = ((Button("Approve", "ap:1", "success"), Button("Deny", "dn:1", "danger")),
        (Button("Approve for this session", "as:1"),))
COMPONENTS = [
    {"type": 1, "components": [
        {"type": 2, "style": 3, "label": "Approve", "custom_id": "ap:1"},
        {"type": 2, "style": 4, "label": "Deny", "custom_id": "dn:1"}]},
    {"type": 1, "components": [
        {"type": 2, "style": 2, "label": "Approve for this session", "custom_id": "as:1"}]}]

Start = Callable[..., Awaitable[tuple[DiscordChannel, RecordingInbox]]]


@pytest.fixture
async def start(fake_discord: FakeDiscord) -> AsyncIterator[Start]:
    channels: list[DiscordChannel] = []

    async def factory(**options: object) -> tuple[DiscordChannel, RecordingInbox]:
        inbox = RecordingInbox()
        channel = DiscordChannel(Settings(**fake_discord.settings()),
                                 guild_ready_timeout=0.05, delivery=FAST, **options)
        await channel.start(inbox)
        channels.append(channel)
        return channel, inbox

    yield factory
    for channel in channels:
        await channel.stop()


def shape(components: list[dict[str, object]]) -> list[dict[str, object]]:
    """Components with only the fields the test names (discord.py adds ``disabled``...)."""
    keep = ("type", "style", "label", "custom_id")
    return [{"type": row["type"], "components": [
        {k: b[k] for k in keep if k in b} for b in row["components"]]}  # type: ignore[attr-defined]
        for row in components]


async def prompt(channel: DiscordChannel, fake: FakeDiscord) -> int:
    sent = await channel.send(OutboundMessage(channel="discord", chat_id=str(CHANNEL_ID),
                                              chat_type="group", text="Run `ls`?",
                                              buttons=ROWS))
    assert sent is not None
    return int(sent)


async def test_buttons_go_out_as_components_under_the_last_piece(
        start: Start, fake_discord: FakeDiscord) -> None:
    channel, _ = await start()
    mid = await prompt(channel, fake_discord)
    assert shape(fake_discord.messages[mid].components) == COMPONENTS
    await channel.send(OutboundMessage(channel="discord", chat_id=str(CHANNEL_ID),
                                       chat_type="group", text="word " * 700, buttons=ROWS))
    first, second = fake_discord.posted(CHANNEL_ID)[-2:]
    assert first.components == []
    assert shape(second.components) == COMPONENTS


async def test_a_press_is_acknowledged_at_once_handed_in_and_answered_ephemerally(
        start: Start, fake_discord: FakeDiscord) -> None:
    channel, inbox = await start()
    mid = await prompt(channel, fake_discord)
    interaction = await fake_discord.press(fake_discord.messages[mid], "ap:1")
    [press] = await inbox.wait_event(ButtonPress)
    assert (press.chat_id, press.message_id, press.data, press.user_id, press.chat_type) == \
        (str(CHANNEL_ID), str(mid), "ap:1", str(USER_ID), "group")
    assert (press.press_id, press.token) == (str(interaction.id), interaction.token)
    assert interaction.acknowledged == 6  # deferred update: the message stays as it is
    await channel.answer_press(press, "Not yours to approve")
    assert [f["content"] for f in interaction.followups] == ["Not yours to approve"]
    assert all(int(f["flags"]) & 64 for f in interaction.followups)  # ephemeral
    assert fake_discord.visible(CHANNEL_ID) == ["Run `ls`?"]


async def test_a_press_acknowledged_too_late_is_refused_and_still_handed_in(
        start: Start, fake_discord: FakeDiscord, caplog: pytest.LogCaptureFixture) -> None:
    channel, inbox = await start()
    mid = await prompt(channel, fake_discord)
    fake_discord.ack_within = 0.0
    with caplog.at_level(logging.INFO, logger="roost.channels.discord"):
        interaction = await fake_discord.press(fake_discord.messages[mid], "dn:1")
        [press] = await inbox.wait_event(ButtonPress)
        [callback] = fake_discord.calls_to("POST", f"/interactions/{interaction.id}/")
        assert callback.status == 404  # 10062 Unknown interaction
        # The follow-up of an interaction never acknowledged fails too: logged, not raised.
        await channel.answer_press(press, "Denied")
    assert interaction.followups == []
    messages = [r.getMessage() for r in caplog.records]
    assert any("could not acknowledge the press" in m and "10062" in m for m in messages)
    assert any("was not shown" in m for m in messages)


async def test_an_edit_arrives_with_the_original_id_and_unfurls_are_not_edits(
        start: Start, fake_discord: FakeDiscord, caplog: pytest.LogCaptureFixture) -> None:
    _, inbox = await start()
    mid = await fake_discord.guild_message("the total is 41", mention=True)
    [original] = await inbox.wait_for(1)
    with caplog.at_level(logging.WARNING):
        await fake_discord.edit_message(mid, "embeds only", partial=True)
        await fake_discord.edit_message(mid, "the total is 42", mention_bot=True)
        [edit] = await inbox.wait_event(MessageEdit)
    assert edit.message.message_id == original.message_id == str(mid)
    assert edit.message.text == "the total is 42"
    assert edit.message.mentioned
    assert edit.message.event_id != original.event_id
    assert inbox.texts() == ["the total is 41"]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("roost")] == []


async def test_a_deletion_is_handed_in(start: Start, fake_discord: FakeDiscord) -> None:
    _, inbox = await start()
    mid = await fake_discord.guild_message("oops", mention=True)
    await inbox.wait_for(1)
    await fake_discord.delete_message(mid)
    [deletion] = await inbox.wait_event(MessageDeletion)
    assert (deletion.chat_id, deletion.message_ids, deletion.thread_id) == \
        (str(CHANNEL_ID), (str(mid),), None)


async def test_reactions_are_handed_in_but_not_the_bots_own(
        start: Start, fake_discord: FakeDiscord) -> None:
    channel, inbox = await start()
    mid = await prompt(channel, fake_discord)
    await fake_discord.user_reaction(CHANNEL_ID, mid, "👎", user_id=BOT_ID)  # the bot itself
    await fake_discord.user_reaction(CHANNEL_ID, mid, "👍")
    await fake_discord.user_reaction(CHANNEL_ID, mid, "👍", added=False)
    events = await inbox.wait_event(ReactionEvent, 2)
    assert [(e.message_id, e.user_id, e.emoji, e.added) for e in events] == [
        (str(mid), str(USER_ID), "👍", True), (str(mid), str(USER_ID), "👍", False)]
    assert events[0].user_name == "Alice"


async def test_the_bots_reaction_is_set_replaced_and_removed(
        start: Start, fake_discord: FakeDiscord) -> None:
    channel, inbox = await start()
    mid = await fake_discord.guild_message("hello", mention=True)
    await inbox.wait_for(1)
    chat = str(CHANNEL_ID)
    assert await channel.react(chat, str(mid), "👀")
    assert fake_discord.reactions[mid] == ["👀"]
    assert await channel.react(chat, str(mid), "✅")
    assert fake_discord.reactions[mid] == ["✅"]
    assert await channel.react(chat, str(mid), None)
    assert fake_discord.reactions[mid] == []
    # Discord's refusals: not raised.
    assert not await channel.react(chat, "123456789", "👀")  # 10008 Unknown Message
    assert not await channel.react(chat, str(mid), "nope:42")  # 10014 Unknown Emoji
    assert [c.status for c in fake_discord.calls_to("PUT", "/reactions/")][-2:] == [404, 400]


async def test_a_rate_limited_reaction_is_dropped_and_the_reply_goes_out(
        start: Start, fake_discord: FakeDiscord) -> None:
    channel, inbox = await start(react_wait=0.3)
    mid = await fake_discord.guild_message("hello", mention=True)
    await inbox.wait_for(1)
    fake_discord.fail_next(429, retry_after=30, method="PUT", path="/reactions/")
    reaction = asyncio.ensure_future(channel.react(str(CHANNEL_ID), str(mid), "👀"))
    await fake_discord.wait_for_call("PUT", "/reactions/", status=429)
    await channel.send(OutboundMessage(channel="discord", chat_id=str(CHANNEL_ID),
                                       chat_type="group", text="the answer"))
    assert not reaction.done()  # the reply did not wait behind it
    assert not await reaction  # dropped, not waited out
    assert fake_discord.visible(CHANNEL_ID) == ["the answer"]
    assert len(fake_discord.calls_to("PUT", "/reactions/")) == 1
    assert mid not in fake_discord.reactions


async def test_the_outcome_edit_replaces_text_and_removes_the_buttons(
        start: Start, fake_discord: FakeDiscord) -> None:
    channel, _ = await start()
    mid = await prompt(channel, fake_discord)
    assert await channel.edit(str(CHANNEL_ID), str(mid), "Approved by alice")
    shown = fake_discord.messages[mid]
    assert (shown.content, shown.components) == ("Approved by alice", [])
    assert await channel.edit(str(CHANNEL_ID), str(mid), "Approved by alice", ROWS[:1])
    assert shape(fake_discord.messages[mid].components) == COMPONENTS[:1]
    assert not await channel.edit(str(CHANNEL_ID), "123456789", "gone")


async def test_a_prompt_with_buttons_does_not_take_a_pending_commands_answer(
        start: Start, fake_discord: FakeDiscord) -> None:
    channel, inbox = await start()
    interaction = await fake_discord.interaction("ask", guild=False, channel_id=DM_CHANNEL_ID)
    [command] = await inbox.wait_for(1)
    await channel.send(OutboundMessage(channel="discord", chat_id=command.chat_id,
                                       text="Run `ls`?", buttons=ROWS))
    [prompt_message] = fake_discord.posted(DM_CHANNEL_ID)
    assert shape(prompt_message.components) == COMPONENTS
    assert prompt_message.interaction_id is None
    await channel.send(OutboundMessage(channel="discord", chat_id=command.chat_id,
                                       text="done"))
    [answer] = [m for m in fake_discord.posted(DM_CHANNEL_ID) if m.interaction_id]
    assert answer.interaction_id == interaction and answer.content == "done"
