"""Buttons, presses, edits, deletions and reactions on Slack, through the real slack-bolt and
slack_sdk against the fake: Block Kit actions out, block_actions payloads in on the events
endpoint (form-encoded ``payload=``, signed) and over Socket Mode (``interactive``, acked),
notes through the response_url, edits with the original ts (unfurls skipped), deletions,
reactions in, and reactions.add/remove with Slack's refusals."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

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
from bot.testing.inbox import RecordingInbox
from bot.testing.slack import ALICE, CHANNEL, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from bot.testing.slack.interactive import action_body
from channels.delivery import DeliveryPolicy
from channels.slack import SlackChannel
from channels.slack.common import manifest

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
ROWS = ((Button("Approve", "ap:1", "success"), Button("Deny", "dn:1", "danger")),
        (Button("Approve for this session", "as:1"),))

Start = Callable[..., Awaitable[tuple[SlackChannel, RecordingInbox]]]


@pytest.fixture
async def start(fake_slack: FakeSlack) -> AsyncIterator[Start]:
    channels: list[SlackChannel] = []

    async def factory(*, socket_mode: bool = False) -> tuple[SlackChannel, RecordingInbox]:
        inbox = RecordingInbox()
        channel = SlackChannel(Settings(**fake_slack.settings(socket_mode=socket_mode)),
                               host="127.0.0.1", policy=FAST)
        await channel.start(inbox)
        if not socket_mode:
            fake_slack.events_url = channel.events_url
        channels.append(channel)
        return channel, inbox

    yield factory
    for channel in channels:
        await channel.stop()


def buttons_of(blocks: list[dict[str, Any]]) -> list[list[tuple[str, str, str | None]]]:
    """The buttons of each ``actions`` block: (label, value, style)."""
    return [[(e["text"]["text"], e["value"], e.get("style")) for e in b["elements"]]
            for b in blocks if b["type"] == "actions"]


async def prompt(channel: SlackChannel) -> str:
    sent = await channel.send(OutboundMessage(channel="slack", chat_id=CHANNEL,
                                              chat_type="group", text="Run `ls`?",
                                              buttons=ROWS))
    assert sent is not None
    return sent


async def test_buttons_go_out_as_actions_blocks_under_the_last_piece(
        start: Start, fake_slack: FakeSlack) -> None:
    channel, _ = await start()
    ts = await prompt(channel)
    posted = fake_slack.messages[ts]
    assert buttons_of(posted.blocks) == [
        [("Approve", "ap:1", "primary"), ("Deny", "dn:1", "danger")],
        [("Approve for this session", "as:1", None)]]
    assert posted.blocks[0] == {"type": "section",
                                "text": {"type": "mrkdwn", "text": "Run `ls`?"}}
    await channel.send(OutboundMessage(channel="slack", chat_id=CHANNEL, chat_type="group",
                                       text="word " * 1000, buttons=ROWS))
    first, second = list(fake_slack.messages.values())[-2:]
    assert first.blocks == [] and buttons_of(second.blocks)


async def test_a_press_posted_to_the_events_endpoint_is_acked_and_answered(
        start: Start, fake_slack: FakeSlack) -> None:
    channel, inbox = await start()
    ts = await prompt(channel)
    payload = fake_slack.block_actions(fake_slack.messages[ts], "ap:1")
    delivery = await fake_slack.post_action(payload)
    assert delivery.status == 200
    [press] = await inbox.wait_event(ButtonPress)
    assert (press.chat_id, press.message_id, press.data, press.user_id, press.chat_type) == \
        (CHANNEL, ts, "ap:1", ALICE, "group")
    assert (press.press_id, press.token) == (payload["trigger_id"], payload["response_url"])
    await channel.answer_press(press, "Not yours to approve")
    [note] = await fake_slack.wait_for_responses(1)
    assert note.body == {"text": "Not yours to approve", "response_type": "ephemeral",
                         "replace_original": False}


async def test_a_forged_press_is_refused(start: Start, fake_slack: FakeSlack) -> None:
    channel, inbox = await start()
    ts = await prompt(channel)
    delivery = await fake_slack.post_body(
        action_body(fake_slack.block_actions(fake_slack.messages[ts], "ap:1")),
        content_type="application/x-www-form-urlencoded", forge=True)
    assert delivery.status == 401
    assert inbox.events == []


async def test_a_press_over_socket_mode_is_acked_and_handed_in(
        start: Start, fake_slack: FakeSlack) -> None:
    channel, inbox = await start(socket_mode=True)
    await fake_slack.wait_for_socket()
    ts = await prompt(channel)
    envelope = await fake_slack.socket_action(
        fake_slack.block_actions(fake_slack.messages[ts], "dn:1"))
    await fake_slack.wait_for_ack(envelope)
    [press] = await inbox.wait_event(ButtonPress)
    assert press.data == "dn:1"


async def test_an_edit_arrives_with_the_original_ts_and_unfurls_are_not_edits(
        start: Start, fake_slack: FakeSlack) -> None:
    _, inbox = await start()
    original = fake_slack.message(fake_slack.mention("the total is 41"))
    await fake_slack.post_event(original)
    [first] = await inbox.wait_for(1)
    await fake_slack.post_event(fake_slack.message_changed(original, "", unfurl=True))
    await fake_slack.post_event(fake_slack.message_changed(
        original, fake_slack.mention("the total is 42")))
    [edit] = await inbox.wait_event(MessageEdit)
    assert edit.message.message_id == first.message_id == original["ts"]
    assert edit.message.text == "the total is 42" and edit.message.mentioned
    assert edit.message.event_id != first.event_id
    assert inbox.texts() == ["the total is 41"]
    assert len(inbox.events) == 1


async def test_a_deletion_is_handed_in(start: Start, fake_slack: FakeSlack) -> None:
    _, inbox = await start()
    original = fake_slack.message(fake_slack.mention("oops"))
    await fake_slack.post_event(original)
    await inbox.wait_for(1)
    await fake_slack.post_event(fake_slack.message_deleted(original))
    [deletion] = await inbox.wait_event(MessageDeletion)
    assert (deletion.chat_id, deletion.message_ids) == (CHANNEL, (original["ts"],))


async def test_reactions_are_handed_in_but_not_the_bots_own(
        start: Start, fake_slack: FakeSlack) -> None:
    channel, inbox = await start()
    ts = await prompt(channel)
    await fake_slack.post_event(fake_slack.reaction(CHANNEL, ts, "eyes",
                                                    user=fake_slack.bot_user_id))
    await fake_slack.post_event(fake_slack.reaction(CHANNEL, ts, "+1"))
    await fake_slack.post_event(fake_slack.reaction(CHANNEL, ts, "partyparrot", added=False))
    events = await inbox.wait_event(ReactionEvent, 2)
    assert [(e.message_id, e.user_id, e.emoji, e.added) for e in events] == [
        (ts, ALICE, "👍", True), (ts, ALICE, ":partyparrot:", False)]


async def test_the_bots_reaction_is_set_replaced_and_removed_and_refusals_are_false(
        start: Start, fake_slack: FakeSlack, caplog: pytest.LogCaptureFixture) -> None:
    channel, inbox = await start()
    original = fake_slack.message(fake_slack.mention("hello"))
    await fake_slack.post_event(original)
    await inbox.wait_for(1)
    key = (CHANNEL, original["ts"])
    assert await channel.react(CHANNEL, original["ts"], "👀")
    assert fake_slack.reactions[key] == ["eyes"]
    assert await channel.react(CHANNEL, original["ts"], "✅")
    assert fake_slack.reactions[key] == ["white_check_mark"]
    assert await channel.react(CHANNEL, original["ts"], None)
    assert fake_slack.reactions[key] == []
    assert not await channel.react(CHANNEL, "1.000001", "👀")
    assert not await channel.react(CHANNEL, original["ts"], ":no_such_emoji:")
    assert [c.error for c in fake_slack.calls_of("reactions.add")][-2:] == \
        ["message_not_found", "invalid_name"]
    # Put twice (another process put it already): Slack says already_reacted; done.
    fake_slack.reactions[key] = ["eyes"]
    assert await channel.react(CHANNEL, original["ts"], "👀")
    assert fake_slack.calls_of("reactions.add")[-1].error == "already_reacted"
    fake_slack.scopes.discard("reactions:write")
    with caplog.at_level(logging.WARNING):
        assert not await channel.react(CHANNEL, original["ts"], "✅")
    assert any("missing_scope" in r.getMessage() for r in caplog.records)


async def test_a_rate_limited_reaction_is_dropped_not_retried(
        start: Start, fake_slack: FakeSlack) -> None:
    channel, inbox = await start()
    original = fake_slack.message(fake_slack.mention("hello"))
    await fake_slack.post_event(original)
    await inbox.wait_for(1)
    fake_slack.fail("reactions.add", 429, retry_after=30)
    assert not await channel.react(CHANNEL, original["ts"], "👀")
    assert len(fake_slack.calls_of("reactions.add")) == 1
    await channel.send(OutboundMessage(channel="slack", chat_id=CHANNEL, text="the answer"))
    assert [m.text for m in fake_slack.messages.values()] == ["the answer"]


async def test_the_outcome_edit_replaces_text_and_removes_the_buttons(
        start: Start, fake_slack: FakeSlack) -> None:
    channel, _ = await start()
    ts = await prompt(channel)
    assert await channel.edit(CHANNEL, ts, "Approved by alice")
    posted = fake_slack.messages[ts]
    assert posted.text == "Approved by alice" and buttons_of(posted.blocks) == []
    assert await channel.edit(CHANNEL, ts, "Approved by alice", ROWS[:1])
    assert len(buttons_of(fake_slack.messages[ts].blocks)) == 1
    assert not await channel.edit(CHANNEL, "1.000001", "gone")
    assert fake_slack.calls_of("chat.update")[-1].error == "message_not_found"


def test_the_manifest_asks_for_reactions_and_interactivity() -> None:
    text = manifest("help")
    assert "reactions:write" in text and "reactions:read" in text
    assert "reaction_added" in text and "interactivity:" in text


def test_the_slack_guide_shows_the_manifest_roost_logs() -> None:
    guide = (Path(__file__).parents[1] / "docs" / "platforms" / "slack.md").read_text("utf-8")
    shown = guide.split("```text\n", 1)[1].split("\n```", 1)[0]
    names = shown.split('description: "Roost commands: ', 1)[1].split('"', 1)[0]
    assert shown == manifest(names)
