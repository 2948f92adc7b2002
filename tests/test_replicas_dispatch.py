"""Two Roost apps on one PostgreSQL database run a chat's messages where the session's
lease is (bot/dispatch/replicas.py): each message answered once, in order, with the
earlier turns in history, whichever app received it (and when both did); an app that
dies holding the lease is taken over once the lease expires, and its late commit is
refused by its lease check."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import os
import random
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app.roost import Roost
from bot.contracts.llm import LLMRequest, LLMResponse, OnRetry, OnText
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.testing.app import ChatChannel, create_app
from bot.testing.telegram import FakeTelegram
from bot.testing.telegram.wire import ALICE, BOB, Call, user
from tests.roost_processes import RoostProcess, start_roost, until_logged
from tests.test_cli import clean_env
from tests.test_run_all_channels import free_port

CAROL = user(44, "Carol", "carol")

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
        self.refusing = 0
        """Sends to refuse next (the platform answering 500)."""
        self.refused = asyncio.Event()

    async def send(self, message: OutboundMessage) -> None:
        if self.refusing:
            self.refusing -= 1
            self.refused.set()
            raise ConnectionError("500 Internal Server Error")
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
        await asyncio.wait_for(app.dispatcher.replicas.releases_done(), 60)
    assert await pair.apps[0].inbox.unfinished() == []


async def test_a_message_the_holder_records_waits_for_an_older_one_the_other_recorded(
        make_pair: Any) -> None:
    """The holder's wake-up for an entry the other replica recorded may come after the
    holder records a newer one itself (a loaded fresh-clone run had it): the newer one
    still runs second."""
    pair: Pair = await make_pair(hold="m0")
    holder = pair.apps[1]  # its model holds m0, so it holds the session
    await pair.deliver(0, 1)
    await asyncio.wait_for(pair.providers[1].holding.wait(), 30)
    assert holder.dispatcher.replicas is not None
    listener = holder.dispatcher.replicas._listener
    assert listener is not None
    woken, late = listener.on_wake, []
    listener.on_wake = late.append  # the holder's wake-ups are late...
    await pair.deliver(1, 0)  # ...for m1, recorded by the other replica
    await pair.deliver(2, 1)  # m2, recorded by the holder itself
    listener.on_wake = woken
    for key in late:
        if inspect.isawaitable(wake := woken(key)):
            await wake
    pair.providers[1].release.set()
    await pair.answered(3)
    await _idle(pair)
    assert pair.seen == ["re:m0 after 0", "re:m1 after 1", "re:m2 after 2"]


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
    # b's run ends late: its lease check refuses its commit and it sends nothing.
    pair.providers[1].release.set()
    await asyncio.wait_for(b.dispatcher.drain(), 60)
    await asyncio.wait_for(a.dispatcher.drain(), 60)
    assert pair.seen == [f"re:m{n} after {n}" for n in range(4)]
    assert [m.text for m in pair.chats[1].sent] == ["re:m0 after 0"]
    assert await a.inbox.unfinished() == []


async def test_a_reply_a_dead_replica_committed_is_sent_by_another_without_a_restart(
        make_pair: Any) -> None:
    pair: Pair = await make_pair(lease_seconds=2)
    a, b = pair.apps
    pair.chats[1].refusing = 1
    await pair.deliver(0, 1)  # b answers; the platform refuses it; b would retry in 5 s...
    await pair.chats[1].refused.wait()
    await b.store.writer.write(_nothing)  # b recorded the refusal
    assert await _outbox(b) == [("pending", b.replica, 0)]
    assert b.dispatcher.replicas is not None
    await b.dispatcher.replicas.halt()  # ...but dies first: no heartbeat, no retry
    b.dispatcher.redeliveries.cancel()
    await pair.answered(1)  # a takes the reply over once b's heartbeat expired
    assert pair.seen == ["re:m0 after 0"]
    assert [m.text for m in pair.chats[0].sent] == ["re:m0 after 0"]
    await asyncio.gather(*a.dispatcher.redeliveries.tasks)
    await a.store.writer.write(_nothing)
    assert await _outbox(a) == [("delivered", a.replica, 0)]


async def test_a_reply_whose_sending_mark_cannot_be_written_is_kept_and_sent_later(
        make_pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pair: Pair = await make_pair()
    lost: list[Roost] = []  # the replica whose database went away as it marked the reply
    gone = asyncio.Event()

    def database_gone_once(app: Roost) -> Any:
        mark = app.inbox.sending

        async def sending(outbox_id: int, on: bool = True) -> None:
            if not lost:
                lost.append(app)
                gone.set()
                raise ConnectionResetError("the connection to the database was lost")
            await mark(outbox_id, on)
        return sending

    for app in pair.apps:  # either replica may claim the message
        monkeypatch.setattr(app.inbox, "sending", database_gone_once(app))
    await pair.deliver(0, 0)
    await asyncio.wait_for(gone.wait(), 60)
    (app,) = lost
    await app.store.writer.write(_nothing)
    # Not handed to the platform unmarked: kept as a failed attempt, retried in 5 s.
    assert await _outbox(app) == [("pending", app.replica, 0)]
    assert pair.seen == []
    await pair.answered(1)
    assert pair.seen == ["re:m0 after 0"]
    await asyncio.gather(*app.dispatcher.redeliveries.tasks)
    await app.store.writer.write(_nothing)
    assert await _outbox(app) == [("delivered", app.replica, 0)]


async def test_a_stopping_replica_hands_its_sessions_over_before_the_lease_ends(
        make_pair: Any) -> None:
    pair: Pair = await make_pair(hold="m0", lease_seconds=600)
    a, b = pair.apps
    await pair.deliver(0, 1)  # b takes the session and its run waits
    await pair.providers[1].holding.wait()
    await pair.deliver(1, 0)  # held by b: a leaves it
    assert await _leases(a) == {KEY: b.replica}
    pair.apps.remove(b)
    await b.close()  # SIGTERM: the run is cancelled, its message goes back, leases go
    # a runs both long before the 600 s lease could end.
    await pair.answered(2)
    assert pair.seen == ["re:m0 after 0", "re:m1 after 1"]
    assert [m.text for m in pair.chats[1].sent] == []


async def _outbox(app: Roost) -> list[tuple[str, str, int]]:
    """Each reply's state, owner and ``sending`` mark."""
    rows = await app.store.db.execute_fetchall("SELECT state, owner, sending FROM outbox")
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]


