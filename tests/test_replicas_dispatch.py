"""Two Roost apps on one PostgreSQL database run a chat's messages where the session's
lease is (bot/dispatch/replicas.py): each message answered once, in order, with the
earlier turns in history, whichever app received it (and when both did); an app that
dies holding the lease is taken over once the lease expires, and its late commit is
refused by the fence."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.contracts.llm import LLMRequest, LLMResponse, OnRetry, OnText
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.testing.app import ChatChannel, create_app

KEY = "default:test:direct:u1"


class Echo:
    """A model that answers ``re:<token> after <n>``: the message's token and how many
    answers the history it was shown holds. ``hold`` tokens wait for ``release``."""

    name = "echo"

    def __init__(self, hold: str = "") -> None:
        self.hold = hold
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, request: LLMRequest, *, on_text: OnText | None = None,
                       on_retry: OnRetry | None = None) -> LLMResponse:
        users = [m for m in request.messages if m.role == "user"]
        answers = [m for m in request.messages if m.role == "assistant"]
        token = re.findall(r"\bm\d+\b", str(users[-1].content))[-1]
        if token == self.hold:
            self.holding.set()
            await self.release.wait()
        return LLMResponse(f"re:{token} after {len(answers)}")

    async def aclose(self) -> None:
        return None


class SharedChat(ChatChannel):
    """The chat as its one user sees it: replies from either app, in arrival order."""

    def __init__(self, seen: list[str], changed: asyncio.Condition) -> None:
        super().__init__("test", sender="u1")
        self.seen = seen
        self.changed = changed

    async def send(self, message: OutboundMessage) -> None:
        await super().send(message)
        self.seen.append(message.text)
        async with self.changed:
            self.changed.notify_all()


class Pair:
    """Two apps on one database and the chat they share."""

    def __init__(self) -> None:
        self.apps: list[Roost] = []
        self.providers: list[Echo] = []
        self.chats: list[SharedChat] = []
        self.seen: list[str] = []
        self.changed = asyncio.Condition()

    async def deliver(self, n: int, *to: int) -> None:
        """Message ``m<n>`` (platform id ``n``) delivered to the apps ``to``."""
        for i in to:
            await self.apps[i].dispatcher.submit(InboundMessage(
                "test", "u1", "direct", "u1", f"m{n}", message_id=str(n), event_id=str(n)))

    async def answered(self, count: int) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: len(self.seen) >= count), 60)


@pytest.fixture
async def make_pair(pg_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    made: list[Pair] = []

    async def make(hold: str = "", **settings: Any) -> Pair:
        pair = Pair()
        made.append(pair)
        for name in ("a", "b"):
            provider = Echo(hold if name == "b" else "")
            app, log = await create_app(provider, data_dir=tmp_path / name,
                                        database_url=pg_url, **settings)
            pair.apps.append(app)
            pair.providers.append(provider)
            chat = SharedChat(pair.seen, pair.changed)
            await chat.attach(app, log)
            pair.chats.append(chat)
            await app.recover()  # starts claiming (LISTEN, sweep)
        return pair

    try:
        yield make
    finally:
        for pair in made:
            for provider in pair.providers:
                provider.release.set()
            for app in pair.apps:
                await app.close()


async def _idle(pair: Pair) -> None:
    """Both apps have nothing running and every inbox entry is closed."""
    for app in pair.apps:
        await asyncio.wait_for(app.dispatcher.drain(), 60)
        assert app.dispatcher.replicas is not None
        await asyncio.wait_for(app.dispatcher.replicas.settled(), 60)
    assert await pair.apps[0].inbox.unfinished() == []


async def test_messages_delivered_to_either_replica_are_answered_once_in_order(
        make_pair: Any) -> None:
    pair: Pair = await make_pair()
    count = 12
    for n in range(count):
        # Alternately to each app; every third also to the other (a redelivery).
        first = n % 2
        await pair.deliver(n, first, 1 - first) if n % 3 == 0 else await pair.deliver(n, first)
    await pair.answered(count)
    await _idle(pair)
    # Each run saw every earlier turn: message n was answered after n answers.
    assert pair.seen == [f"re:m{n} after {n}" for n in range(count)]
    # No lease is left once the chat is idle.
    assert await _leases(pair.apps[0]) == {}


async def test_messages_to_the_lease_holder_while_it_runs_wait_their_turn(
        make_pair: Any) -> None:
    pair: Pair = await make_pair(hold="m0")
    await pair.deliver(0, 1)  # b takes the session and its run waits
    await pair.providers[1].holding.wait()
    assert await _leases(pair.apps[0]) == {KEY: pair.apps[1].replica}
    await pair.deliver(1, 0)  # a cannot claim it: the holder runs it next
    await pair.deliver(2, 0, 1)
    pair.providers[1].release.set()
    await pair.answered(3)
    await _idle(pair)
    assert pair.seen == ["re:m0 after 0", "re:m1 after 1", "re:m2 after 2"]
    assert [m.text for m in pair.chats[0].sent] == []  # all answered by the holder


async def test_a_dead_replicas_session_is_taken_over_after_its_lease(make_pair: Any) -> None:
    pair: Pair = await make_pair(hold="m1", lease_seconds=2)
    a, b = pair.apps
    await pair.deliver(0, 1)
    await pair.answered(1)
    await pair.deliver(1, 1)  # b runs it and hangs...
    await pair.providers[1].holding.wait()
    assert b.dispatcher.replicas is not None
    await b.dispatcher.replicas.halt()  # ...and dies: no renewal, no release
    await pair.deliver(2, 0)
    await pair.deliver(3, 0)
    # a claims the session once b's lease expired and runs m1 again, then m2 and m3.
    await pair.answered(4)
    assert pair.seen == [f"re:m{n} after {n}" for n in range(4)]
    assert await _leases(a) in ({}, {KEY: a.replica})
    # b's run ends late: the fence refuses its commit and it sends nothing.
    pair.providers[1].release.set()
    await asyncio.wait_for(b.dispatcher.drain(), 60)
    await asyncio.wait_for(a.dispatcher.drain(), 60)
    assert pair.seen == [f"re:m{n} after {n}" for n in range(4)]
    assert [m.text for m in pair.chats[1].sent] == ["re:m0 after 0"]
    assert await a.inbox.unfinished() == []


async def _leases(app: Roost) -> dict[str, str]:
    replicas = app.dispatcher.replicas
    assert replicas is not None
    return await replicas.claims.holders()
