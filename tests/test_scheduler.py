"""The scheduler: schedules, firing into the right chat, persistence, misfires, claims,
one-shots, retries, system jobs and the APScheduler timer; all on a fake clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.app.roost import Roost
from bot.config.settings import Settings, SetupError
from bot.contracts.hookspecs import hookimpl
from bot.contracts.jobs import JobSpec
from bot.contracts.llm import LLMProvider
from bot.contracts.messages import InboundMessage
from bot.engine.requests import RunOptions, RunResult
from bot.pluginhost.manager import get_plugin_manager
from bot.scheduling.cron import ScheduleError, format_duration, parse, parse_duration, zone
from bot.scheduling.requests import JobError
from bot.scheduling.scheduler import JobView, Scheduler
from bot.storage.jobs import Job
from bot.testing.app import ChatChannel, EventRecorder, scripted
from tests.conftest import AppFactory, make_chat

T0 = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)
"""A Monday, 08:00 UTC."""
UTC_ZONE = ZoneInfo("UTC")


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


CronApp = tuple[Roost, ChatChannel, EventRecorder, Scheduler]
CronAppFactory = Callable[..., Awaitable[CronApp]]


@pytest.fixture
async def cron_app(make_app: AppFactory) -> CronAppFactory:
    """``cron_app(provider, *plugins, clock=..., **settings)``.

    ``make_app``, plus a scheduler on ``clock`` (fired by the test, never by
    real time) whose retries do not wait; their delays land in ``sleeps``. Like
    ``make_app``, a second call is a restart of the service (same data dir).
    The scheduled memory flush is off: its system job would fire as the clock
    moves.
    """

    async def factory(llm: LLMProvider, /, *plugins: object, clock: FakeClock,
                      **settings: Any) -> CronApp:
        settings.setdefault("memory_flush", False)
        app, channel, log = await make_app(llm, *plugins, clock=clock, **settings)
        scheduler = app.services.scheduler
        assert scheduler is not None
        sleeps: list[float] = []

        async def no_wait(seconds: float) -> None:
            sleeps.append(seconds)

        scheduler.sleep = no_wait
        scheduler.sleeps = sleeps  # type: ignore[attr-defined]
        return app, channel, log, scheduler

    return factory


async def add(scheduler: Scheduler, schedule: str, message: str = "ping", *,
              user: str = "u1", chat: str = "", chat_type: str = "direct",
              thread: str | None = None, channel: str = "test", **kwargs: Any) -> JobView:
    """Add a cron job as ``user`` in ``chat`` (their direct chat by default)."""
    return await scheduler.add(owner_id=user, channel=channel, chat_id=chat or user,
                               chat_type="group" if chat_type == "group" else "direct",
                               thread_id=thread, schedule=schedule, message=message, **kwargs)


async def tick(scheduler: Scheduler, clock: FakeClock, **delta: float) -> int:
    """Move the clock, fire what is due, wait for the runs; how many started."""
    clock.advance(**delta)
    fires = await scheduler.run_due()
    await scheduler.wait_idle()
    return len(fires)


# -- schedules ------------------------------------------------------------------------------


def test_every_and_at_forms_parse_to_canonical_text() -> None:
    assert parse_duration("1h30m") == 5_400
    assert parse_duration("2 hours 10 minutes") == 7_800
    assert parse_duration("an hour") == parse_duration("hour") == 3_600
    assert format_duration(5_400) == "1h30m" and format_duration(86_400) == "1d"
    assert parse("every 90 seconds", UTC_ZONE, T0).text == "every 1m30s"
    first = parse("every 2h", UTC_ZONE, T0)
    assert first.first() == T0 + timedelta(hours=2)  # counted from creation, not at it
    paris = zone("Europe/Paris")
    relative = parse("at in 20 minutes", paris, T0)
    assert relative.text == "at 2030-01-07T09:20:00+01:00" and relative.one_shot
    assert parse("in 20 minutes", paris, T0).text == relative.text
    # A clock time is the next one in the job's zone (08:00 UTC is 09:00 in Paris).
    assert parse("at 9:30", paris, T0).first() == datetime(2030, 1, 7, 8, 30, tzinfo=UTC)
    assert parse("at 8:30", paris, T0).first() == datetime(2030, 1, 8, 7, 30, tzinfo=UTC)
    assert parse("at 7:59", UTC_ZONE, T0).first() == datetime(2030, 1, 8, 7, 59, tzinfo=UTC)
    naive = parse("at 2030-02-01 10:00", zone("America/New_York"), T0)
    assert naive.first() == datetime(2030, 2, 1, 15, 0, tzinfo=UTC)
    # Reloading the stored text gives the same instant, whatever the new anchor.
    assert parse(relative.text, paris, T0 + timedelta(days=3)).first() == relative.first()


def test_cron_expressions_mean_what_they_mean_in_cron() -> None:
    weekdays = parse("0 9 * * 1-5", UTC_ZONE, T0)
    fires = [weekdays.first()]
    for _ in range(5):
        last = fires[-1]
        assert last is not None
        fires.append(weekdays.following(last))
    # Monday 7 January 2030 through Friday, then Monday again: 1-5 is Mon-Fri, not Tue-Sat.
    assert [f.day for f in fires if f] == [7, 8, 9, 10, 11, 14]
    sunday = parse("30 6 * * 0", UTC_ZONE, T0).first()
    assert sunday is not None and sunday.strftime("%a %H:%M") == "Sun 06:30"
    assert parse("30 6 * * 7", UTC_ZONE, T0).first() == sunday
    # Both day fields restricted: either one matching fires (the 15th, and Mondays).
    either = parse("0 0 15 * 1", UTC_ZONE, T0)
    days: list[int] = []
    fire = either.first()
    while fire is not None and len(days) < 3:
        days.append(fire.day)
        fire = either.following(fire)
    assert days == [14, 15, 21]
    # Per-job time zone: 9:00 in New York is 14:00 UTC in winter.
    ny = parse("0 9 * * *", zone("America/New_York"), T0).first()
    assert ny == datetime(2030, 1, 7, 14, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "empty"),
    ("tomorrow morning", "cannot read the schedule"),
    ("61 * * * *", "bad cron expression"),
    ("0 9 * * 8", "day of week 8"),
    ("every 0s", "no time at all"),
    ("every fortnight", "duration"),
    ("at someday", "cannot read 'someday' as a time"),
    ("at 25:00", "not a time of day"),
])
def test_bad_schedules_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleError, match=fragment):
        parse(text, UTC_ZONE, T0)
    with pytest.raises(ScheduleError, match="IANA"):
        zone("Mars/Olympus")


# -- firing ----------------------------------------------------------------------------------


async def test_a_job_runs_as_its_owner_in_the_chat_and_thread_that_created_it(
    cron_app: CronAppFactory,
) -> None:
    clock = FakeClock()
    provider = scripted({"match": "stretch reminder$", "reply": "Time to stretch!"}, loop=True)
    app, channel, log, scheduler = await cron_app(provider, clock=clock)
    view = await add(scheduler, "every 1h", "stretch reminder", user="u7", chat="g1",
                     chat_type="group", thread="topic-3", name="stretch")
    assert view.next_fire == T0 + timedelta(hours=1)
    assert await tick(scheduler, clock, minutes=59) == 0
    assert await tick(scheduler, clock, minutes=1) == 1
    [sent] = channel.sent
    assert (sent.channel, sent.chat_id, sent.chat_type, sent.thread_id, sent.text) == (
        "test", "g1", "group", "topic-3", "Time to stretch!")
    started = [e for e in log.events if e.type == "run.started"]
    assert started[-1].payload["kind"] == "cron"
    assert started[-1].session_key == "default:test:group:g1:topic-3"
    request = provider.requests[-1]
    assert request.messages[-1].content.endswith("stretch reminder")  # "[name]: " in groups
    assert "(id u7)" in request.messages[-1].content
    session = await app.store.get("default:test:group:g1:topic-3")
    assert [(m.role, m.sender_id) for m in session.messages][:1] == [("user", "u7")]
    assert f"scheduled job {view.job.id} ('stretch')" in request.system
    assert "NO_REPLY" in request.system
    # The next hour fires again, into the same chat.
    assert await tick(scheduler, clock, hours=1) == 1
    assert channel.replies == ["Time to stretch!"] * 2


async def test_no_reply_delivers_nothing(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    _app, channel, _, scheduler = await cron_app(scripted({"reply": "NO_REPLY"}, loop=True),
                                                clock=clock)
    await add(scheduler, "every 5m", "check the queue")
    assert await tick(scheduler, clock, minutes=5) == 1
    assert channel.sent == []


async def test_jobs_survive_a_restart_and_keep_their_schedule(
    cron_app: CronAppFactory,
) -> None:
    clock = FakeClock()
    provider = scripted({"reply": "ran: {message}"}, loop=True)
    app, _, _, scheduler = await cron_app(provider, clock=clock)
    view = await add(scheduler, "every 10m", "water", name="hydrate")
    await tick(scheduler, clock, minutes=10)
    await app.close()

    clock.advance(minutes=5)
    _app2, channel2, _, scheduler2 = await cron_app(provider, clock=clock)
    [listed] = await scheduler2.jobs(channel="test", owner_id="u1")
    assert listed.job.id == view.job.id and listed.job.name == "hydrate"
    assert listed.job.last_fire == (T0 + timedelta(minutes=10)).timestamp()
    # Still on the 10-minute grid counted from creation, not from the restart.
    assert listed.next_fire == T0 + timedelta(minutes=20)
    assert channel2.sent == []
    assert await tick(scheduler2, clock, minutes=5) == 1
    assert channel2.replies == ["ran: water"]


async def test_missed_runs_within_the_grace_period_run_once(
    cron_app: CronAppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    provider = scripted({"reply": "ran"}, loop=True)
    app, _, _, scheduler = await cron_app(provider, clock=clock)
    await add(scheduler, "every 1m", "tick")
    await app.close()
    # Down for 3 fire times (08:01, 08:02, 08:03), back at 08:03:30: all within 5 minutes.
    clock.advance(minutes=3, seconds=30)
    caplog.set_level(logging.INFO, logger="roost.scheduling.scheduler")
    _, channel, log, scheduler2 = await cron_app(provider, clock=clock)
    await scheduler2.wait_idle()
    assert channel.replies == ["ran"]
    assert [e.type for e in log.events].count("run.started") == 1
    assert "3 runs due since the service was down, coalesced into one" in caplog.text
    assert "tick" in provider.requests[-1].messages[-1].content
    assert "stands for 3 runs" in provider.requests[-1].system
    # The next fire time is the regular one after the coalesced run.
    [view] = await scheduler2.jobs()
    assert view.next_fire == T0 + timedelta(minutes=4)


async def test_missed_runs_beyond_the_grace_period_are_skipped_and_logged(
    cron_app: CronAppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(T0 + timedelta(minutes=59))  # 08:59
    provider = scripted({"reply": "ran"}, loop=True)
    app, _, _, scheduler = await cron_app(provider, clock=clock)
    daily = await add(scheduler, "0 9 * * *", "morning summary")
    once = await add(scheduler, "at 09:02", "one-off")
    await app.close()
    clock.advance(minutes=11)  # back at 09:10: both fire times are 8+ minutes old
    caplog.set_level(logging.WARNING, logger="roost.scheduling.due")
    _, channel, log, scheduler2 = await cron_app(provider, clock=clock)
    await scheduler2.wait_idle()
    assert channel.sent == [] and "run.started" not in [e.type for e in log.events]
    assert f"job {daily.job.id}: run(s) due since 2030-01-07T09:00:00+00:00" in caplog.text
    assert "skipped" in caplog.text and once.job.id in caplog.text
    # The daily job waits for tomorrow; the one-shot is gone for good.
    [view] = await scheduler2.jobs()
    assert view.job.id == daily.job.id
    assert view.next_fire == datetime(2030, 1, 8, 9, 0, tzinfo=UTC)


async def test_a_fire_time_runs_once_even_with_two_schedulers_on_one_database(
    cron_app: CronAppFactory,
) -> None:
    clock = FakeClock()
    provider = scripted({"reply": "ran"}, loop=True)
    _app1, channel1, _, scheduler1 = await cron_app(provider, clock=clock)
    await add(scheduler1, "every 1m", "tick")
    # A second service on the same data dir loads the same job before either fires.
    _app2, channel2, _, scheduler2 = await cron_app(provider, clock=clock)
    clock.advance(minutes=1)
    fires = await asyncio.gather(scheduler1.run_due(), scheduler2.run_due())
    await scheduler1.wait_idle()
    await scheduler2.wait_idle()
    assert sorted(len(f) for f in fires) == [0, 1]
    assert len(channel1.sent) + len(channel2.sent) == 1
    # The loser moved on too: the next minute is claimed by exactly one of them again.
    clock.advance(minutes=1)
    fires = await asyncio.gather(scheduler2.run_due(), scheduler1.run_due())
    assert sorted(len(f) for f in fires) == [0, 1]


async def test_a_claimed_fire_time_does_not_run_again_after_a_restart(
    cron_app: CronAppFactory,
) -> None:
    clock = FakeClock()
    gate = asyncio.Event()

    class SlowProvider:
        name = "slow"

        def __init__(self) -> None:
            self.calls = 0
            self.called = asyncio.Event()

        async def complete(self, request: Any, **_: Any) -> Any:
            self.calls += 1
            self.called.set()
            await gate.wait()
            raise AssertionError("never answered: the service stops first")

        async def aclose(self) -> None:
            pass

    slow = SlowProvider()
    app, _, _, scheduler = await cron_app(slow, clock=clock)
    await add(scheduler, "every 1m", "tick")
    clock.advance(minutes=1)
    assert len(await scheduler.run_due()) == 1
    await asyncio.wait_for(slow.called.wait(), 5)
    assert slow.calls == 1
    await app.close()  # the run dies with the service, after its fire time was claimed
    # Restarted within the grace period, at the same instant: nothing runs twice.
    provider = scripted({"reply": "ran"}, loop=True)
    _, channel, _, scheduler2 = await cron_app(provider, clock=clock)
    await scheduler2.wait_idle()
    assert channel.sent == [] and provider.requests == []
    assert await tick(scheduler2, clock, minutes=1) == 1


async def test_one_shot_jobs_run_once_and_delete_themselves(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    _app, channel, _, scheduler = await cron_app(scripted({"reply": "done"}, loop=True),
                                                clock=clock)
    view = await add(scheduler, "at in 20 minutes", "call mum")
    assert view.job.schedule == "at 2030-01-07T08:20:00+00:00"
    assert await tick(scheduler, clock, minutes=19) == 0
    assert await tick(scheduler, clock, minutes=1) == 1
    assert channel.replies == ["done"]
    assert await scheduler.jobs() == [] and await scheduler.store.get(view.job.id) is None
    assert await tick(scheduler, clock, minutes=30) == 0


async def test_a_failing_job_is_retried_then_reported_in_its_chat(
    cron_app: CronAppFactory,
) -> None:
    clock = FakeClock()
    provider = scripted({"steps": [{"error": "model overloaded"}]}, loop=True)
    _app, channel, _, scheduler = await cron_app(provider, clock=clock)
    view = await add(scheduler, "every 1h", "report", chat="g1", chat_type="group",
                     name="daily report")
    assert await tick(scheduler, clock, hours=1) == 1
    assert len(provider.requests) == 4  # the run and three retries
    assert scheduler.sleeps == [30.0, 120.0, 480.0]  # type: ignore[attr-defined]
    (notice,) = channel.sent  # one report, not an apology per attempt
    assert notice.kind == "notice" and notice.chat_id == "g1"
    assert notice.text.startswith(f"Scheduled job {view.job.id} ('daily report') failed 4 "
                                  "times")
    assert "model overloaded" in notice.text
    # The job itself stays: the next fire time is tried afresh.
    assert [v.job.id for v in await scheduler.jobs()] == [view.job.id]


async def test_a_retry_that_succeeds_reports_nothing(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    provider = scripted({"steps": [{"error": "flaky"}]}, {"reply": "fine"})
    _app, channel, _, scheduler = await cron_app(provider, clock=clock)
    await add(scheduler, "every 1h", "report")
    await tick(scheduler, clock, hours=1)
    assert len(provider.requests) == 2
    assert [m.text for m in channel.sent] == ["fine"]  # the failed attempt said nothing


async def test_a_run_whose_future_raises_counts_as_a_failure(
    cron_app: CronAppFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    app, channel, _, scheduler = await cron_app(scripted({"reply": "x"}, loop=True),
                                                clock=clock)
    calls: list[InboundMessage] = []

    def broken(message: InboundMessage, options: RunOptions | None = None,
               **kwargs: Any) -> asyncio.Future[RunResult]:
        calls.append(message)
        future: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        future.set_exception(RuntimeError("dropped: the chat's queue was full"))
        return future

    monkeypatch.setattr(app.dispatcher, "run_scheduled", broken)
    await add(scheduler, "every 1h", "report")
    await tick(scheduler, clock, hours=1)
    assert len(calls) == 4
    assert "queue was full" in channel.sent[-1].text


async def test_a_stopped_run_is_not_retried_or_reported(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    provider = scripted({"steps": [{"delay": 30, "reply": "too slow"}]}, loop=True)
    app, channel, log, scheduler = await cron_app(provider, clock=clock)
    await add(scheduler, "every 1h", "long job")
    clock.advance(hours=1)
    assert len(await scheduler.run_due()) == 1
    await log.wait_for("activity")  # the model is working on it
    assert app.dispatcher.stop_all("default:test:direct:u1")[0] == 1  # /stopall
    await scheduler.wait_idle()
    assert len(provider.requests) == 1 and channel.sent == []
    assert scheduler.sleeps == []  # type: ignore[attr-defined]


async def test_removing_a_job_stops_its_retries(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    provider = scripted({"steps": [{"error": "down"}]}, loop=True)
    _app, channel, _, scheduler = await cron_app(provider, clock=clock)
    view = await add(scheduler, "every 1h", "report")

    async def remove_while_waiting(seconds: float) -> None:
        await scheduler.remove(view.job.id, channel="test", owner_id="u1")

    scheduler.sleep = remove_while_waiting
    await tick(scheduler, clock, hours=1)
    assert len(provider.requests) == 1
    assert not any(m.kind == "notice" for m in channel.sent)


async def test_the_timer_being_a_little_late_is_not_a_misfire(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    _, channel, _, scheduler = await cron_app(scripted({"reply": "on time"}, loop=True),
                                              clock=clock, misfire_grace_seconds=0)
    await add(scheduler, "every 1h", "x")
    assert await tick(scheduler, clock, hours=1, seconds=2) == 1  # woken 2 s late
    assert await tick(scheduler, clock, hours=1, minutes=10) == 0  # 10 minutes late: skipped
    assert channel.replies == ["on time"]


async def test_a_job_waits_for_its_channel_and_runs_when_it_starts(
    cron_app: CronAppFactory,
) -> None:
    clock = FakeClock()
    provider = scripted({"reply": "hello other"}, loop=True)
    app, channel, _, scheduler = await cron_app(provider, clock=clock)
    await add(scheduler, "every 1m", "greet", channel="other")
    assert await tick(scheduler, clock, minutes=2) == 0  # no "other" channel here
    other = ChatChannel("other")  # a second channel, to see jobs wait for theirs
    await app.add_channel(other)  # comes up within the grace period: catches up once
    await scheduler.wait_idle()
    assert other.replies == ["hello other"] and channel.sent == []


# -- limits and ownership ----------------------------------------------------------------------


async def test_limits_are_refused_clearly(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    _, _, _, scheduler = await cron_app(scripted({"reply": "x"}), clock=clock)
    limits = {"max_jobs": 2, "min_interval": 300}  # what the cron plugin's table says
    await add(scheduler, "every 5m", "a", **limits)
    await add(scheduler, "*/5 * * * *", "b", **limits)
    with pytest.raises(JobError, match="you already have 2 scheduled jobs") as full:
        await add(scheduler, "every 1h", "c", **limits)
    assert full.value.code == "LIMIT_REACHED"
    await add(scheduler, "every 1h", "someone else's", user="u2", **limits)  # per user
    for text, gap in (("every 30s", "30s"), ("*/2 * * * *", "2m"), ("0,1 9 * * *", "1m")):
        with pytest.raises(JobError, match=f"would run every {gap}; jobs may run at most once "
                                           "every 5m") as short:
            await add(scheduler, text, "too often", user="u3", **limits)
        assert short.value.code == "INTERVAL_TOO_SHORT"
    with pytest.raises(JobError, match="has already passed") as past:
        await add(scheduler, "at 2029-12-31T23:00", "too late", user="u3")
    assert past.value.code == "TIME_PASSED"
    with pytest.raises(JobError, match="IANA") as bad_zone:
        await add(scheduler, "every 1h", "x", user="u3", timezone="Moon/Base")
    assert bad_zone.value.code == "INVALID_TIMEZONE"
    with pytest.raises(JobError, match="needs a message"):
        await add(scheduler, "every 1h", "  ", user="u3")


async def test_users_remove_only_their_own_jobs(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    _, _, _, scheduler = await cron_app(scripted({"reply": "x"}), clock=clock)
    mine = await add(scheduler, "every 1h", "mine", user="u1")
    with pytest.raises(JobError, match="you have no job") as missing:
        await scheduler.remove(mine.job.id, channel="test", owner_id="u2")
    assert missing.value.code == "NOT_FOUND"
    # The same user id on another platform is another person.
    with pytest.raises(JobError):
        await scheduler.remove(mine.job.id, channel="other", owner_id="u1")
    removed = await scheduler.remove(mine.job.id, channel="test", owner_id="u2", admin=True)
    assert removed.id == mine.job.id and await scheduler.jobs() == []


async def test_per_job_time_zone_decides_the_fire_time(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    _, _channel, _, scheduler = await cron_app(scripted({"reply": "bonjour"}, loop=True),
                                              clock=clock, timezone="Asia/Tokyo")
    tokyo = await add(scheduler, "0 18 * * *", "evening")  # the default zone: Tokyo
    paris = await add(scheduler, "0 9 * * *", "morning", timezone="Europe/Paris")
    assert tokyo.job.timezone == "Asia/Tokyo" and paris.job.timezone == "Europe/Paris"
    assert tokyo.next_fire == datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
    assert paris.next_fire == datetime(2030, 1, 8, 8, 0, tzinfo=UTC)
    assert await tick(scheduler, clock, hours=1) == 1


async def test_a_bad_timezone_setting_stops_startup(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="ROOST_TIMEZONE"):
        await Roost.create(Settings(data_dir=tmp_path, timezone="Nowhere/Land"),
                           host=get_plugin_manager(load_entry_points=False),
                           provider=scripted({"reply": "x"}))


# -- system jobs -----------------------------------------------------------------------------------


class Ticker:
    """A plugin with one system job, counting its runs."""

    def __init__(self, schedule: str = "every 1m", name: str = "tick") -> None:
        self.schedule = schedule
        self.name = name
        self.runs: list[Roost] = []

    @hookimpl
    def roost_scheduled_jobs(self, settings: Settings) -> list[JobSpec]:
        async def run(app: Roost) -> None:
            self.runs.append(app)

        return [JobSpec(self.name, self.schedule, run),
                JobSpec("broken", "whenever", run)]


async def test_system_jobs_run_on_schedule_and_survive_restarts(
    cron_app: CronAppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    caplog.set_level(logging.ERROR, logger="roost.scheduling.scheduler")
    ticker = Ticker()
    app, _, _, scheduler = await cron_app(scripted({"reply": "x"}), ticker, clock=clock)
    assert "scheduled job 'broken' is not scheduled" in caplog.text
    assert await tick(scheduler, clock, minutes=1) == 1
    assert ticker.runs == [app.runtime]
    await app.close()
    # Restarted at the same instant: the 08:01 run is not repeated...
    again = Ticker()
    app2, _, _, scheduler2 = await cron_app(scripted({"reply": "x"}), again, clock=clock)
    await scheduler2.wait_idle()
    assert again.runs == []
    # ...and the grid is kept: 08:02 is next.
    assert await tick(scheduler2, clock, minutes=1) == 1 and again.runs == [app2.runtime]
    views = await scheduler2.all_jobs()
    # The test's job, beside the built-in ones (error retention).
    assert "system:tick" in [v.job.id for v in views]
    assert all(v.job.id.startswith("system:") for v in views)
    assert await scheduler2.jobs() == []  # users never see system jobs as theirs
    with pytest.raises(JobError, match="system job") as refused:
        await scheduler2.remove("system:tick", channel="test", owner_id="u1", admin=True)
    assert refused.value.code == "NOT_ALLOWED"
    await app2.close()
    # A plugin that no longer offers the job: its row goes away.
    _, _, _, scheduler3 = await cron_app(scripted({"reply": "x"}), clock=clock)
    assert "system:tick" not in [v.job.id for v in await scheduler3.all_jobs()]


async def test_a_missed_system_job_runs_at_startup(cron_app: CronAppFactory) -> None:
    clock = FakeClock()
    app, _, _, _ = await cron_app(scripted({"reply": "x"}), Ticker("every 10m"), clock=clock)
    await app.close()
    clock.advance(minutes=12)
    ticker = Ticker("every 10m")
    _, _, _, scheduler = await cron_app(scripted({"reply": "x"}), ticker, clock=clock)
    await scheduler.wait_idle()
    assert len(ticker.runs) == 1


async def test_a_failing_system_job_is_logged(
    cron_app: CronAppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        @hookimpl
        def roost_scheduled_jobs(self, settings: Settings) -> JobSpec:
            async def run(app: Roost) -> None:
                raise RuntimeError("disk full")

            return JobSpec("fragile", "every 1m", run)

    clock = FakeClock()
    _, _, _, scheduler = await cron_app(scripted({"reply": "x"}), Broken(), clock=clock)
    caplog.set_level(logging.ERROR, logger="roost.scheduling.scheduler")
    assert await tick(scheduler, clock, minutes=1) == 1
    assert "scheduled job 'fragile'" in caplog.text and "disk full" in caplog.text


# -- the APScheduler timer ------------------------------------------------------------------


async def test_the_real_timer_registers_every_job_and_calls_back_into_run_due(
    tmp_path: Path,
) -> None:
    host = get_plugin_manager(load_entry_points=False)
    ticker = Ticker("every 1h")
    host.register(ticker, "ticker")
    app = await Roost.create(Settings(data_dir=tmp_path, memory_flush=False), host=host,
                             provider=scripted({"reply": "timer ran"}, loop=True))
    try:
        scheduler = app.services.scheduler
        assert scheduler is not None and scheduler.timer and scheduler.aps.running
        channel = make_chat()
        await app.add_channel(channel)
        view = await add(scheduler, "every 1m", "timed")
        aps_job = scheduler.aps.get_job(view.job.id)
        assert aps_job is not None and aps_job.next_run_time == view.next_fire
        assert scheduler.aps.get_job("system:tick") is not None
        # What APScheduler does at the fire time, without waiting for it.
        fake = FakeClock(view.next_fire or T0)
        scheduler.clock = fake
        await aps_job.func(*aps_job.args)
        await scheduler.wait_idle()
        assert channel.replies == ["timer ran"]
        await scheduler.remove(view.job.id, channel="test", owner_id="u1")
        assert scheduler.aps.get_job(view.job.id) is None
    finally:
        await app.close()
    assert scheduler.aps is None
    assert await scheduler.run_due(T0 + timedelta(days=1)) == []  # closed: nothing fires


async def test_a_job_row_from_the_store_lists_with_its_label() -> None:
    job = Job("abcd1234", "cron", "tea", "every 1h", "UTC")
    assert job.label == "abcd1234 ('tea')"
    assert Job("abcd1234", "cron", "", "every 1h", "UTC").label == "abcd1234"