async def _nothing(db: Any) -> None:
    return None


async def _leases(app: Roost) -> dict[str, str]:
    replicas = app.dispatcher.replicas
    assert replicas is not None
    return await replicas.claims.holders()


# -- roost run ------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_roost_run_replicas_behind_webhooks_answer_each_message_once_in_order(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram) -> None:
    (tmp_path / "script.yaml").write_text("turns:\n  - reply: 're:{message}'\nloop: true\n")
    ports = {name: free_port() for name in ("a", "b")}
    base = dict(ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(tmp_path / "script.yaml"),
                ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
                ROOST_DATABASE_URL=pg_url, ROOST_TELEGRAM_WEBHOOK_SECRET="s3cret",
                ROOST_LEASE_SECONDS="3", TELEGRAM_BOT_TOKEN=fake_telegram.token,
                TELEGRAM_API_BASE=fake_telegram.base_url,
                ROOST_TELEGRAM_RATE_LIMITS="false")  # its 1 reply/s per chat: waits only
    url = {name: f"http://127.0.0.1:{port}/telegram" for name, port in ports.items()}
    procs: dict[str, RoostProcess] = {}
    rng = random.Random(19)
    per_chat, senders = 8, (ALICE, BOB)
    try:
        for name in ("a", "b"):
            procs[name] = await start_roost(tmp_path / name, clean_env(
                **base, ROOST_TELEGRAM_WEBHOOK_URL=url[name],
                ROOST_TELEGRAM_WEBHOOK_PORT=str(ports[name])))
            await until_logged(procs[name], b"roost ready")
        async with aiohttp.ClientSession() as http:
            for n in range(per_chat):
                for sender in senders:
                    to = rng.choice(("a", "b"))
                    update = await _via(fake_telegram, url[to], f"m{n}", sender)
                    if rng.random() < 0.3:  # the same update to the other replica too
                        other = "b" if to == "a" else "a"
                        async with http.post(url[other], data=json.dumps(update), headers={
                                "Content-Type": "application/json",
                                "X-Telegram-Bot-Api-Secret-Token": "s3cret"}) as resp:
                            assert resp.status == 200
        await fake_telegram.wait_for("sendMessage", per_chat * len(senders), limit=60)
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                assert await proc.wait() == 0
        for sender in senders:
            assert fake_telegram.sent_texts(sender["id"]) == [
                f"re:m{n}" for n in range(per_chat)]
        assert len(fake_telegram.sent_texts()) == per_chat * len(senders)
    finally:
        await _killed(procs)


