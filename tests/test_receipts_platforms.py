"""Reactions as receipts on Discord and Slack, through discord.py and slack-bolt against the
fakes: the ack replaced by the done reaction (Discord: PUT then DELETE of the bot's own;
Slack: ``reactions.add``/``.remove``), people's reactions on replies handed to
``roost_reaction`` with the reply's run, a done reaction Discord refuses (404 Unknown
Message: the person deleted their message) or Slack rate-limits never touching the reply,
and on two replicas sharing PostgreSQL the run ending on the replica that did not put the
ack still replaces it, and a vote on its reply arriving at the other replica is stored with
the run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from bot.app.roost import Roost
from bot.storage.inbox import decode_message
from bot.testing.app import create_app, scripted, settle
from bot.testing.discord import CHANNEL_ID, USER_ID, FakeDiscord
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.slack import ALICE, CHANNEL, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy
from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from roost import ReplyReaction, Runtime, Tool, ToolContext, ToolResult, hookimpl
from tests.conftest import AppFactory

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
MESSAGES = r"/channels/\d+/messages$"
REACTIONS = r"/channels/\d+/messages/\d+/reactions/.+/@me"
HOLD = {"steps": [{"tool_calls": [{"name": "hold", "arguments": {}}]}, {"reply": "held"}]}
"""A scripted turn that waits in the ``hold`` tool until the test opens the gate."""


class Gate:
    """The ``hold`` tool: a run calling it waits until :attr:`opened` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def _hold(self, context: ToolContext, args: dict[str, Any]) -> ToolResult:
        self.entered.set()
        await self.opened.wait()
        return ToolResult("opened")

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        return [Tool("hold", "waits", {"type": "object", "properties": {}}, self._hold)]


class Heard:
    """Records the reactions on replies ``roost_reaction`` hears of."""

    def __init__(self) -> None:
        self.reactions: list[ReplyReaction] = []
        self.changed = asyncio.Condition()

    @hookimpl
    async def roost_reaction(self, reaction: ReplyReaction, app: Runtime) -> None:
        async with self.changed:
            self.reactions.append(reaction)
            self.changed.notify_all()

    async def wait(self, count: int) -> list[ReplyReaction]:
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(lambda: len(self.reactions) >= count)
        return self.reactions


async def run_of(app: Roost, message_id: str) -> tuple[str, str]:
    """The run that answered the person's message ``message_id``, and its session."""
    async with app.store.lock, app.store.db.execute(
            "SELECT message, run_id, session_key FROM inbox ORDER BY id") as cur:
        rows = await cur.fetchall()
    for message, run_id, key in rows:
        if decode_message(message).message_id == message_id:
            return str(run_id), str(key)
    raise AssertionError(f"no run answered {message_id}")


def discord_reactions(fake: FakeDiscord, message_id: int) -> list[tuple[str, str, int]]:
    """The bot's reaction calls on a message: (method, emoji, status)."""
    calls = fake.calls_to("PUT", REACTIONS) + fake.calls_to("DELETE", REACTIONS)
    return [(c.method, unquote(c.path.split("/")[-2]), c.status)
            for c in sorted(calls, key=fake.calls.index) if f"/messages/{message_id}/" in c.path]


async def test_discord_ack_done_a_vote_and_a_deleted_message(
        make_app: AppFactory, fake_discord: FakeDiscord) -> None:
    gate, heard = Gate(), Heard()
    app, _, _ = await make_app(scripted({"reply": "the answer"}, HOLD), gate, heard,
                               ack_reaction="👀", **fake_discord.settings())
    await app.add_channel(DiscordChannel(app.settings, guild_ready_timeout=0.05,
                                         delivery=FAST))
    mid = await fake_discord.guild_message("hello", mention=True)
    await fake_discord.wait_for_call("POST", MESSAGES)
    await settle(app)
    assert discord_reactions(fake_discord, mid) == [
        ("PUT", "👀", 204), ("PUT", "✅", 204), ("DELETE", "👀", 204)]
    assert fake_discord.reactions[mid] == ["✅"]
    [reply] = [m for m in fake_discord.messages.values() if m.content == "the answer"]
    await fake_discord.user_reaction(CHANNEL_ID, reply.id, "👍")
    [vote] = await heard.wait(1)
    assert (vote.event.user_id, vote.event.emoji, vote.event.added) == (str(USER_ID), "👍", True)
    assert (vote.run_id, vote.session_key) == await run_of(app, str(mid))
    # Deleted while its run works: Discord refuses the done reaction; the reply still goes.
    second = await fake_discord.guild_message("again", mention=True)
    await asyncio.wait_for(gate.entered.wait(), 5)
    await fake_discord.delete_message(second)
    gate.opened.set()
    await fake_discord.wait_for_call("POST", MESSAGES, count=2)
    await settle(app)
    assert [m.content for m in fake_discord.messages.values()][-1] == "held"
    assert discord_reactions(fake_discord, second)[-1] == ("PUT", "✅", 404)



async def slack_replica(fake: FakeSlack, data_dir: Path, *plugins: object,
                        turns: list[dict[str, Any]], **settings: Any) -> Roost:
    """An app with a Slack channel on the fake (its events go where ``fake.events_url`` says)."""
    app, _ = await create_app(scripted(*turns), *plugins, data_dir=data_dir, ack_reaction="👀",
                              stream_replies=False, **fake.settings(), **settings)
    await app.add_channel(SlackChannel(app.settings, host="127.0.0.1", policy=FAST))
    return app


