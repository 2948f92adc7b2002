"""Two Roost apps on one PostgreSQL database, a chat's turns taken alternately: each run
starts from the session as committed, whichever app ran the turn before (the session
cache is checked against the stored session's version, bot/storage/sessions.py); and two
session stores on one database (SQLite and PostgreSQL) see each other's writes."""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app.roost import Roost
from bot.contracts.llm import ChatMessage, LLMRequest, LLMResponse, OnRetry, OnText
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.storage.sessions import SessionStore
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
        await asyncio.wait_for(replicas.releases_done(), 60)  # and the lease went with it
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
        for app in apps.apps:
            # Each app's first sweep claims what is open: over before the first message,
            # or it could take a message the other app received.
            replicas = app.dispatcher.replicas
            assert replicas is not None
            await asyncio.wait_for(replicas.claims_done(), 60)
        yield apps
    finally:
        for app in apps.apps:
            await app.close()


async def _turn(apps: Apps, chat: int, n: int, ran: dict[str, int]) -> None:
    """Turn ``n`` of the chat, to the app that did not run the one before; ``ran`` records
    which app's model answered each turn. One message is in flight at a time, the apps'
    first sweeps are over and leases last long (no sweep claims meanwhile), so the app
    that receives a message is the one that claims and runs it."""
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


async def _command_elsewhere(apps: Apps, text: str) -> int:
    """Chat 0's first turn, then the command ``text`` on the app that did not run it (a
    command runs on the app that received it); returns the app that ran the turn, which
    has the session cached from before the command."""
    ran: dict[str, int] = {}
    await _turn(apps, 0, 0, ran)
    first = ran["c0m0"]
    await apps.released(first, 0)
    await apps.say(1 - first, 0, text, 1)
    await apps.replied(0, 2)
    await apps.released(1 - first, 0)
    await apps.say(first, 0, "c0m1", 2)
    await apps.replied(0, 3)
    # The receiver ran it: the app whose cached session predates the command.
    assert _turns(apps.models[first].requests[-1])[-1:] == ["c0m1"], "it ran elsewhere"
    return first


async def test_a_pin_made_on_the_other_replica_reaches_the_next_run(two_apps: Apps) -> None:
    first = await _command_elsewhere(two_apps, "/pin the cat is called Tom")
    last = two_apps.models[first].requests[-1]
    assert "the cat is called Tom" in last.system
    assert _turns(last) == ["c0m0", "c0m0", "c0m1"]


async def test_a_reset_on_the_other_replica_starts_the_next_run_afresh(
        two_apps: Apps) -> None:
    first = await _command_elsewhere(two_apps, "/reset")
    assert _turns(two_apps.models[first].requests[-1]) == ["c0m1"]
    session = await two_apps.apps[first].store.get(_key(0))
    assert [m.content for m in session.messages] == ["c0m1", "re:c0m1"]


async def test_group_chatter_received_by_one_replica_reaches_a_run_on_the_other(
        two_apps: Apps) -> None:
    for n, (app, text) in enumerate([(0, "lunch at noon?"), (0, "pizza please")]):
        await two_apps.apps[app].dispatcher.submit(InboundMessage(
            "test", "g", "group", f"m{n}", text, sender_name=f"M{n}", mentioned=False,
            message_id=f"g{n}", event_id=f"g{n}"))
    await two_apps.apps[1].dispatcher.submit(InboundMessage(
        "test", "g", "group", "m0", "@bot c9m0 what did we decide?", mentioned=True,
        message_id="g2", event_id="g2"))
    async with two_apps.changed:
        await asyncio.wait_for(two_apps.changed.wait_for(lambda: two_apps.replies["g"]), 60)
    asked = [r for r in two_apps.models[1].requests if _turns(r)[-1:] == ["c9m0"]]
    assert len(asked) == 1
    assert "[M0 (id m0)]: lunch at noon?" in asked[0].note
    assert "[M1 (id m1)]: pizza please" in asked[0].note


# -- the session store, two processes' views of one database ---------------------------------


def _exchange(n: int) -> list[ChatMessage]:
    return [ChatMessage("user", f"q{n}"), ChatMessage("assistant", f"a{n}")]


@pytest.fixture
async def two_stores(database_url: str) -> AsyncIterator[tuple[SessionStore, SessionStore]]:
    """Two session stores on one database, each with its own connection(s) and cache."""
    one = await SessionStore.open(database_url, pool_size=2)
    other = await SessionStore.open(database_url, pool_size=2)
    try:
        yield one, other
    finally:
        await one.close()
        await other.close()


async def test_a_cached_session_is_reloaded_once_another_store_wrote_it(
        two_stores: tuple[SessionStore, SessionStore]) -> None:
    a, b = two_stores
    await a.append_run(await a.get("k"), "r0", _exchange(0))
    cached = await a.get("k")
    await b.append_run(await b.get("k"), "r1", _exchange(1))
    await b.set_facts(await b.get("k"), ["tea, no sugar"])
    fresh = await a.get("k")
    assert [m.content for m in fresh.messages] == ["q0", "a0", "q1", "a1"]
    assert fresh.facts == ["tea, no sugar"]
    assert fresh is not cached
    # Its own writes keep a copy current: no reload while no one else writes.
    await a.append_run(fresh, "r2", _exchange(2))
    assert await a.get("k") is fresh
    assert [m.content for m in fresh.messages][-2:] == ["q2", "a2"]


async def test_a_compaction_of_a_copy_another_store_compacted_meanwhile_is_dropped(
        two_stores: tuple[SessionStore, SessionStore]) -> None:
    a, b = two_stores
    session = await a.get("k")
    for n in range(3):
        await a.append_run(session, f"r{n}", _exchange(n))
    stale = await a.get("k")
    await b.compact(await b.get("k"), 2, "b's summary of q0")
    # a summarized its own (older) copy: applying it would compact q1 unsummarized.
    assert not await a.compact(stale, 2, "a's summary of q0")
    stored = await b.db.execute_fetchall(
        "SELECT summary, compactions FROM sessions WHERE key = 'k' AND archived_at IS NULL")
    assert [tuple(r) for r in stored] == [("b's summary of q0", 1)]
    active = await b.db.execute_fetchall(
        "SELECT content FROM messages WHERE compacted = 0 ORDER BY id")
    assert [r[0] for r in active] == ["q1", "a1", "q2", "a2"]
    fresh = await a.get("k")
    assert fresh.summary == "b's summary of q0" and fresh.compactions == 1
    assert [m.content for m in fresh.messages] == ["q1", "a1", "q2", "a2"]
