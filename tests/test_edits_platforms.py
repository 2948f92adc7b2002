"""Edits and deletions end to end through the real SDKs against the platform fakes: a
Telegram ``edited_message`` restarts a run that has not acted (its streamed draft
withdrawn, also when Telegram says it is gone) and one that removes the mention
withdraws a queued message; a Discord ``MESSAGE_DELETE`` drops a queued message and a
``MESSAGE_UPDATE`` of an answered one is answered as a correction (an unfurl is not an
edit); a Slack ``message_changed`` delivered twice restarts a run once, its draft's
``chat.delete`` answered ``message_not_found``, and one posted to the other of two
replicas on PostgreSQL restarts the run on the replica running it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.contracts.llm import LLMRequest, LLMResponse, OnRetry, OnText
from bot.testing.app import closing_apps, create_app, scripted, settle
from bot.testing.discord import CHANNEL_ID, FakeDiscord
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.slack import FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from bot.testing.telegram import FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from bot.testing.telegram.wire import ALICE
from channels.delivery import DeliveryPolicy, Limits
from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel
from plugins.scripted_provider import ScriptedProvider
from tests.test_edits import said

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
GROUP = -1001234567890


class Held:
    """A scripted model whose first call shows ``Looking…`` and then waits for
    :meth:`release` (a run in progress that has not acted); later calls answer at once."""

    name = "scripted"

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.open = asyncio.Event()
        self.held = False

    @property
    def requests(self) -> list[LLMRequest]:
        return self.inner.requests

    async def complete(self, request: LLMRequest, *, on_text: OnText | None = None,
                       on_retry: OnRetry | None = None) -> LLMResponse:
        if not self.held:
            self.held = True
            self.inner.requests.append(request)
            if on_text is not None:
                on_text("Looking into it")
            self.entered.set()
            await self.open.wait()
            self.inner.requests.pop()  # answered below, recorded there
        return await self.inner.complete(request, on_text=on_text, on_retry=on_retry)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def waiting(self) -> None:
        await asyncio.wait_for(self.entered.wait(), 10)

    def release(self) -> None:
        self.open.set()


def held() -> Held:
    return Held(scripted({"reply": "ok: {message}"}, loop=True))


Start = Callable[..., Awaitable[Roost]]


@pytest.fixture(name="start")
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    """``await start(model, channel_class, channel_args, **settings)``: an app with that
    channel."""
    async with closing_apps() as apps:

        async def factory(model: Held, make: Callable[[Roost], Any], **settings: Any) -> Roost:
            app, _ = await create_app(model, data_dir=tmp_path / "data", **settings)
            apps.append(app)
            await app.add_channel(make(app))
            return app

        yield factory


def telegram(app: Roost) -> TelegramChannel:
    return TelegramChannel(app.settings, polling_timeout=1, limits=Limits(), draft_after=0,
                           policy=FAST)


async def test_telegram_an_edit_restarts_a_run_whose_draft_telegram_lost(
        start: Start, fake_telegram: FakeTelegram) -> None:
    model = held()
    app = await start(model, telegram, telegram_bot_token=fake_telegram.token,
                      telegram_api_base=fake_telegram.base_url)
    update = fake_telegram.private_message("the total is 41")
    await model.waiting()
    [draft] = await fake_telegram.wait_for("sendMessage")
    assert draft.params["text"] == "Looking into it"
    # Someone deleted the draft meanwhile: withdrawing it is answered "not found".
    del fake_telegram.messages[(ALICE["id"], draft.result["message_id"])]
    fake_telegram.edit_by_user(update, "the total is 42")
    await settle(app)
    [withdrawn] = fake_telegram.calls_of("deleteMessage")
    assert withdrawn.params["message_id"] == draft.result["message_id"]
    assert withdrawn.error == "Bad Request: message to delete not found"
    assert fake_telegram.visible(ALICE["id"]) == ["ok: the total is 42"]
    assert said(model.requests[1:], "41") == []


async def test_telegram_a_mention_edited_away_withdraws_the_queued_message(
        start: Start, fake_telegram: FakeTelegram) -> None:
    model = held()
    app = await start(model, telegram, telegram_bot_token=fake_telegram.token,
                      telegram_api_base=fake_telegram.base_url, group_max_concurrent=1,
                      stream_replies=False)
    fake_telegram.mention("first")
    await model.waiting()
    second = fake_telegram.mention("second")
    await fake_telegram.wait_confirmed(second["update_id"])
    edit = fake_telegram.edit_by_user(second, "second, never mind")  # no entities: no mention
    await fake_telegram.wait_confirmed(edit["update_id"])
    model.release()
    await settle(app)
    assert [t.split("]: ")[-1] for t in fake_telegram.visible(GROUP)] == ["first"]
    assert said(model.requests, "second") == []


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait until ``check()`` holds (discord.py hands events in from tasks of its own and
    Discord acknowledges none: there is nothing else to wait on)."""
    async with asyncio.timeout(10):
        while not await check():  # noqa: ASYNC110  (no event covers it)
            await asyncio.sleep(0.01)