@pytest.mark.e2e
async def test_a_roost_run_replica_killed_mid_run_is_taken_over_after_its_lease(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram) -> None:
    (tmp_path / "echo.yaml").write_text("turns:\n  - reply: 're:{message}'\nloop: true\n")
    (tmp_path / "stuck.yaml").write_text(  # b hangs on the 'slow' message
        "turns:\n  - match: slow\n    reply: 'too late'\n    delay: 600\n"
        "  - reply: 're:{message}'\nloop: true\n")
    ports = {name: free_port() for name in ("a", "b")}
    base = dict(ROOST_PROVIDER="scripted", ROOST_STREAM_REPLIES="false",
                ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open", ROOST_DATABASE_URL=pg_url,
                ROOST_TELEGRAM_WEBHOOK_SECRET="s3cret", ROOST_LEASE_SECONDS="3",
                ROOST_TELEGRAM_RATE_LIMITS="false",  # its 1 reply/s per chat: waits only
                TELEGRAM_BOT_TOKEN=fake_telegram.token, TELEGRAM_API_BASE=fake_telegram.base_url)
    url = {name: f"http://127.0.0.1:{port}/telegram" for name, port in ports.items()}
    procs: dict[str, RoostProcess] = {}

    async def deliver(text: str, to: str) -> None:
        await _via(fake_telegram, url[to], text)

    try:
        for name, script in (("a", "echo.yaml"), ("b", "stuck.yaml")):
            procs[name] = await start_roost(tmp_path / name, clean_env(
                **base, ROOST_SCRIPT=str(tmp_path / script),
                ROOST_TELEGRAM_WEBHOOK_URL=url[name],
                ROOST_TELEGRAM_WEBHOOK_PORT=str(ports[name])))
            await until_logged(procs[name], b"roost ready")
        for n, to in enumerate("abab"):
            await deliver(f"m{n}", to)
        await fake_telegram.wait_for("sendMessage", 4, limit=30)
        await deliver("m4 slow", "b")
        await fake_telegram.wait_for("sendChatAction", 5, limit=30)  # b's run started
        procs["b"].kill()  # kill -9 while it holds the chat's lease
        await procs["b"].wait()
        for n in range(5, 8):
            await deliver(f"m{n}", "a")
        await fake_telegram.wait_for("sendMessage", 8, limit=60)
        procs["a"].send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await procs["a"].wait() == 0
        assert fake_telegram.sent_texts() == [
            "re:m0", "re:m1", "re:m2", "re:m3", "re:m4 slow", "re:m5", "re:m6", "re:m7"]
    finally:
        await _killed(procs)


@contextlib.asynccontextmanager
async def _replicas(tmp_path: Path, envs: dict[str, dict[str, str]],
                    ) -> AsyncIterator[dict[str, RoostProcess]]:
    """``roost run`` per environment, each ready; whatever is left running is killed."""
    procs: dict[str, RoostProcess] = {}
    try:
        for name, env in envs.items():
            procs[name] = await start_roost(tmp_path / name, env)
            await until_logged(procs[name], b"roost ready")
        yield procs
    finally:
        await _killed(procs)


async def _killed(procs: dict[str, RoostProcess]) -> None:
    for proc in procs.values():
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _stopped(proc: RoostProcess) -> None:
    """SIGTERM: the process exits cleanly."""
    proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        assert await proc.wait() == 0


def _replicas_env(tmp_path: Path, pg_url: str, fake: FakeTelegram, lease: int,
                  **scripts: str) -> dict[str, dict[str, str]]:
    """Each replica's environment: webhook on a port of its own, its own script."""
    base = dict(ROOST_PROVIDER="scripted", ROOST_STREAM_REPLIES="false",
                ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open", ROOST_DATABASE_URL=pg_url,
                ROOST_TELEGRAM_WEBHOOK_SECRET="s3cret", ROOST_LEASE_SECONDS=str(lease),
                ROOST_SHUTDOWN_GRACE_SECONDS="0.5", TELEGRAM_BOT_TOKEN=fake.token,
                TELEGRAM_API_BASE=fake.base_url)
    envs = {}
    for name, script in scripts.items():
        (tmp_path / f"{name}.yaml").write_text(script)
        port = free_port()
        envs[name] = clean_env(**base, ROOST_SCRIPT=str(tmp_path / f"{name}.yaml"),
                               ROOST_TELEGRAM_WEBHOOK_URL=f"http://127.0.0.1:{port}/telegram",
                               ROOST_TELEGRAM_WEBHOOK_PORT=str(port))
    return envs