def slack_channel(app: Roost) -> SlackChannel:
    channel = app.channels["slack"]
    assert isinstance(channel, SlackChannel)
    return channel


async def test_slack_ack_done_a_vote_and_a_rate_limited_done_reaction(
        tmp_path: Path, fake_slack: FakeSlack) -> None:
    gate, heard = Gate(), Heard()
    app = await slack_replica(fake_slack, tmp_path, gate, heard,
                              turns=[{"reply": "the answer"}, HOLD])
    try:
        fake_slack.events_url = slack_channel(app).events_url
        first = fake_slack.message(fake_slack.mention("hello"))
        await fake_slack.post_event(first)
        await settle(app)
        calls = fake_slack.calls_of("reactions.add") + fake_slack.calls_of("reactions.remove")
        assert [(c.method, c.params["name"]) for c in sorted(calls, key=lambda c: c.at)] == [
            ("reactions.add", "eyes"), ("reactions.add", "white_check_mark"),
            ("reactions.remove", "eyes")]
        assert fake_slack.reactions[(CHANNEL, first["ts"])] == ["white_check_mark"]
        [reply] = [ts for ts, m in fake_slack.messages.items() if m.text == "the answer"]
        await fake_slack.post_event(fake_slack.reaction(CHANNEL, reply, "+1"))
        [vote] = await heard.wait(1)
        assert (vote.event.user_id, vote.event.emoji, vote.event.added) == (ALICE, "👍", True)
        assert (vote.run_id, vote.session_key) == await run_of(app, first["ts"])
        # Rate limited when the run ends: the done reaction is dropped, not retried, and
        # the next reaction inside the window is not even tried; the reply goes out.
        second = fake_slack.message(fake_slack.mention("again"))
        await fake_slack.post_event(second)
        await asyncio.wait_for(gate.entered.wait(), 5)
        await fake_slack.wait_for("reactions.add", 3)
        fake_slack.fail("reactions.add", 429, retry_after=30)
        gate.opened.set()
        await settle(app)
        assert [m.text for m in fake_slack.messages.values()][-1] == "held"
        assert fake_slack.reactions[(CHANNEL, second["ts"])] == ["eyes"]
        third = fake_slack.message(fake_slack.mention("more"))
        await fake_slack.post_event(third)
        await settle(app)
        assert len(fake_slack.calls_of("reactions.add")) == 4
        assert (CHANNEL, third["ts"]) not in fake_slack.reactions
    finally:
        await app.close()


async def test_on_two_replicas_the_run_ends_elsewhere_and_still_replaces_the_ack(
        pg_url: str, tmp_path: Path, fake_slack: FakeSlack) -> None:
    gates = [Gate(), Gate()]
    apps = [await slack_replica(fake_slack, tmp_path / name, gate, database_url=pg_url,
                                turns=[HOLD, {"reply": "second answer"}])
            for name, gate in zip("ab", gates, strict=True)]
    try:
        for app in apps:
            await app.recover()  # starts claiming
        # Whichever replica takes the session runs a turn that waits...
        fake_slack.events_url = slack_channel(apps[0]).events_url
        await fake_slack.post_event(fake_slack.message(fake_slack.mention("hold on")))
        waits = {asyncio.ensure_future(g.entered.wait()): i for i, g in enumerate(gates)}
        done, pending = await asyncio.wait(waits, timeout=10,
                                           return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        runner = waits[done.pop()]
        # ...so the next message, received and acked by the other replica, runs there too.
        fake_slack.events_url = slack_channel(apps[1 - runner]).events_url
        second = fake_slack.message(fake_slack.mention("and this"))
        await fake_slack.post_event(second)
        await fake_slack.wait_for("reactions.add", 2)
        assert fake_slack.reactions[(CHANNEL, second["ts"])] == ["eyes"]
        gates[runner].opened.set()
        await fake_slack.wait_for("chat.postMessage", 2, limit=10)
        for app in apps:
            await asyncio.wait_for(app.dispatcher.drain(), 10)
        assert sorted(m.text for m in fake_slack.messages.values()) == ["held", "second answer"]
        assert not gates[1 - runner].entered.is_set()
        assert fake_slack.reactions[(CHANNEL, second["ts"])] == ["white_check_mark"]
        removed = [c for c in fake_slack.calls_of("reactions.remove")
                   if c.params["timestamp"] == second["ts"]]
        assert [(c.params["name"], c.error) for c in removed] == [("eyes", "")]
        # A 👎 on the reply, received by the replica that did not run it, is stored with the run.
        [reply] = [ts for ts, m in fake_slack.messages.items() if m.text == "second answer"]
        receiver = apps[1 - runner]
        name = slack_channel(receiver).name
        async with asyncio.timeout(10):  # the runner records the reply's ts once Slack answered
            while True:  # a row in the database: no event covers it
                if await receiver.inbox.reply_run(name, CHANNEL, reply) is not None:
                    break
                await asyncio.sleep(0.02)
        await fake_slack.post_event(fake_slack.reaction(CHANNEL, reply, "-1::skin-tone-3"))
        votes: list[Any] = []
        async with asyncio.timeout(10):  # the event is acknowledged before it is handled
            while not votes:  # a row in the database: no event covers it
                async with receiver.store.lock, receiver.store.db.execute(
                        "SELECT run_id, vote, user_id FROM feedback_votes") as cur:
                    votes = list(await cur.fetchall())
                if not votes:
                    await asyncio.sleep(0.02)
        assert [tuple(v) for v in votes] == [
            ((await run_of(apps[runner], second["ts"]))[0], "down", ALICE)]
    finally:
        for app in apps:
            await app.close()
