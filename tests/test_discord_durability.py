"""Discord durability: catching up what was missed, errors mapped, replies delivered once.

The real discord.py runs against the fake Discord; the channel is driven with
a handler of the test's own that records what the core would get (the inbox
dedupes on ``event_id``, so the handler does too).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import discord
import pytest

from bot.config.settings import Settings
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.testing.discord import (
    CHANNEL_ID,
    DM_CHANNEL_ID,
    OTHER_BOT_ID,
    THREAD_ID,
    FakeDiscord,
    user_payload,
)
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.inbox import RecordingInbox as Inbox
from channels.delivery import DeliveryPolicy, RateLimited, Transient
from channels.discord import DiscordChannel

PATIENT = DeliveryPolicy(attempts=8, base_delay=0.02, max_delay=0.2)
ONE_TRY = DeliveryPolicy(attempts=1)
MESSAGES = r"^/channels/\d+/messages$"


Start = Callable[..., Awaitable[DiscordChannel]]


@pytest.fixture
async def start(fake_discord: FakeDiscord) -> AsyncIterator[Start]:
    channels: list[DiscordChannel] = []

    async def factory(handler: Inbox, *, delivery: DeliveryPolicy = PATIENT,
                      **options: Any) -> DiscordChannel:
        channel = DiscordChannel(Settings(**fake_discord.settings()), guild_ready_timeout=0.05,
                                 delivery=delivery, **options)
        await channel.start(handler)
        channels.append(channel)
        return channel

    yield factory
    for channel in channels:
        await channel.stop()


# -- catching up -----------------------------------------------------------------------------


async def test_catch_up_after_a_restart_delivers_the_missed_messages_in_order_once(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    before = Inbox()
    first = await start(before)
    await fake_discord.dm("before the restart")
    await fake_discord.guild_message("also before", mention=True)
    seen = await before.wait_for(2)
    cursors = {m.chat_id: m.event_id for m in seen}
    await first.send(OutboundMessage("discord", str(DM_CHANNEL_ID), "a reply before"))
    await first.stop()

    # Said while Roost was down: Discord will never dispatch these.
    missed = [fake_discord.missed("dm one", channel_id=DM_CHANNEL_ID),
              fake_discord.missed("chatter", channel_id=CHANNEL_ID),
              fake_discord.missed("hey bot", channel_id=CHANNEL_ID, mention=True),
              fake_discord.missed("dm two", channel_id=DM_CHANNEL_ID)]
    fake_discord.missed("beep", author=user_payload(OTHER_BOT_ID, "otherbot", bot=True))

    inbox = Inbox()  # the core's inbox outlives the process
    second = await start(inbox)
    await second.catch_up(cursors)
    by_chat = {chat: [m.text for m in inbox.recorded.values() if m.chat_id == chat]
               for chat in (str(DM_CHANNEL_ID), str(CHANNEL_ID))}
    assert by_chat == {str(DM_CHANNEL_ID): ["dm one", "dm two"],
                       str(CHANNEL_ID): ["chatter", "hey bot"]}
    assert set(inbox.recorded) == {str(i) for i in missed}
    # Treated exactly as live messages: a group message needs the mention.
    flags = {m.text: m.mentioned for m in inbox.recorded.values()}
    assert flags == {"dm one": True, "dm two": True, "chatter": False, "hey bot": True}
    reads = fake_discord.calls_to("GET", MESSAGES)
    assert {c.query["after"] for c in reads} == set(cursors.values())
    assert {c.query["limit"] for c in reads} == {"100"}

    # A second catch-up over the same range (another restart) yields the same
    # event ids, which the inbox already has.
    await second.stop()
    third = await start(inbox)
    await third.catch_up(cursors)
    assert sorted(m.event_id for m in inbox.calls) == sorted(2 * [str(i) for i in missed])
    assert set(inbox.recorded) == {str(i) for i in missed}


@pytest.mark.parametrize("fault", ["503", "reset_after", "429"])
async def test_a_history_read_that_fails_is_retried(
    fake_discord: FakeDiscord, start: Start, fault: str,
) -> None:
    cursor = fake_discord.missed("recorded", channel_id=DM_CHANNEL_ID)
    missed = fake_discord.missed("missed", channel_id=DM_CHANNEL_ID)
    inbox = Inbox()
    channel = await start(inbox)
    fake_discord.inject(fault, method="GET", path=MESSAGES)
    await channel.catch_up({str(DM_CHANNEL_ID): str(cursor)})
    assert list(inbox.recorded) == [str(missed)]
    assert [c.status for c in fake_discord.calls_to("GET", MESSAGES)][-1] == 200


async def test_catch_up_of_a_guild_channel_reads_its_threads_too(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    cursor = fake_discord.missed("recorded in the channel", channel_id=CHANNEL_ID)
    in_thread = fake_discord.missed("said in the thread", channel_id=THREAD_ID, mention=True)
    inbox = Inbox()
    channel = await start(inbox)
    await channel.catch_up({str(CHANNEL_ID): str(cursor)})
    [message] = inbox.recorded.values()
    assert message.event_id == str(in_thread)
    assert (message.chat_id, message.thread_id) == (str(CHANNEL_ID), str(THREAD_ID))


async def test_catch_up_reads_at_most_the_limit_per_chat_oldest_first(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    cursor = fake_discord.missed("already recorded", channel_id=DM_CHANNEL_ID)
    for n in range(5):
        fake_discord.missed(f"missed {n}", channel_id=DM_CHANNEL_ID)
    inbox = Inbox()
    channel = await start(inbox, catchup_limit=3)
    await channel.catch_up({str(DM_CHANNEL_ID): str(cursor)})
    assert inbox.texts() == ["missed 0", "missed 1", "missed 2"]
    [read] = fake_discord.calls_to("GET", MESSAGES)
    assert read.query["limit"] == "3"


@pytest.mark.slow
async def test_a_new_gateway_session_catches_up_what_the_gateway_did_not_replay(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    inbox = Inbox()
    await start(inbox)
    await fake_discord.dm("live")
    await fake_discord.guild_message("live in the guild", mention=True)
    await inbox.wait_for(2)
    # Sent while the connection was down; the session cannot be resumed.
    fake_discord.missed("while away", channel_id=DM_CHANNEL_ID)
    fake_discord.missed("meanwhile", channel_id=CHANNEL_ID, mention=True)
    await fake_discord.invalidate_session()
    # discord.py waits 5 s before IDENTIFYing again (Discord's identify limit).
    await fake_discord.wait_identified(count=2, limit=20)
    await inbox.wait_for(4)
    assert inbox.texts()[2:] in (["while away", "meanwhile"], ["meanwhile", "while away"])
    await fake_discord.dm("live again")
    await inbox.wait_for(5)
    assert len(inbox.calls) == 5  # nothing was handed over twice


@pytest.mark.slow
async def test_a_message_the_core_failed_to_record_is_read_again_after_a_reconnect(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    inbox = Inbox()
    await start(inbox)
    inbox.fail_next = 1
    lost = await fake_discord.dm("first try fails")
    await fake_discord.dm("second is fine")
    await inbox.wait_for(1)
    await fake_discord.invalidate_session()
    # discord.py waits 5 s before IDENTIFYing again (Discord's identify limit).
    await fake_discord.wait_identified(count=2, limit=20)
    await inbox.wait_for(2)
    assert inbox.texts() == ["second is fine", "first try fails"]
    assert inbox.recorded[str(lost)].event_id == str(lost)


# -- the REST error mapping, one test per class ---------------------------------------------


def reply(text: str = "hello", **fields: Any) -> OutboundMessage:
    return OutboundMessage("discord", str(DM_CHANNEL_ID), text, **fields)


async def test_a_server_error_is_transient(fake_discord: FakeDiscord, start: Start) -> None:
    channel = await start(Inbox(), delivery=ONE_TRY)
    fake_discord.fail_next(503, path=MESSAGES)  # discord.py's DiscordServerError
    with pytest.raises(Transient, match="503"):
        await channel.send(reply())


async def test_a_server_error_with_an_html_page_is_transient(fake_discord: FakeDiscord,
                                                             start: Start) -> None:
    channel = await start(Inbox(), delivery=ONE_TRY)
    fake_discord.fail_next(503, path=MESSAGES, html=True)
    with pytest.raises(Transient, match="503"):
        await channel.send(reply())


async def test_a_rate_limit_longer_than_discord_py_waits_is_rate_limited(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    # discord.py sleeps through shorter limits itself (it takes 30 s at least).
    channel = await start(Inbox(), delivery=ONE_TRY, max_ratelimit_timeout=30)
    fake_discord.inject("429", path=MESSAGES, retry_after=45)  # discord.RateLimited
    with pytest.raises(RateLimited) as caught:
        await channel.send(reply())
    assert caught.value.retry_after == 45


async def test_a_connection_reset_is_transient(fake_discord: FakeDiscord, start: Start) -> None:
    channel = await start(Inbox(), delivery=ONE_TRY)
    fake_discord.inject("reset_before", path=MESSAGES)  # an aiohttp ClientError
    with pytest.raises(Transient, match=r"ServerDisconnectedError|ClientOSError"):
        await channel.send(reply())
    assert fake_discord.visible() == []


async def test_a_stalled_call_is_transient(fake_discord: FakeDiscord, start: Start) -> None:
    channel = await start(Inbox(), delivery=ONE_TRY, call_timeout=0.2)
    fake_discord.inject("stall", path=MESSAGES, stall=0.6)
    with pytest.raises(Transient, match="TimeoutError"):
        await channel.send(reply())


async def test_an_unreachable_discord_is_transient(fake_discord: FakeDiscord,
                                                   start: Start) -> None:
    channel = await start(Inbox(), delivery=ONE_TRY)
    await fake_discord.stop()  # connection refused: aiohttp's ClientConnectorError
    with pytest.raises(Transient):
        await channel.send(reply())


@pytest.mark.parametrize(("status", "error"), [(403, discord.Forbidden),
                                               (404, discord.NotFound),
                                               (400, discord.HTTPException)])
async def test_client_errors_are_permanent_and_not_retried(
    fake_discord: FakeDiscord, start: Start, status: int, error: type[Exception],
) -> None:
    channel = await start(Inbox())
    fake_discord.fail_next(status, path=MESSAGES)
    with pytest.raises(error):
        await channel.send(reply())
    assert len(fake_discord.calls_to("POST", MESSAGES)) == 1


@pytest.mark.parametrize("fault", ["500", "502", "503", "429", "reset_before", "reset_after",
                                   "stall"])
async def test_a_reply_gets_through_a_fault_exactly_once(
    fake_discord: FakeDiscord, start: Start, fault: str,
) -> None:
    channel = await start(Inbox(), call_timeout=0.3)
    fake_discord.inject(fault, method="POST", path=MESSAGES, stall=0.6)
    sent = await channel.send(reply("exactly once"))
    await fake_discord.wait_until_quiet()
    [message] = [m for m in fake_discord.posted() if not m.deleted]
    assert message.content == "exactly once" and str(message.id) == sent


# -- replace, withdraw, drafts ---------------------------------------------------------------


async def test_replace_edits_the_draft_and_returns_the_last_message_id(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel = await start(Inbox())
    draft = await channel.send(reply("drafting…"))
    assert draft is not None
    last = await channel.send(reply("done " + "x" * 2500, replace=draft))
    first, second = fake_discord.posted()
    assert str(first.id) == draft and first.content.startswith("done")
    assert last == str(second.id) != draft


async def test_a_draft_that_cannot_be_edited_is_replaced_by_a_new_message_and_deleted(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel = await start(Inbox())
    draft = await channel.send(reply("drafting…"))
    assert draft is not None
    fake_discord.fail_next(403, method="PATCH")
    last = await channel.send(reply("final", replace=draft))
    assert fake_discord.visible() == ["final"]
    assert fake_discord.messages[int(draft)].deleted and last != draft


async def test_withdraw_deletes_and_a_message_already_gone_is_fine(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel = await start(Inbox())
    sent = await channel.send(reply("oops"))
    assert sent is not None
    await channel.withdraw(str(DM_CHANNEL_ID), sent)
    await channel.withdraw(str(DM_CHANNEL_ID), sent)
    assert fake_discord.visible() == []
    last = await channel.send(reply("the reply", replace=sent))
    assert fake_discord.visible() == ["the reply"] and last != sent


async def test_a_stream_whose_final_edit_fails_for_good_leaves_no_frozen_draft(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel = await start(Inbox(), delivery=DeliveryPolicy(attempts=2, base_delay=0.01))
    inbound = InboundMessage(channel="discord", chat_id=str(DM_CHANNEL_ID),
                             chat_type="direct", sender_id="5000", text="hi", message_id="1")
    stream = channel.open_stream(inbound)
    assert stream is not None
    await stream.push("partial answ")
    draft = stream.message_id
    fake_discord.fail_next(503, count=5, method="PATCH")
    await stream.finish("the whole answer")
    assert fake_discord.visible() == ["the whole answer"]
    assert stream.message_id != draft and draft is not None
    assert fake_discord.messages[int(draft)].deleted


# -- replies under faults ---------------------------------------------------------------------


@pytest.mark.slow
async def test_replies_under_20_percent_faults_are_all_delivered_once_and_none_frozen(
    fake_discord: FakeDiscord, start: Start,
) -> None:
    channel = await start(Inbox(), edit_interval=0.05)
    fake_discord.chaos(0.2, seed=12, stall=0.8)
    count = 30

    async def answer(n: int) -> None:
        inbound = InboundMessage(channel="discord", chat_id=str(CHANNEL_ID), chat_type="group",
                                 sender_id="5000", text="q", message_id=str(100 + n),
                                 mentioned=True)
        final = f"answer {n}"
        if n % 2:  # streamed: a draft, edits, then the final reply replaces the draft
            stream = channel.open_stream(inbound)
            assert stream is not None
            for i in range(1, 6):
                await stream.push(final[: 2 * i])
                await asyncio.sleep(0.06)
            await stream.finish(final)
        else:
            await channel.send(OutboundMessage.reply_to_message(inbound, final))

    try:
        await asyncio.gather(*(answer(n) for n in range(count)))
    finally:
        fake_discord.chaos(0)
    assert fake_discord.injected, "the fake should have failed some calls"
    await fake_discord.wait_until_quiet()
    assert sorted(fake_discord.visible(CHANNEL_ID)) == sorted(f"answer {n}"
                                                              for n in range(count))
