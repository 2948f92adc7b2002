"""Slack durability: acknowledged means recorded, errors mapped, replies delivered once.

The real slack-bolt / slack_sdk run against the fake Slack; the channel is
driven with a handler of the test's own that records what the core would get
(the inbox dedupes on ``event_id``, so the handler does too), and can fail or
hold a delivery to see what Slack is told meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError

from bot.config.settings import Settings
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.testing.inbox import RecordingInbox as Inbox
from bot.testing.slack import CHANNEL, DM_CHANNEL, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy, RateLimited, Transient
from channels.slack import SlackChannel

PATIENT = DeliveryPolicy(attempts=8, base_delay=0.02, max_delay=0.2)
ONE_TRY = DeliveryPolicy(attempts=1)


Start = Callable[..., Awaitable[SlackChannel]]


@pytest.fixture
async def start(fake_slack: FakeSlack) -> AsyncIterator[Start]:
    channels: list[SlackChannel] = []

    async def factory(handler: Inbox, *, socket_mode: bool = False,
                      policy: DeliveryPolicy = PATIENT, call_timeout: int = 30,
                      edit_interval: float = 1.0, **settings: Any) -> SlackChannel:
        channel = SlackChannel(Settings(**fake_slack.settings(socket_mode=socket_mode),
                                        **settings),
                               host="127.0.0.1", policy=policy, timeout=call_timeout,
                               edit_interval=edit_interval)
        await channel.start(handler)
        channels.append(channel)
        if socket_mode:
            await fake_slack.wait_for_socket()
        else:
            fake_slack.events_url = channel.events_url
        return channel

    yield factory
    for channel in channels:
        await channel.stop()


# -- acknowledged means recorded -------------------------------------------------------------


async def test_an_event_the_core_could_not_record_gets_a_500_and_slacks_retry_is_recorded(
    fake_slack: FakeSlack, start: Start,
) -> None:
    inbox = Inbox()
    inbox.fail_next = 1
    await start(inbox)
    deliveries = await fake_slack.deliver_event(fake_slack.direct_message("hello"))
    assert [d.status for d in deliveries] == [500, 200]
    assert deliveries[0].event_id == deliveries[1].event_id
    assert len(inbox.calls) == 2
    [recorded] = inbox.recorded.values()
    assert recorded.text == "hello" and recorded.event_id == f"{DM_CHANNEL}:{recorded.message_id}"


async def test_the_events_api_answers_only_once_the_handler_returned(
    fake_slack: FakeSlack, start: Start,
) -> None:
    inbox = Inbox()
    inbox.gate = asyncio.Event()
    await start(inbox)
    delivery = asyncio.create_task(fake_slack.post_event(fake_slack.direct_message("hold")))
    await inbox.entered.wait()
    await asyncio.sleep(0.1)  # time for an early answer, if there were one
    assert not delivery.done()
    inbox.gate.set()
    assert (await delivery).status == 200
    assert len(inbox.recorded) == 1


async def test_a_retry_while_the_first_delivery_is_still_being_recorded_is_handled_once(
    fake_slack: FakeSlack, start: Start,
) -> None:
    inbox = Inbox()
    inbox.gate = asyncio.Event()
    await start(inbox)
    # Slack gives up waiting and redelivers while the handler is still busy.
    deliveries = await fake_slack.deliver_event(fake_slack.direct_message("slow"), retries=2,
                                                answer_within=0.2)
    assert [d.status for d in deliveries] == [0, 0, 0]
    inbox.gate.set()
    [recorded] = await inbox.wait_for(1)
    later = await fake_slack.post_event(recorded.raw, event_id=deliveries[0].event_id,
                                        retry_num=3)
    assert later.status == 200
    assert len(inbox.calls) == 1  # the retries waited for the first, then were skipped


async def test_a_socket_mode_envelope_is_acked_only_once_recorded_and_redelivered_if_not(
    fake_slack: FakeSlack, start: Start,
) -> None:
    inbox = Inbox()
    inbox.fail_next = 1
    await start(inbox, socket_mode=True)
    envelopes = await fake_slack.deliver_socket_event(fake_slack.direct_message("via socket"),
                                                      ack_timeout=0.5)
    assert len(envelopes) == 2
    first, second = envelopes
    assert first not in fake_slack.acks and second in fake_slack.acks
    assert len(inbox.calls) == 2
    [recorded] = await inbox.wait_for(1)
    assert recorded.text == "via socket"


async def test_a_socket_mode_ack_waits_for_the_handler(fake_slack: FakeSlack,
                                                       start: Start) -> None:
    inbox = Inbox()
    inbox.gate = asyncio.Event()
    await start(inbox, socket_mode=True)
    envelope_id = await fake_slack.socket_event(fake_slack.direct_message("hold"))
    await inbox.entered.wait()
    await asyncio.sleep(0.1)  # time for an early ack, if there were one
    assert envelope_id not in fake_slack.acks
    inbox.gate.set()
    await fake_slack.wait_for_ack(envelope_id)


async def test_message_and_app_mention_of_one_post_and_their_retries_share_one_event_id(
    fake_slack: FakeSlack, start: Start,
) -> None:
    inbox = Inbox()
    await start(inbox)
    message = fake_slack.message(fake_slack.mention("hello"))
    mention = fake_slack.app_mention(message["text"], ts=message["ts"])
    # Both at once, as Slack sends them, then a retry of each.
    first = await asyncio.gather(fake_slack.post_event(message), fake_slack.post_event(mention))
    again = [await fake_slack.post_event(message, event_id=first[0].event_id, retry_num=1),
             await fake_slack.post_event(mention, event_id=first[1].event_id, retry_num=1)]
    assert [d.status for d in [*first, *again]] == [200] * 4
    assert {m.event_id for m in inbox.calls} == {f"{CHANNEL}:{message['ts']}"}
    assert len(inbox.calls) == 1  # the adapter spares the core the duplicates
    [recorded] = inbox.recorded.values()
    assert recorded.mentioned and recorded.text == "hello"


async def test_a_slash_command_is_acked_after_it_is_recorded_and_refused_if_not(
    fake_slack: FakeSlack, start: Start,
) -> None:
    inbox = Inbox()
    await start(inbox)
    ok = await fake_slack.slash_command("status")
    assert ok.status == 200
    [recorded] = inbox.recorded.values()
    assert recorded.text == "/status" and recorded.event_id.startswith("cmd:trigger.")
    inbox.fail_next = 1
    refused = await fake_slack.slash_command("status")
    assert refused.status == 500  # Slack shows the user that the command failed
    assert len(inbox.recorded) == 1


# -- the Web API error mapping, one test per class -------------------------------------------


def reply(text: str = "hello", *, chat: str = DM_CHANNEL, **fields: Any) -> OutboundMessage:
    return OutboundMessage(channel="slack", chat_id=chat, text=text, **fields)


@pytest.mark.parametrize(("fault", "expected"), [
    ("429", RateLimited),
    ("500", Transient),
    ("502", Transient),  # an HTML page from the proxy, not Slack's JSON
    ("truncated", Transient),  # slack_sdk cannot decode the body
    ("reset_before", Transient),  # aiohttp's ClientOSError (an OSError)
    ("disconnect", Transient),  # aiohttp's ServerDisconnectedError
])
async def test_a_transient_web_api_failure_is_mapped_for_retry(
    fake_slack: FakeSlack, start: Start, fault: str, expected: type[Exception],
) -> None:
    channel = await start(Inbox(), policy=ONE_TRY)
    fake_slack.inject(fault, "chat.postMessage", retry_after=3)
    with pytest.raises(expected) as caught:
        await channel.send(reply())
    if isinstance(caught.value, RateLimited):
        assert caught.value.retry_after == 3  # Slack's Retry-After header
    assert fake_slack.visible() == []


async def test_a_web_api_call_that_times_out_is_transient(fake_slack: FakeSlack,
                                                          start: Start) -> None:
    channel = await start(Inbox(), policy=ONE_TRY, call_timeout=1)
    fake_slack.inject("stall", "chat.postMessage", stall=1.5)
    with pytest.raises(Transient, match="TimeoutError"):
        await channel.send(reply())


async def test_an_unreachable_slack_is_transient(fake_slack: FakeSlack, start: Start) -> None:
    channel = await start(Inbox(), policy=ONE_TRY)
    await fake_slack.stop()  # connection refused: aiohttp's ClientConnectorError (an OSError)
    with pytest.raises(Transient):
        await channel.send(reply())


@pytest.mark.parametrize("error", ["channel_not_found", "not_in_channel", "invalid_auth",
                                   "msg_too_long"])
async def test_slack_api_errors_are_permanent_and_not_retried(
    fake_slack: FakeSlack, start: Start, error: str,
) -> None:
    channel = await start(Inbox())
    fake_slack.fail("chat.postMessage", 200, error=error)
    with pytest.raises(SlackApiError, match=error):
        await channel.send(reply())
    assert len(fake_slack.calls_of("chat.postMessage")) == 1


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["500", "502", "429", "reset_before", "reset_after",
                                   "disconnect", "truncated", "stall"])
async def test_a_reply_gets_through_a_fault_exactly_once(
    fake_slack: FakeSlack, start: Start, fault: str,
) -> None:
    # A short call timeout turns the stall into a timeout after the post took effect.
    channel = await start(Inbox(), call_timeout=1)
    fake_slack.inject(fault, "chat.postMessage", stall=1.5)
    ts = await channel.send(reply("exactly once"))
    # A stalled post lands after the retry; the adapter deletes the late copy.
    await fake_slack.wait_until(lambda: fake_slack.quiet() and len(fake_slack.visible()) == 1,
                                limit=10, what=lambda: f"one message: {fake_slack.visible()}")
    [posted] = fake_slack.visible()
    assert posted.text == "exactly once" and posted.ts == ts


# -- replace, withdraw, drafts ---------------------------------------------------------------


async def test_replace_edits_the_draft_and_returns_the_last_message_id(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel = await start(Inbox())
    draft = await channel.send(reply("drafting…"))
    assert draft is not None
    last = await channel.send(reply("done " + "x" * 5000, replace=draft))
    first, second = fake_slack.visible()
    assert first.ts == draft and first.text.startswith("done") and first.edits == ["drafting…"]
    assert last == second.ts != draft


async def test_a_draft_that_cannot_be_edited_is_replaced_by_a_new_message_and_deleted(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel = await start(Inbox())
    draft = await channel.send(reply("drafting…"))
    assert draft is not None
    fake_slack.fail("chat.update", 200, error="cant_update_message")
    last = await channel.send(reply("final", replace=draft))
    [shown] = fake_slack.visible()
    assert shown.text == "final" and shown.ts == last != draft
    assert fake_slack.messages[draft].deleted


async def test_replacing_a_draft_that_is_gone_posts_the_reply(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel = await start(Inbox())
    draft = await channel.send(reply("drafting…"))
    assert draft is not None
    await channel.withdraw(DM_CHANNEL, draft)
    await channel.withdraw(DM_CHANNEL, draft)  # already gone is fine
    last = await channel.send(reply("final", replace=draft))
    assert [(m.ts, m.text) for m in fake_slack.visible()] == [(last, "final")]


async def test_a_stream_whose_final_edit_fails_for_good_leaves_no_frozen_draft(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel = await start(Inbox(), policy=DeliveryPolicy(attempts=2, base_delay=0.01))
    inbound = InboundMessage(channel="slack", chat_id=DM_CHANNEL, chat_type="direct",
                             sender_id="U0ALICE", text="hi", message_id=fake_slack.next_ts())
    stream = channel.open_stream(inbound)
    assert stream is not None
    await stream.push("partial answ")
    draft = stream.message_id
    fake_slack.inject("500", "chat.update", times=5)
    await stream.finish("the whole answer")
    [shown] = fake_slack.visible()
    assert shown.text == "the whole answer" and shown.ts == stream.message_id != draft


# -- replies under faults ---------------------------------------------------------------------


async def test_replies_under_20_percent_faults_are_all_delivered_once_and_none_frozen(
    fake_slack: FakeSlack, start: Start,
) -> None:
    channel = await start(Inbox(), call_timeout=1, edit_interval=0.05)
    fake_slack.chaos(0.2, seed=12, stall=1.2)
    questions = [fake_slack.next_ts() for _ in range(30)]

    async def answer(n: int, ts: str) -> None:
        inbound = InboundMessage(channel="slack", chat_id=CHANNEL, chat_type="group",
                                 sender_id="U0ALICE", text="q", message_id=ts, mentioned=True)
        final = f"answer {n}"
        if n % 2:  # streamed: drafts, edits, then the final reply replaces the draft
            stream = channel.open_stream(inbound)
            assert stream is not None
            for i in range(1, 6):
                await stream.push(final[: 2 * i])
                await asyncio.sleep(0.06)
            await stream.finish(final)
        else:
            await channel.send(OutboundMessage.reply_to_message(inbound, final))

    try:
        await asyncio.gather(*(answer(n, ts) for n, ts in enumerate(questions)))
    finally:
        fake_slack.chaos(0)
    assert fake_slack.injected, "the fake should have failed some calls"

    def shown() -> list[list[str]]:
        return [[m.text for m in fake_slack.visible() if m.thread_ts == ts] for ts in questions]

    expected = [[f"answer {n}"] for n in range(len(questions))]
    # Stalled posts land late and are swept by the adapter: wait for that.
    await fake_slack.wait_until(lambda: fake_slack.quiet() and shown() == expected, limit=15,
                                what=lambda: f"one answer per question, got {shown()}")