ECHO = "turns:\n  - reply: 're:{message}'\nloop: true\n"


@pytest.mark.e2e
async def test_roost_run_replies_of_a_replica_killed_before_sending_go_out_once(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram) -> None:
    envs = _replicas_env(tmp_path, pg_url, fake_telegram, 3, a=ECHO, b=ECHO)
    async with _replicas(tmp_path, envs) as procs:
        # Alice's reply: b commits it, Telegram refuses it (b keeps it to retry in 5 s; a
        # 5xx the adapter would retry at once, still sending when b dies).
        fake_telegram.fail("sendMessage", 403)
        await _via(fake_telegram, envs["b"]["ROOST_TELEGRAM_WEBHOOK_URL"], "m0")
        await fake_telegram.wait_for("sendMessage", 1, limit=30, ok=False)
        # Carol's reply: Telegram says to wait 5 s, and b waits in its rate limiter: the
        # reply was not shown, so it must not count as under way when b dies there.
        fake_telegram.fail("sendMessage", 429, retry_after=5)
        await _via(fake_telegram, envs["b"]["ROOST_TELEGRAM_WEBHOOK_URL"], "m2", CAROL)
        await fake_telegram.wait_for("sendMessage", 2, limit=30, ok=False)
        # Bob's reply: Telegram takes it, and b is frozen before it can record that...
        b = procs["b"]

        def freeze_b(call: Call) -> None:
            if call.method == "sendMessage":
                fake_telegram.on_call = None
                os.kill(b.pid, signal.SIGSTOP)

        fake_telegram.on_call = freeze_b
        await _via(fake_telegram, envs["b"]["ROOST_TELEGRAM_WEBHOOK_URL"], "m1", BOB)
        await fake_telegram.wait_for("sendMessage", 1, limit=30)
        await _killed({"b": b})  # ...then killed: it retries nothing and records nothing
        assert len(fake_telegram.calls_of("sendMessage")) == 3
        # a, never restarted b, sends Alice's and Carol's replies once b's heartbeat
        # expired; Bob's went out before b died, so it is not sent again (at most once).
        await until_logged(procs["a"], b"not sent again")
        await fake_telegram.wait_for("sendMessage", 3, limit=45)
        await _stopped(procs["a"])
    assert fake_telegram.sent_texts(ALICE["id"]) == ["re:m0"]
    assert fake_telegram.sent_texts(BOB["id"]) == ["re:m1"]
    assert fake_telegram.sent_texts(CAROL["id"]) == ["re:m2"]


@pytest.mark.e2e
async def test_roost_run_sigterm_hands_the_session_over_before_the_lease_ends(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram) -> None:
    stuck = ("turns:\n  - match: slow\n    reply: 'too late'\n    delay: 600\n"
             "  - reply: 're:{message}'\nloop: true\n")
    envs = _replicas_env(tmp_path, pg_url, fake_telegram, 600, a=ECHO, b=stuck)
    async with _replicas(tmp_path, envs) as procs:
        await _via(fake_telegram, envs["b"]["ROOST_TELEGRAM_WEBHOOK_URL"], "m0 slow")
        await fake_telegram.wait_for("sendChatAction", 1, limit=30)  # b's run started
        await _via(fake_telegram, envs["a"]["ROOST_TELEGRAM_WEBHOOK_URL"], "m1")  # b holds it
        await _stopped(procs["b"])
        # a runs both: after b's hand-over, not after the 600 s lease.
        await fake_telegram.wait_for("sendMessage", 2, limit=60)
        await _stopped(procs["a"])
    assert fake_telegram.sent_texts() == ["re:m0 slow", "re:m1"]


async def _via(fake: FakeTelegram, url: str, text: str,
               sender: dict[str, Any] = ALICE) -> dict[str, Any]:
    """A private message the fake posts to the replica at ``url``; returns the update once
    that replica acknowledged it."""
    hook = fake.webhook
    assert hook is not None
    fake.webhook = dataclasses.replace(hook, url=url)  # the attempts list stays shared
    update = fake.private_message(text, sender=sender)
    update_id = int(update["update_id"])
    await fake.wait_until(lambda: any(
        u == update_id and 200 <= status < 300 for u, status in hook.attempts), limit=30)
    return update
