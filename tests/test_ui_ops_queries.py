"""The Control UI's operations queries and actions (bot.ui.queries): usage, access,
outbox, jobs and plugins, against a real app and its store (SQLite; the PostgreSQL
run of the same reads is in test_ui_ops_pages)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.pluginhost.state import load_disabled
from bot.scheduling.requests import JobError
from bot.storage.usage import day_of
from bot.testing.app import ChatChannel, scripted
from bot.ui.queries import access, jobs, outbox, plugins, usage
from bot.ui.queries.opsdb import BadCursor
from tests.conftest import AppFactory
from tests.test_scheduler import FakeClock, cron_app, tick

__all__ = ["cron_app"]


class FlakyChat(ChatChannel):
    """A chat whose platform refuses sends while ``down`` (as a platform outage does)."""

    def __init__(self) -> None:
        super().__init__("test", sender="u1")
        self.down = False
        self.refused = 0

    async def send(self, message: OutboundMessage) -> None:
        if self.down:
            self.refused += 1
            raise ConnectionError("platform unavailable: 502 Bad Gateway")
        await super().send(message)


async def eventually(check: Callable[[], Awaitable[bool]], limit: float = 5.0) -> None:
    """Wait until ``check()`` holds (what another task commits)."""
    for _ in range(int(limit / 0.02)):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("it did not happen in time")


# -- usage --------------------------------------------------------------------------------


async def test_usage_report_counts_days_subjects_models_and_cron_jobs(
        cron_app: Any) -> None:
    clock = FakeClock()
    app, channel, _, scheduler = await cron_app(
        scripted({"reply": "ok {message}"}, loop=True), clock=clock)
    await channel.ask("hello there, how are you today?")
    view = await scheduler.add(owner_id="u1", channel="test", chat_id="u1", chat_type="direct",
                               thread_id=None, schedule="every 1h", message="report")
    await tick(scheduler, clock, hours=1)
    assert app.services.usage is not None
    await app.services.usage.flush()
    now = app.services.usage.clock()  # the counters' days are the wall clock's
    report = await usage.usage_report(app.store, app.settings, days=7, now=now)
    assert [d.key for d in report.days][-1] == day_of(now)
    assert report.total.tokens > 0 and report.total.runs == 2
    assert [t.key for t in report.top["user"]] == ["test:u1"]
    models = report.top["model"]
    assert len(models) == 1 and models[0].tokens == report.total.tokens
    assert [t.key for t in report.top["job"]] == [f"cron:{view.job.id}"]
    assert report.limits == []  # no [budgets] limit set


async def test_a_heartbeat_run_is_counted_as_the_heartbeat_job(make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "HEARTBEAT_OK"}, loop=True))
    result = await app.runtime.run_scheduled(
        InboundMessage("test", "u1", "direct", "u1", "check in"), mode="minimal",
        kind="heartbeat", persist=False)
    assert result.status == "completed"
    assert app.services.usage is not None
    await app.services.usage.flush()
    report = await usage.usage_report(app.store, app.settings, days=1,
                                      now=app.services.usage.clock())
    assert [t.key for t in report.top["job"]] == ["heartbeat"]
    assert report.top["job"][0].runs == 1


async def test_budget_gauges_list_who_is_near_or_over_a_limit(make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "x"}), budgets={
        "user_daily_tokens": 1000, "agent_daily_cost": 2.0},
        agents={"support": {"budgets": {"user_daily_tokens": 500}}})
    store = app.services.usage
    assert store is not None
    now = 1_800_000_000.0
    for user, tokens in (("a", 900), ("b", 1200), ("c", 100), ("d", 450)):
        store.record([("user", f"test:{user}")], tokens, 0, 0.0, now)
    store.record([("agent", "default")], 10, 0, 1.7, now)
    await store.flush()
    limits = await usage.budget_limits(app.store, app.settings, now)
    by = {(r.agent, r.scope, r.kind): r for r in limits}
    users = by[("", "user", "tokens")]
    assert [(g.subject, g.state) for g in users.gauges] == [("test:b", "over"),
                                                            ("test:a", "near")]
    support = by[("support", "user", "tokens")]
    assert support.limit == 500
    assert [(g.subject, g.state) for g in support.gauges] == [
        ("test:b", "over"), ("test:a", "over"), ("test:d", "near")]
    agents = by[("", "agent", "cost")]
    assert [(g.subject, round(g.share, 2)) for g in agents.gauges] == [("default", 0.85)]


async def test_usage_days_are_bounded_and_empty_days_are_zero(make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "x"}))
    store = app.services.usage
    assert store is not None
    now = 1_800_000_000.0
    store.record([("agent", "default"), ("model", "m1")], 100, 50, 0.5, now - 86_400 * 2,
                 cache_read_tokens=40)
    store.record([("agent", "default"), ("model", "m1")], 999, 999, 9.0, now - 86_400 * 40)
    await store.flush()
    report = await usage.usage_report(app.store, app.settings, days=3, now=now)
    assert [d.tokens for d in report.days] == [150, 0, 0]
    assert report.days[0].cache_hit == 0.4 and report.total.cost == 0.5
    assert report.peak_tokens == 150
    big = await usage.usage_report(app.store, app.settings, days=10_000, now=now)
    assert len(big.days) == usage.MAX_DAYS


# -- access -------------------------------------------------------------------------------


async def test_approving_a_code_lets_the_users_next_dm_be_answered(
        make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "answer: {message}"}, loop=True),
                                     dm_policy="pairing")
    refusal = await channel.ask("hi", sender="stranger")
    assert "pair" in refusal[-1].lower()
    page = await access.access_page(app)
    (request,) = page.pending
    assert request.user == "test:stranger"
    assert await access.approve(app, request.code, "ui:ada") is not None
    assert await channel.ask("hello again", sender="stranger") == ["answer: hello again"]
    page = await access.access_page(app)
    assert page.pending == [] and [u.user for u in page.paired] == ["test:stranger"]
    assert page.paired[0].approved_by == "ui:ada"
    # Revoked: refused again, with a new code.
    assert await access.revoke(app, "test:stranger", "ui:ada")
    assert "pair" in (await channel.ask("and now?", sender="stranger"))[-1].lower()


async def test_a_denied_code_cannot_be_approved_and_the_user_gets_a_new_one(
        make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "answer"}, loop=True),
                                     dm_policy="pairing")
    await channel.ask("hi", sender="mallory")
    (request,) = (await access.access_page(app)).pending
    assert await access.deny(app, request.code, "ui:ada")
    assert not await access.deny(app, request.code, "ui:ada")
    assert await access.approve(app, request.code, "ui:ada") is None
    assert (await access.access_page(app)).pending == []
    await channel.ask("hi again", sender="mallory")
    (again,) = (await access.access_page(app)).pending
    assert again.code != request.code


async def test_paired_users_page_by_keyset(make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "x"}))
    store = access.access_store(app)
    for n in range(5):
        store.clock = lambda n=n: 1_000.0 + n  # type: ignore[misc]
        await store.refuse("test", f"user{n}", f"user{n}")
        (request,) = [r for r in await store.pending() if r.user_id == f"user{n}"]
        await store.approve(request.code, "cli")
    first = await access.access_page(app, limit=2)
    assert [u.user_id for u in first.paired] == ["user4", "user3"]
    second = await access.access_page(app, before=first.next_cursor, limit=2)
    third = await access.access_page(app, before=second.next_cursor, limit=2)
    assert [u.user_id for u in second.paired + third.paired] == ["user2", "user1", "user0"]
    assert third.next_cursor is None
    with pytest.raises(BadCursor):
        await access.access_page(app, before="nope")


# -- outbox -------------------------------------------------------------------------------


async def _flaky_app(make_app: AppFactory, tmp_path: Path) -> tuple[Any, FlakyChat]:
    app, _, _ = await make_app(scripted({"reply": "reply to {message}"}, loop=True))
    chat = FlakyChat()
    await chat.attach(app)
    return app, chat


async def test_retry_now_sends_an_undelivered_reply_once(make_app: AppFactory,
                                                         tmp_path: Path) -> None:
    app, chat = await _flaky_app(make_app, tmp_path)
    chat.down = True
    await chat.say("first")
    await chat.settle()
    await app.store.writer.write(lambda db: asyncio.sleep(0))  # the failure is committed
    page = await outbox.outbox_page(app)
    (row,) = page.rows
    assert (row.state, row.attempts, row.text) == ("pending", 1, "reply to first")
    assert "502 Bad Gateway" in row.last_error and page.pending == 1
    chat.down = False
    assert await outbox.retry(app, row.id) is not None
    await chat.wait_for_message()
    assert chat.replies == ["reply to first"]

    async def delivered() -> bool:
        return (await outbox.outbox_page(app)).rows == []

    await eventually(delivered)
    # The attempt that was waiting (5 s) was replaced, not left to send a second copy.
    assert not app.dispatcher.redeliveries.tasks
    assert chat.replies == ["reply to first"]


async def test_a_given_up_reply_is_retried_and_a_dropped_one_never_goes(
        make_app: AppFactory, tmp_path: Path) -> None:
    app, chat = await _flaky_app(make_app, tmp_path)
    chat.down = True
    await chat.say("one")
    await chat.say("two")
    await chat.settle()
    await app.store.writer.write(lambda db: asyncio.sleep(0))
    rows = (await outbox.outbox_page(app)).rows
    assert [r.text for r in rows] == ["reply to two", "reply to one"]
    two, one = rows
    app.inbox.not_delivered(one.id, final=True, error="given up")
    await app.store.writer.write(lambda db: asyncio.sleep(0))
    page = await outbox.outbox_page(app)
    assert (page.pending, page.failed) == (1, 1)
    assert await outbox.drop(app, two.id)
    assert not await outbox.drop(app, two.id)
    chat.down = False
    assert await outbox.retry(app, one.id) is not None
    await chat.wait_for_message()
    assert chat.replies == ["reply to one"]
    # The dropped reply's attempt that was waiting wakes (now) and finds it gone.
    app.dispatcher.redeliveries.schedule(two.id, OutboundMessage("test", "u1", two.text),
                                         None, 1, delay=0.0)
    await asyncio.gather(*app.dispatcher.redeliveries.tasks, return_exceptions=True)
    assert chat.replies == ["reply to one"]
    assert await outbox.retry(app, two.id) is None


async def test_outbox_pages_by_id(make_app: AppFactory, tmp_path: Path) -> None:
    app, chat = await _flaky_app(make_app, tmp_path)
    chat.down = True
    for n in range(5):
        await chat.say(f"m{n}")
        await chat.settle()
    await app.store.writer.write(lambda db: asyncio.sleep(0))
    first = await outbox.outbox_page(app, limit=3)
    rest = await outbox.outbox_page(app, before=first.next_cursor, limit=3)
    assert [r.text for r in first.rows + rest.rows] == [f"reply to m{n}" for n in range(4, -1, -1)]
    assert rest.next_cursor is None
    with pytest.raises(BadCursor):
        await outbox.outbox_page(app, before="1 OR 1=1")


# -- jobs -----------------------------------------------------------------------------------


async def test_run_now_pause_resume_and_delete(cron_app: Any) -> None:
    clock = FakeClock()
    app, channel, _, scheduler = await cron_app(
        scripted({"reply": "fired: {message}"}, loop=True), clock=clock,
        budgets={"prices": {"claude-sonnet-5-5": {"input": 1000.0, "output": 1000.0}}})
    view = await scheduler.add(owner_id="u1", channel="test", chat_id="u1", chat_type="direct",
                               thread_id=None, schedule="every 1h", message="water the plants")
    job_id = view.job.id
    await jobs.run_now(app, job_id)
    await scheduler.wait_idle()
    await channel.settle()
    assert channel.replies == ["fired: water the plants"]
    page = await jobs.jobs_page(app, now=clock.now.timestamp())
    (row,) = [r for r in page.rows if r.job.id == job_id]
    (fire,) = row.fires
    assert fire.manual and fire.status == "completed" and fire.run_id
    assert fire.tokens > 0 and fire.cost is not None and fire.cost > 0
    assert row.next_fire is not None
    # Paused: its fire time passes without a run.
    await jobs.pause(app, job_id, True)
    assert await tick(scheduler, clock, hours=1) == 0
    assert channel.replies == ["fired: water the plants"]
    await jobs.pause(app, job_id, False)
    assert await tick(scheduler, clock, hours=1) == 1
    await channel.settle()
    assert len(channel.replies) == 2
    row = next(r for r in (await jobs.jobs_page(app, now=time.time())).rows
               if r.job.id == job_id)
    assert [f.manual for f in row.fires] == [False, True]
    assert row.today.tokens > 0  # the job's own usage counter
    await jobs.delete(app, job_id)
    assert all(r.job.id != job_id for r in (await jobs.jobs_page(
        app, now=clock.now.timestamp())).rows)
    with pytest.raises(JobError):
        await jobs.run_now(app, job_id)
    # A job of a channel this process does not run is not run here (its reply could not
    # go out), as the schedule leaves it due for the process that runs it.
    elsewhere = await scheduler.add(owner_id="u1", channel="slack", chat_id="C1",
                                    chat_type="direct", thread_id=None, schedule="every 1h",
                                    message="hi")
    with pytest.raises(JobError, match="not running"):
        await jobs.run_now(app, elsewhere.job.id)


# -- plugins --------------------------------------------------------------------------------


async def test_disabling_a_plugin_removes_its_tools_and_is_persisted(
        make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "x"}))
    page = plugins.plugins_page(app)
    row = next(p for p in page.plugins if p.name == "plugins.cron")
    assert row.enabled and "roost_tools" in row.hooks
    assert "cron" in app.plugins.now.tools
    text = await plugins.set_enabled(app, "plugins.cron", False)
    assert "disabled" in text
    assert "cron" not in app.plugins.now.tools
    assert "plugins.cron" in await load_disabled(app.store.db, app.store.lock)
    assert not next(p for p in plugins.plugins_page(app).plugins
                    if p.name == "plugins.cron").enabled
    await plugins.set_enabled(app, "plugins.cron", True)
    assert "cron" in app.plugins.now.tools
