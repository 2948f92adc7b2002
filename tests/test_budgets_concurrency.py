"""Budgets under concurrency, on SQLite and PostgreSQL, and across two replicas.

Each model call reserves its worst case (estimated input + ``max_tokens``) in the
database before it runs and settles to the reported usage after (bot/engine/budgets.py):
however many runs start at once, on however many replicas, what is counted exceeds a
limit by at most one call's reservation. The model here is :class:`Spender`: it takes a
moment to answer (so the runs overlap) and always uses all of ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.agents.judge import JUDGE_SYSTEM
from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import ChatMessage, LLMRequest, LLMResponse, OnRetry, OnText, Usage
from bot.contracts.messages import InboundMessage
from bot.engine.compaction import SUMMARY_SYSTEM
from bot.engine.requests import RunRequest
from bot.storage.sessions import SessionStore
from bot.storage.usage import Limit, UsageStore, day_of
from bot.testing.app import ChatChannel, closing_apps, create_app, settle
from bot.testing.media import FileChat
from tests.media_helpers import ogg_opus
from tests.roost_forks import popen
from tests.test_cli import clean_env
from tests.test_scheduler import FakeClock

NOW = 1_900_000_000.0
"""A fixed moment (2030-03-17, UTC) for the usage counters."""
USER = "test:u1"
DAILY = "Your daily limit reached, resets at 00:00 UTC"


class Spender:
    """A model that answers after ``delay`` seconds, reporting about one token per four
    characters of the request as input and all of ``max_tokens`` as output."""

    name = "spender"

    def __init__(self, delay: float = 0.3) -> None:
        self.delay = delay
        self.calls: list[tuple[str, Usage, LLMRequest]] = []
        """(kind, usage, request) of every call answered: ``judge``, ``summary`` or ``run``."""

    async def complete(self, request: LLMRequest, *, on_text: OnText | None = None,
                       on_retry: OnRetry | None = None) -> LLMResponse:
        await asyncio.sleep(self.delay)
        chars = len(request.system) + len(request.note) + sum(
            len(m.content) for m in request.messages) + sum(
            len(t.name) + len(t.description) + len(str(t.input_schema)) for t in request.tools)
        usage = Usage(chars // 4 + 1, request.max_tokens)
        if request.system == JUDGE_SYSTEM:
            kind, text = "judge", '{"score": 1.0, "reasons": "fine"}'
        elif request.system.startswith(SUMMARY_SYSTEM[:40]):
            kind, text = "summary", "They talked."
        else:
            kind, text = "run", "ok"
        self.calls.append((kind, usage, request))
        return LLMResponse(text, (), usage, "end_turn")

    async def aclose(self) -> None:
        return None

    def spent(self) -> int:
        """Tokens of every call answered."""
        return sum(u.input_tokens + u.output_tokens for _, u, _ in self.calls)

    def worst_reservation(self) -> int:
        """An upper bound of one call's reservation: its largest input plus ``max_tokens``
        (the estimate of the input is within a few percent of what is reported)."""
        return max(int(u.input_tokens * 1.25) + r.max_tokens for _, u, r in self.calls)


Make = Callable[..., Awaitable[tuple[Roost, ChatChannel]]]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    """``make(provider, name="a", **settings)``: an app with a chat channel ``test``, its
    usage counters on :data:`NOW`; apps with the same ``database_url`` share it."""
    async with closing_apps() as apps:

        async def factory(provider: Any, name: str = "a",
                          **settings: Any) -> tuple[Roost, ChatChannel]:
            settings.setdefault("memory_flush", False)
            app, log = await create_app(provider, data_dir=tmp_path / name, **settings)
            apps.append(app)
            assert app.services.usage is not None
            app.services.usage.clock = lambda: NOW
            chat = ChatChannel("test", sender="u1")
            await chat.attach(app, log)
            if app.dispatcher.replicas is not None:
                await app.recover()  # starts claiming (LISTEN, sweep)
            return app, chat

        yield factory


def usage(app: Roost) -> UsageStore:
    assert app.services.usage is not None
    return app.services.usage


async def idle(*apps: Roost) -> None:
    """Every run and compaction of ``apps`` finished (PostgreSQL: every claimed entry)."""
    for _ in range(2):  # a replica may claim what the other's run left queued
        for app in apps:
            await asyncio.wait_for(app.dispatcher.drain(), 60)
            await asyncio.wait_for(app.engine.compactor.wait(), 60)
            await settle(app, 10)
            await usage(app).flush()


async def test_twelve_parallel_runs_stay_within_a_daily_budget_plus_one_reservation(
        make: Make, database_url: str) -> None:
    spender = Spender()
    app, chat = await make(spender, database_url=database_url, max_tokens=2_000,
                           budgets={"user_daily_tokens": 10_000})
    # 12 mentions at once in 12 groups: 12 sessions, one user.
    for k in range(12):
        await chat.say(f"question {k}", group=f"g{k}")
    await idle(app)
    counted = await usage(app).spent("user", USER, day_of(NOW))
    assert counted == spender.spent()  # every answered call is counted, nothing else
    bound = 10_000 + spender.worst_reservation()
    # Before: 12 calls admitted and counted, 12 x ~4,800 = ~58,000 against 10,000.
    assert counted <= bound, f"{counted:,} counted against 10,000 (bound {bound:,})"
    answered = [r for r in chat.replies if r == "ok"]
    refused = [r for r in chat.replies if r.startswith(DAILY)]
    assert len(answered) == len(spender.calls) >= 1
    assert len(answered) + len(refused) == 12 and refused
    # Nothing is left reserved once every call settled.
    assert await usage(app).held("user", USER, day_of(NOW)) == 0


async def test_nine_cron_jobs_due_together_stay_within_their_owners_budget(
        make: Make, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    spender = Spender()
    clock = FakeClock()
    app, _ = await make(spender, database_url=database_url, max_tokens=4_000, clock=clock,
                        budgets={"user_daily_tokens": 24_000})
    scheduler = app.services.scheduler
    assert scheduler is not None
    caplog.set_level(logging.INFO, "roost.dispatch.dispatcher")
    # Nine hourly jobs of one owner in nine chats, all due at the same moment.
    for k in range(9):
        await scheduler.add(owner_id="u1", channel="test", chat_id=f"g{k}",
                            chat_type="group", thread_id=None, schedule="every 1h",
                            message=f"job {k}")
    clock.advance(hours=1)
    assert len(await scheduler.run_due()) == 9
    await asyncio.wait_for(scheduler.wait_idle(), 60)
    await idle(app)
    counted = await usage(app).spent("user", USER, day_of(NOW))
    assert counted == spender.spent()
    bound = 24_000 + spender.worst_reservation()
    # Before: all nine ran, ~9 x 6,300 = ~57,000 against 24,000.
    assert counted <= bound, f"{counted:,} counted against 24,000 (bound {bound:,})"
    skipped = sum("scheduled cron run" in r.message and "skipped" in r.message
                  and DAILY in r.message for r in caplog.records)
    assert skipped == 9 - len(spender.calls) > 0


async def test_two_replicas_share_one_budget(make: Make, pg_url: str) -> None:
    spenders = [Spender(), Spender()]
    settings: dict[str, Any] = {"database_url": pg_url, "max_tokens": 2_000,
                                "budgets": {"user_daily_tokens": 10_000}}
    a, chat_a = await make(spenders[0], "a", **settings)
    b, chat_b = await make(spenders[1], "b", **settings)
    # The same user mentions the bot in 12 groups; each replica takes six of them.
    for k in range(12):
        await (chat_a if k % 2 else chat_b).say(f"question {k}", group=f"g{k}")
    await idle(a, b)
    counted = await usage(a).spent("user", USER, day_of(NOW))
    answered = sum(len(s.calls) for s in spenders)
    assert counted == sum(s.spent() for s in spenders)
    bound = 10_000 + max(s.worst_reservation() for s in spenders if s.calls)
    assert counted <= bound, f"{counted:,} counted against 10,000 (bound {bound:,})"
    replies = chat_a.replies + chat_b.replies
    assert sum(r == "ok" for r in replies) == answered
    assert sum(r.startswith(DAILY) for r in replies) == 12 - answered > 0


async def test_cron_jobs_due_together_on_two_replicas_share_one_budget(
        make: Make, pg_url: str) -> None:
    spenders = [Spender(), Spender()]
    settings: dict[str, Any] = {"database_url": pg_url, "max_tokens": 4_000,
                                "budgets": {"user_daily_tokens": 24_000}}
    apps = [(await make(spenders[0], "a", **settings))[0],
            (await make(spenders[1], "b", **settings))[0]]
    # Nine jobs of one owner, in nine chats, fire at once: five on one replica, four on the other.
    fired = [apps[k % 2].runtime.run_scheduled(
        InboundMessage("test", f"g{k}", "group", "u1", f"job {k}"), mode="minimal",
        kind="cron", deliver_failed=False) for k in range(9)]
    results = await asyncio.wait_for(asyncio.gather(*fired), 60)
    await idle(*apps)
    counted = await usage(apps[0]).spent("user", USER, day_of(NOW))
    assert counted == sum(s.spent() for s in spenders)
    bound = 24_000 + max(s.worst_reservation() for s in spenders if s.calls)
    assert counted <= bound, f"{counted:,} counted against 24,000 (bound {bound:,})"
    assert sum(r.status == "refused" for r in results) == 9 - sum(len(s.calls) for s in spenders)


async def test_a_cost_budget_holds_the_same_way(make: Make, database_url: str) -> None:
    spender = Spender()
    prices = {"priced": {"input": 10.0, "output": 20.0}}  # per million tokens
    app, chat = await make(spender, database_url=database_url, model="priced",
                           max_tokens=2_000, budgets={"user_daily_cost": 0.1, "prices": prices})
    for k in range(12):
        await chat.say(f"question {k}", group=f"g{k}")
    await idle(app)
    cost = await usage(app).cost("user", USER, day_of(NOW))
    spent = sum(u.input_tokens * 10.0 + u.output_tokens * 20.0
                for _, u, _ in spender.calls) / 1_000_000
    assert cost == pytest.approx(spent)
    worst = max(int(u.input_tokens * 1.25) * 10.0 + r.max_tokens * 20.0
                for _, u, r in spender.calls) / 1_000_000
    # Before: 12 calls of ~0.087 each, ~1.05 against 0.10.
    assert cost <= 0.1 + worst, f"{cost:.3f} spent against 0.10 (bound {0.1 + worst:.3f})"
    refusals = [r for r in chat.replies if r.startswith("Your daily spending limit reached")]
    assert len(refusals) + len(spender.calls) == 12 and refusals


async def test_the_request_rate_window_survives_a_restart(make: Make,
                                                          database_url: str) -> None:
    settings: dict[str, Any] = {"database_url": database_url,
                                "budgets": {"user_requests_per_minute": 2}}
    app, chat = await make(Spender(0), **settings)
    assert await chat.ask("one") == ["ok"]
    assert await chat.ask("two") == ["ok"]
    await app.close()
    # A restart (or another replica) sees the same minute.
    again, chat = await make(Spender(0), **settings)
    [refusal] = await chat.ask("three")
    assert refusal.startswith("Too many messages: at most 2 per minute. Try again in")
    usage(again).clock = lambda: NOW + 61
    assert await chat.ask("four") == ["ok"]


async def test_compaction_and_judges_count_against_the_owner(make: Make,
                                                            database_url: str) -> None:
    spender = Spender(0)
    app, chat = await make(
        spender, database_url=database_url, compact_min_messages=5, compact_keep_messages=2,
        agents={"default": {"judge": {"judges": [{"type": "llm"}]}}},
        budgets={"user_daily_tokens": 1_000_000})
    for k in range(4):
        assert await chat.ask(f"message {k}") == ["ok"]
        await idle(app)
    kinds = {kind for kind, _, _ in spender.calls}
    assert {"run", "judge", "summary"} <= kinds
    # Every call the owner's conversation caused is theirs: before, only the runs' own.
    counted = await usage(app).spent("user", USER, day_of(NOW))
    assert counted == spender.spent()
    assert await usage(app).spent("agent", "default", day_of(NOW)) == counted
    # ``runs`` still counts runs: the four answered messages, not their calls.
    assert (await usage(app).totals("user", USER, day_of(NOW))).runs == 4


async def test_a_scheduled_memory_flush_counts_against_the_sessions_user(
        make: Make, database_url: str) -> None:
    spender = Spender(0)
    app, chat = await make(spender, database_url=database_url)
    assert await chat.ask("remember that I like tea") == ["ok"]
    before = spender.spent()
    session = await app.store.get("default:test:direct:u1")
    # As plugins/memory/flush.py runs it: a background turn through the runtime.
    result = await app.runtime.run_turn(RunRequest(
        InboundMessage("test", "u1", "direct", "u1", "store durable memories"), session,
        mode="minimal", persist=False, kind="memory_flush"))
    assert result.status == "completed" and spender.spent() > before
    assert await usage(app).spent("user", USER, day_of(NOW)) == spender.spent()


async def test_eighty_percent_of_a_budget_warns_once(make: Make, database_url: str) -> None:
    spender = Spender(0)
    settings: dict[str, Any] = {"database_url": database_url, "max_tokens": 500,
                                "budgets": {"user_daily_tokens": 100_000}}
    app, chat = await make(spender, **settings)
    assert await chat.ask("hello") == ["ok"]
    per_run = spender.spent()
    # Lower the limit so that the next runs cross 80 % and stay below 100 %.
    limit = int(per_run * 3.4)
    await app.close()
    settings["budgets"] = {"user_daily_tokens": limit}
    app, chat = await make(spender, **settings)
    assert await chat.ask("two") == ["ok"]  # 2 of 3.4 runs: 59 %
    replies = await chat.ask("three")  # 88 %
    spent = spender.spent()
    assert replies == ["ok", f"Heads-up: you have used 80 % of the daily token budget "
                             f"({spent:,} of {limit:,})."]
    # Once per period, across restarts and replicas: the database remembers.
    await app.close()
    app, chat = await make(spender, **settings)
    assert await chat.ask("four") == ["ok"]  # 100 % + : no second warning
    [refusal] = await chat.ask("five")
    assert refusal.startswith(DAILY)


async def test_a_crashed_calls_reservation_expires(database_url: str) -> None:
    store = await SessionStore.open(database_url)
    try:
        now = [NOW]
        counters = UsageStore(store.db, store.lock, store.writer, clock=lambda: now[0])
        limit = [Limit("user", USER, day_of(NOW), tokens=10_000)]
        # A process reserved 9,000 and died before settling.
        assert await counters.reserve("dead", limit, 9_000, 0.0, ttl=600) is None
        assert await counters.reserve("second", limit, 9_000, 0.0, ttl=600) is None
        standing = await counters.reserve("third", limit, 9_000, 0.0, ttl=600)
        assert standing is not None and standing.held == 18_000
        await counters.settle("second", [("user", USER)], 1_000, 500, 0.0, limits=limit)
        now[0] += 601  # the dead process's hold has expired
        assert await counters.held("user", USER, day_of(NOW)) == 0
        assert await counters.drop_expired() == 1  # the daily retention job's sweep
        assert await counters.reserve("fourth", limit, 9_000, 0.0, ttl=600) is None
        assert await counters.spent("user", USER, day_of(NOW)) == 1_500
        # A user whose every call was refused spent nothing: /usage does not list them.
        broke = [Limit("user", "test:u2", day_of(NOW), tokens=10)]
        await counters.settle("x", [("user", "test:u2")], 6, 6, 0.0, limits=broke)
        assert await counters.reserve("y", broke, 100, 0.0, ttl=600) is not None
        never = [Limit("user", "test:u3", day_of(NOW), tokens=10)]
        assert await counters.reserve("z", never, 100, 0.0, ttl=600) is None
        await counters.settle("z", [("user", "test:u3")], 0, 0, 0.0, limits=never)
        assert [s.subject for s in await counters.top("user", day_of(NOW))] == [USER, "test:u2"]
    finally:
        await store.close()


class Ears:
    """A transcriber plugin that hears ``text`` in every voice note."""

    name = "ears"
    model = "ears-1"

    def __init__(self, text: str) -> None:
        self.text = text

    async def transcribe(self, data: bytes, mime_type: str, name: str) -> str:
        return self.text

    @hookimpl
    def roost_transcriber(self) -> Ears:
        return self


async def test_a_transcription_counts_against_the_sender(roost_app: Any) -> None:
    heard = "what is the weather tomorrow in the mountains " * 20
    chat = await FileChat.join(await roost_app(
        [{"reply": "sunny"}], ("ears", Ears(heard)),
        budgets={"user_daily_cost": 10_000.0, "prices": {"ears-1": {"output": 1_000_000.0}}}))
    assert chat.app is not None
    chat.app.services.usage.clock = lambda: NOW  # type: ignore[union-attr]
    await chat.say_with("", chat.add_file("v.ogg", ogg_opus(12), "voice",
                                          mime_type="audio/ogg"))
    await chat.settle()
    assert chat.replies == ["sunny"]
    done = next(e for e in chat.events if e.type == "run.completed")
    run = done.payload["usage"]["input_tokens"] + done.payload["usage"]["output_tokens"]
    transcript = len(heard.strip()) // 4 + 1
    store = usage(chat.app)
    await store.flush()
    assert await store.spent("user", "console:user", day_of(NOW)) == run + transcript
    # Priced as output of the transcriber's model (1.0 per token here).
    assert await store.cost("user", "console:user", day_of(NOW)) == transcript


async def test_a_call_cancelled_while_it_reserves_leaves_nothing_reserved(
        make: Make, database_url: str) -> None:
    app, _ = await make(Spender(0), database_url=database_url,
                        budgets={"user_daily_tokens": 10_000})
    payer = app.dispatcher.budgets.meter(
        InboundMessage("test", "u1", "direct", "u1", "hi"), "default")
    request = LLMRequest("m", "system", (ChatMessage("user", "hi"),), max_tokens=1_000)
    # /stop or a merge cancels the run while its reservation is being written.
    reserving = asyncio.ensure_future(payer.reserve(request, "spender"))
    await asyncio.sleep(0)
    reserving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reserving
    await usage(app).flush()
    assert await usage(app).held("user", USER, day_of(NOW)) == 0
    # A reservation that is not cancelled is held until settled.
    hold = await payer.reserve(request, "spender")
    assert await usage(app).held("user", USER, day_of(NOW)) > 1_000
    await hold.settle(Usage(10, 20), "m")
    assert await usage(app).held("user", USER, day_of(NOW)) == 0


async def test_a_run_whose_next_call_does_not_fit_ends_with_one_line(roost_app: Any) -> None:
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "no_such_tool", "arguments": {}}]},
                    {"reply": "done"}]}],
        budgets={"user_daily_tokens": 1_000})
    usage(chat.app).clock = lambda: NOW
    # The first call fits (nothing spent yet) and spends more than the day's 1,000 tokens.
    [reply] = await chat.ask("work", sender="u1")
    spent = await usage(chat.app).spent("user", "console:u1", day_of(NOW))
    assert reply == f"{DAILY} ({spent:,} of 1,000 tokens used)."
    assert len(chat.requests) == 1  # before: the second call was made and "done" answered
    session = await chat.app.store.get("default:console:direct:u1")
    assert [(m.role, m.content) for m in session.messages] == [("user", "work"),
                                                               ("assistant", reply)]


def test_a_killed_processs_reservation_is_shared_and_expires(tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text(
        "[budgets]\nuser_daily_tokens = 100000\nadmins_exempt = false\n", encoding="utf-8")
    script = tmp_path / "slow.yaml"
    script.write_text("turns:\n  - {reply: never, delay: 120}\n", encoding="utf-8")
    db = tmp_path / "data" / "roost.db"
    proc = popen(
        ["chat", "-m", "hello"], cwd=tmp_path,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=clean_env(ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script)))
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "no reservation"
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                    if conn.execute("SELECT COUNT(*) FROM usage_holds").fetchone()[0]:
                        break
            except sqlite3.OperationalError:  # not created or migrated yet
                pass
            time.sleep(0.05)
        proc.kill()  # SIGKILL while the model call is in flight: nothing is settled
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    asyncio.run(_after_the_kill(db, Settings().run_timeout))


async def _after_the_kill(db: Path, run_timeout: float) -> None:
    store = await SessionStore.open(db)
    try:
        now = [time.time()]  # the clock the killed process counted by
        counters = UsageStore(store.db, store.lock, store.writer, clock=lambda: now[0])
        day = day_of(now[0])
        held = await counters.held("user", "console:local", day)
        # Another process (a replica, a restart) sees the dead call's reservation...
        assert held > 0
        full = [Limit("user", "console:local", day, tokens=held)]
        assert await counters.reserve("next", full, 1, 0.0, ttl=60) is not None
        # ...until it expires, a minute after the longest a run may take.
        now[0] += run_timeout + 61
        assert await counters.held("user", "console:local", day) == 0
        assert await counters.reserve("next", full, 1, 0.0, ttl=60) is None
    finally:
        await store.close()



async def test_a_judge_call_that_does_not_fit_ends_the_run_with_the_refusal(
        make: Make, database_url: str) -> None:
    spender = Spender(0)
    _, chat = await make(spender, database_url=database_url,
                         agents={"default": {"judge": {"judges": [{"type": "llm"}]}}},
                         budgets={"user_daily_tokens": 1_000})
    # The answer's call fits (nothing spent yet) and spends the day; the judge's does not:
    # the unjudged answer is not delivered (before: it went out, judged or not).
    [reply] = await chat.ask("hello")
    assert reply.startswith(DAILY)
    assert [kind for kind, _, _ in spender.calls] == ["run"]


async def test_a_compaction_without_budget_left_is_one_log_line(
        make: Make, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    spender = Spender(0)
    _, chat = await make(spender, database_url=database_url, compact_min_messages=5,
                         compact_keep_messages=2, budgets={"user_daily_tokens": 20_000})
    caplog.set_level(logging.INFO, "roost.engine.compaction")
    # Three runs of ~8,000 tokens each fit (each starts below 20,000); the compaction
    # after the third does not.
    for k in range(3):
        assert await chat.ask(f"message {k}") == ["ok"]
    await chat.app.engine.compactor.wait()  # type: ignore[union-attr]
    assert [kind for kind, _, _ in spender.calls] == ["run"] * 3
    [line] = [r for r in caplog.records if r.name == "roost.engine.compaction"]
    assert line.levelno == logging.INFO and line.getMessage().startswith(
        f"compaction of default:test:direct:u1 skipped: {DAILY}")


async def test_token_and_cost_warnings_are_each_given_once(database_url: str) -> None:
    store = await SessionStore.open(database_url)
    try:
        counters = UsageStore(store.db, store.lock, store.writer, clock=lambda: NOW)
        both = [Limit("user", USER, day_of(NOW), tokens=1_000, cost=1.0)]
        subjects: list[tuple[Any, str]] = [("user", USER)]

        async def spend(tokens: int, cost: float) -> list[str]:
            warned = await counters.settle("h", subjects, tokens, 0, cost, limits=both)
            return [kind for _, kind in warned]

        assert await spend(500, 0.1) == []
        assert await spend(350, 0.1) == ["tokens"]  # 850 of 1,000 tokens
        assert await spend(10, 0.65) == ["cost"]  # 0.85 of 1.00
        assert await spend(10, 0.01) == []  # each once per period
        # The daily retention job forgets them two months on (their period is long over).
        later = UsageStore(store.db, store.lock, store.writer, clock=lambda: NOW + 63 * 86_400)
        await later.drop_expired()
        assert await spend(10, 0.01) == ["tokens", "cost"]  # the same day, remembered no more
    finally:
        await store.close()