async def closed(app: Roost, channel: str, chat_id: str, message_id: str) -> None:
    """Wait until the message's inbox entry is closed."""
    async def done() -> bool:
        entry = await app.inbox.original(channel, chat_id, message_id)
        return entry is not None and entry.state == "done"

    await until(done)


def discord(app: Roost) -> DiscordChannel:
    return DiscordChannel(app.settings, guild_ready_timeout=0.05, delivery=FAST)


async def test_discord_a_deletion_drops_a_queued_message_and_edits_restart_then_correct(
        start: Start, fake_discord: FakeDiscord) -> None:
    model = held()
    app = await start(model, discord, group_max_concurrent=1, **fake_discord.settings())
    first = await fake_discord.guild_message("the total is 41", mention=True)
    await model.waiting()
    await fake_discord.wait_for_call("POST", rf"/channels/{CHANNEL_ID}/messages$")
    [draft] = fake_discord.posted(CHANNEL_ID)
    assert draft.content == "Looking into it"
    second = await fake_discord.guild_message("and this", mention=True)
    await fake_discord.delete_message(second)
    await fake_discord.edit_message(first, "", partial=True)  # an embed unfurled: no edit
    await closed(app, "discord", str(CHANNEL_ID), str(second))
    # A moderator deleted the draft: withdrawing it is answered 404 Unknown Message.
    draft.deleted = True
    await fake_discord.edit_message(first, "the total is 42", mention_bot=True)
    await settle(app)
    [withdrawn] = fake_discord.calls_to("DELETE", rf"/messages/{draft.id}$")
    assert withdrawn.status == 404
    assert said(model.requests[1:], "41") == [] and said(model.requests, "and this") == []
    await fake_discord.edit_message(first, "the total is 43", mention_bot=True)

    async def corrected() -> bool:
        return len(fake_discord.visible(CHANNEL_ID)) == 2

    await until(corrected)
    await settle(app)
    replies = fake_discord.visible(CHANNEL_ID)
    assert len(replies) == 2 and replies[0].endswith("the total is 42")
    correction = model.requests[-1].messages[-1].content
    assert "[Correction" in correction and correction.endswith("the total is 43")
    assert "the total is 42" in correction
    await app.close()  # before the fake: discord.py would wait to reconnect to it


def slack(app: Roost) -> SlackChannel:
    return SlackChannel(app.settings, host="127.0.0.1", policy=FAST)


async def test_slack_an_edit_delivered_twice_restarts_the_run_once(
        start: Start, fake_slack: FakeSlack) -> None:
    model = held()
    channel: list[SlackChannel] = []

    def make(app: Roost) -> SlackChannel:
        channel.append(slack(app))
        return channel[0]

    app = await start(model, make, **fake_slack.settings())
    fake_slack.events_url = channel[0].events_url
    original = fake_slack.message(fake_slack.mention("the total is 41"))
    await fake_slack.post_event(original)
    await model.waiting()
    await fake_slack.wait_for("chat.postMessage")
    [(ts, draft)] = fake_slack.messages.items()
    assert draft.text == "Looking into it"
    del fake_slack.messages[ts]  # deleted meanwhile: withdrawing it is message_not_found
    edited = fake_slack.message_changed(original, fake_slack.mention("the total is 42"))
    await fake_slack.post_event(edited, event_id="Ev-edit")
    await fake_slack.post_event(edited, event_id="Ev-edit")  # Slack retries it
    await settle(app)
    [withdrawn] = fake_slack.calls_of("chat.delete")
    assert (withdrawn.params["ts"], withdrawn.error) == (ts, "message_not_found")
    [reply] = fake_slack.visible()
    assert reply.text.startswith("ok: ") and reply.text.endswith("the total is 42")
    assert said(model.requests[1:], "41") == [] and len(model.requests) == 2


async def test_slack_an_edit_posted_to_the_other_replica_restarts_the_run_where_it_runs(
        pg_url: str, tmp_path: Path, fake_slack: FakeSlack) -> None:
    model = held()
    async with closing_apps() as apps:
        urls = []
        for name in ("a", "b"):
            app, _ = await create_app(model, data_dir=tmp_path / name, database_url=pg_url,
                                      **fake_slack.settings())
            apps.append(app)
            channel = slack(app)
            await app.add_channel(channel)
            urls.append(channel.events_url)
            await app.recover()  # starts claiming
        fake_slack.events_url = urls[0]
        original = fake_slack.message(fake_slack.mention("the total is 41"))
        await fake_slack.post_event(original)
        await model.waiting()  # replica a runs it: it received it and nobody held the chat
        fake_slack.events_url = urls[1]
        await fake_slack.post_event(fake_slack.message_changed(
            original, fake_slack.mention("the total is 42")))
        await fake_slack.wait_for("chat.postMessage", 2)  # the draft, then the answer
        for app in apps:
            await asyncio.wait_for(app.dispatcher.drain(), 30)
        [reply] = fake_slack.visible()
        assert reply.text.startswith("ok: ") and reply.text.endswith("the total is 42")
        assert said(model.requests[1:], "41") == []
