"""Two Roost apps on one PostgreSQL database, a chat's turns taken alternately: each run
starts from the session as committed, whichever app ran the turn before (the session
cache is checked against the stored session's version, bot/storage/sessions.py)."""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app.roost import Roost
from bot.contracts.llm import LLMRequest, LLMResponse, OnRetry, OnText
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.testing.app import ChatChannel, create_app

CHATS = 10
TURNS = 10
TOKEN = re.compile(r"c\d+m\d+")
"""A turn's token: ``c<chat>m<n>``, in the message and in its answer."""
LEASE = 600.0
"""Long enough that no sweep claims an unheld session during a test."""


class Recording:
    """A model that answers ``re:<token>`` and keeps every request it was sent."""

    name = "recording"

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []

    async def complete(self, request: LLMRequest, *, on_text: OnText | None = None,
                       on_retry: OnRetry | None = None) -> LLMResponse:
        self.requests.append(request)
        current = str([m for m in request.messages if m.role == "user"][-1].content)
        return LLMResponse("re:" + TOKEN.findall(current)[-1])

    async def aclose(self) -> None:
        return None


class Chats(ChatChannel):
    """The platform as the users see it: every reply from either app, per chat."""

    def __init__(self, replies: dict[str, list[str]], changed: asyncio.Condition) -> None:
        super().__init__("test")
        self.replies_by_chat = replies
        self.changed = changed

    async def send(self, message: OutboundMessage) -> None:
        await super().send(message)
        self.replies_by_chat[message.chat_id].append(message.text)
        async with self.changed:
            self.changed.notify_all()


class Apps:
    """Two apps on one database, their models and the chats they share."""

    def __init__(self) -> None:
        self.apps: list[Roost] = []
        self.models: list[Recording] = []
        self.replies: dict[str, list[str]] = defaultdict(list)
        self.changed = asyncio.Condition()

    async def say(self, app: int, chat: int, text: str, n: int) -> None:
        """``text`` from user ``u<chat>`` in a direct chat, delivered to app ``app`` only."""
        await self.apps[app].dispatcher.submit(InboundMessage(
            "test", f"u{chat}", "direct", f"u{chat}", text, message_id=f"{chat}-{n}",
            event_id=f"{chat}-{n}"))

    async def replied(self, chat: int, count: int) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(
                lambda: len(self.replies[f"u{chat}"]) >= count), 60)

    async def released(self, app: int, chat: int) -> None:
        """App ``app`` let the chat's session go: the next message's receiver takes it."""
        replicas = self.apps[app].dispatcher.replicas
        assert replicas is not None
        await asyncio.wait_for(self.apps[app].dispatcher.drain(), 60)  # its run ended,
        await asyncio.wait_for(replicas.settled(), 60)  # and the lease went with it
        assert _key(chat) not in replicas.held


@pytest.fixture
async def two_apps(pg_url: str, tmp_path: Path) -> AsyncIterator[Apps]:
    apps = Apps()
    try:
        for name in ("a", "b"):
            model = Recording()
            app, log = await create_app(model, data_dir=tmp_path / name, database_url=pg_url,
                                        lease_seconds=LEASE)
            apps.apps.append(app)
            apps.models.append(model)
            await Chats(apps.replies, apps.changed).attach(app, log)
            await app.recover()  # starts claiming (LISTEN, sweep)
        yield apps
    finally:
        for app in apps.apps:
            await app.close()


async def _turn(apps: Apps, chat: int, n: int, ran: dict[str, int]) -> None:
    """Turn ``n`` of the chat, to the app that did not run the one before; ``ran`` records
    which app's model answered each turn. One message is in flight at a time and leases
    last long (no sweep claims meanwhile), so the app that receives a message is the one
    that claims and runs it (a first turn may still meet an app's first sweep at start)."""
    token = f"c{chat}m{n}"
    app = (chat + n) % 2 if not n else 1 - ran[f"c{chat}m{n - 1}"]
    if n:
        await apps.released(1 - app, chat)
    await apps.say(app, chat, token, n)
    await apps.replied(chat, n + 1)
    ran[token] = next(i for i, model in enumerate(apps.models)
                      if any(_turns(r)[-1:] == [token] for r in model.requests))


def _turns(request: LLMRequest) -> list[str]:
    """The conversation a request shows: each message's token, in order."""
    return [TOKEN.findall(str(m.content))[-1] for m in request.messages
            if m.role in ("user", "assistant") and TOKEN.search(str(m.content))]


async def test_each_run_sees_every_earlier_turn_whichever_replica_ran_it(
        two_apps: Apps) -> None:
    ran: dict[str, int] = {}
    for n in range(TURNS):
        for chat in range(CHATS):
            await _turn(two_apps, chat, n, ran)
    for chat in range(CHATS):
        assert two_apps.replies[f"u{chat}"] == [f"re:c{chat}m{n}" for n in range(TURNS)]
        # Every turn after the first ran on the other app than the turn before.
        assert all(ran[f"c{chat}m{n}"] != ran[f"c{chat}m{n - 1}"] for n in range(1, TURNS))
    missing = []
    for chat in range(CHATS):
        for n in range(TURNS):
            token = f"c{chat}m{n}"
            asked = [r for model in two_apps.models for r in model.requests
                     if _turns(r)[-1:] == [token]]
            assert len(asked) == 1, f"{token} was asked {len(asked)} times"
            expected = [t for k in range(n) for t in (f"c{chat}m{k}", f"c{chat}m{k}")] + [token]
            if _turns(asked[0]) != expected:
                missing.append((token, _turns(asked[0])))
    assert not missing, f"{len(missing)} of {CHATS * TURNS} runs missed earlier turns: {missing}"


def _key(chat: int) -> str:
    return f"default:test:direct:u{chat}"


async def test_a_pin_made_on_the_other_replica_reaches_the_next_run(two_apps: Apps) -> None:
    await two_apps.say(0, 0, "c0m0", 0)
    await two_apps.replied(0, 1)
    await two_apps.released(0, 0)
    await two_apps.say(1, 0, "/pin the cat is called Tom", 1)  # a command: run by app b
    await two_apps.replied(0, 2)
    await two_apps.say(0, 0, "c0m1", 2)  # app a held the session before: its copy is old
    await two_apps.replied(0, 3)
    last = two_apps.models[0].requests[-1]
    assert "the cat is called Tom" in last.system
    assert _turns(last) == ["c0m0", "c0m0", "c0m1"]


async def test_a_reset_on_the_other_replica_starts_the_next_run_afresh(
        two_apps: Apps) -> None:
    await two_apps.say(0, 0, "c0m0", 0)
    await two_apps.replied(0, 1)
    await two_apps.released(0, 0)
    await two_apps.say(1, 0, "/reset", 1)
    await two_apps.replied(0, 2)
    await two_apps.say(0, 0, "c0m1", 2)
    await two_apps.replied(0, 3)
    assert _turns(two_apps.models[0].requests[-1]) == ["c0m1"]
    session = await two_apps.apps[0].store.get(_key(0))
    assert [m.content for m in session.messages] == ["c0m1", "re:c0m1"]
