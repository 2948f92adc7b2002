"""The scheduler: persisted jobs, fire-time claims, misfires, retries.

Two kinds of job share one table (``jobs``, in the service's SQLite database):

- **cron** jobs that users create through the ``cron`` tool: a message that
  runs as an agent turn in the chat that created the job, as its owner;
- **system** jobs that plugins offer through ``roost_scheduled_jobs``: a
  coroutine ``func(runtime)``. They are re-registered at every start; their row
  only keeps the anchor and the last fire time across restarts.

Timing is APScheduler's: every job is an APScheduler job with the job's own
trigger (:mod:`bot.scheduling.cron`), run by an ``AsyncIOScheduler`` on the
service's loop (:mod:`bot.scheduling.alarm`). But APScheduler only *wakes* Roost
up; what runs is decided by :meth:`Scheduler.run_due`, which works from a clock
it is given and the database alone, so tests drive it with a fake clock and no
waiting:

1. A job is due when its next fire time is not after ``now``.
2. Fire times older than ``now - misfire_grace_seconds`` are skipped and
   logged (the service was down too long for them to be useful); the due fire
   times inside the grace window are coalesced into one run, for the latest
   (:mod:`bot.scheduling.due`).
3. That fire time is **claimed** in the database: ``last_fire`` is set to it
   only if it is still earlier (one conditional ``UPDATE``). Only a successful
   claim runs the job, so no fire time runs twice: not after a restart (the
   claim is already stored), and not when two schedulers share a database
   (only one ``UPDATE`` matches). The price is at-most-once: a claimed run
   that dies with the process is not repeated.
4. Cron jobs run only where their channel is running: a job whose channel
   has not started yet (or is not part of this process, as under
   ``roost chat``) stays due, unclaimed, and is caught up by
   :meth:`Scheduler.channel_started`, within the grace period like any misfire.

Why a table of our own rather than an APScheduler job store: the SQLAlchemy
store would add SQLAlchemy and pickle callables (a pickled bound method of a
service object does not survive a restart or an upgrade), and it knows
nothing of owners, chats or limits. Our rows are plain columns written with
parameterized SQL on the shared connection; ownership and the per-user limit
are ``WHERE`` clauses, and the claim is one atomic statement.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bot.config.settings import Settings
from bot.contracts.jobs import JobSpec
from bot.contracts.messages import ChatType
from bot.resilience.retry import RetryPolicy
from bot.scheduling.alarm import Alarm
from bot.scheduling.cron import ScheduleError, parse, zone
from bot.scheduling.cron_runs import CRON_RETRY, run_cron_job
from bot.scheduling.due import Entry, Fire, due
from bot.scheduling.requests import (
    MAX_JOBS_PER_USER,
    MIN_INTERVAL_SECONDS,
    JobError,
    check_request,
    new_id,
)
from bot.storage.jobs import Job, JobRun, JobStore

if TYPE_CHECKING:
    from bot.contracts.runtime import Runtime

log = logging.getLogger("roost.scheduling.scheduler")

Clock = Callable[[], datetime]
"""Returns the current time as an aware datetime."""
Sleep = Callable[[float], Awaitable[None]]

TIMER_SLACK_SECONDS = 5
"""A run this late is on time whatever ``misfire_grace_seconds`` says: the timer wakes
a little after the fire time, later still when thousands of jobs fire together."""

def utc_now() -> datetime:
    """The real clock."""
    return datetime.now(UTC)


def _ts(moment: datetime) -> float:
    return moment.timestamp()


def _dt(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as listed: the row and when it runs next (``None``: not scheduled here)."""

    job: Job
    next_fire: datetime | None


class Scheduler:
    """Loads, times and runs jobs; offers add/list/remove to the ``cron`` tool and ``/cron``.

    With ``clock=None`` it keeps real time and APScheduler wakes it up; with a
    clock it keeps that clock's time and never starts APScheduler: the caller
    drives it with :meth:`run_due` (tests, benchmarks). ``sleep`` waits between
    retries (tests pass one that returns at once).
    """

    def __init__(self, store: JobStore, settings: Settings, *, clock: Clock | None = None,
                 sleep: Sleep = asyncio.sleep,
                 retry: RetryPolicy = CRON_RETRY,
                 on_fire: Callable[[str], None] | None = None) -> None:
        """``on_fire(kind)`` is told of each scheduled run started (the metrics)."""
        self.store = store
        self.settings = settings
        self.clock: Clock = clock or utc_now
        self.timer = clock is None
        self.sleep = sleep
        self.retry = retry
        try:
            self.tz = zone(settings.timezone)
        except ScheduleError as exc:
            raise ValueError(f"timezone setting: {exc} (set ROOST_TIMEZONE)") from None
        self.runtime: Runtime | None = None
        """What system jobs receive and cron runs go through; set by :meth:`start`."""
        self.alarm = Alarm(self.tz, lambda ids: self.run_due(only=ids), self._spawn)
        """Wakes the scheduler at fire times (with the real clock only)."""
        self._jobs: dict[str, Entry] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.on_fire = on_fire
        """Told the kind (``cron``, ``system``) of each run the scheduler starts (metrics)."""

    @property
    def aps(self) -> Any:
        """The ``AsyncIOScheduler`` while running with the real clock."""
        return self.alarm.aps

    # -- lifecycle ------------------------------------------------------------------

    async def start(self, runtime: Runtime, specs: Sequence[JobSpec] = ()) -> None:
        """Load the stored jobs, register ``specs``, catch up, and start the timer.

        System jobs that are due (missed while the service was down) run now;
        cron jobs wait for their channel (:meth:`channel_started`).
        """
        self.runtime = runtime
        now = self._now()
        done: list[str] = []
        for job in await self.store.all():
            if job.kind == "system":
                continue  # re-registered from the plugins below, or dropped
            entry = self._load(job)
            if entry is None:
                continue
            if entry.schedule.one_shot and job.last_fire is not None:
                done.append(job.id)  # ran (or was claimed) before the service stopped
                continue
            self._jobs[job.id] = entry
        await self.store.delete_many(done)
        await self._register_system(specs, now)
        if self.timer:
            self.alarm.start(self._jobs.values(), self._now())
        await self.run_due(now)

    async def sync_system(self, specs: Sequence[JobSpec]) -> None:
        """Replace the system jobs with ``specs`` (a plugin was enabled or disabled).

        Jobs of a disabled plugin stop firing and their rows go; jobs of an
        enabled one are registered as at startup.
        """
        if self._closed:
            return
        now = self._now()
        for job_id in [j for j, e in self._jobs.items() if e.job.kind == "system"]:
            self.alarm.untime(job_id)
            del self._jobs[job_id]
        await self._register_system(specs, now)
        for entry in self._jobs.values():
            if entry.job.kind == "system":
                self.alarm.time(entry, now)

    async def close(self) -> None:
        """Stop the timer and cancel runs waiting to retry; nothing fires after this."""
        self._closed = True
        await self.alarm.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def channel_started(self, channel: str) -> list[Fire]:
        """Run the jobs of ``channel`` that came due while it was not running."""
        if self.runtime is None or self._closed:
            return []
        return await self.run_due(channel=channel)

    async def wait_idle(self) -> None:
        """Wait until every run the scheduler started (and its retries) is over."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _now(self) -> datetime:
        # Whole seconds: anchors and fire times are stored as floats and compared exactly.
        return self.clock().astimezone(UTC).replace(microsecond=0)

    def _load(self, job: Job) -> Entry | None:
        try:
            tz = zone(job.timezone)
            schedule = parse(job.schedule, tz, _dt(job.created_at),
                             allow_at=job.kind == "cron")
        except ScheduleError as exc:
            log.error("job %s: cannot use its schedule %r (%s); it is not scheduled",
                      job.id, job.schedule, exc)
            return None
        if job.last_fire is None:
            next_fire = schedule.first()
        else:
            next_fire = schedule.following(_dt(job.last_fire))
        return Entry(job, schedule, next_fire)

    async def _register_system(self, specs: Sequence[JobSpec], now: datetime) -> None:
        stored = {j.id: j for j in await self.store.find(kind="system")}
        keep: set[str] = set()
        for spec in specs:
            job_id = f"system:{spec.name}"
            if job_id in keep:
                log.error("scheduled job %r offered twice; the later one is ignored", spec.name)
                continue
            try:
                text = parse(spec.schedule, self.tz, now, allow_at=False).text
            except ScheduleError as exc:
                log.error("scheduled job %r is not scheduled: %s", spec.name, exc)
                continue
            keep.add(job_id)
            job = stored.get(job_id)
            if job is None or job.schedule != text or job.timezone != self.tz.key:
                # New, or its schedule changed: its fire times count from now. Otherwise
                # the stored anchor and last fire carry over, so a restart neither
                # shifts the schedule nor repeats a fire time.
                job = Job(job_id, "system", spec.name, text, self.tz.key, created_at=_ts(now))
                await self.store.upsert(job)
            entry = self._load(job)
            if entry is not None:
                entry.spec = spec
                self._jobs[job_id] = entry
        # Rows of jobs no plugin offers any more.
        await self.store.delete_many(set(stored) - keep)

    # -- firing ---------------------------------------------------------------------------

    async def run_due(self, now: datetime | None = None, *,
                      only: Collection[str] | None = None,
                      channel: str | None = None) -> list[Fire]:
        """Start every due job (``only`` these IDs, or ``channel``'s); the runs started.

        ``now`` defaults to the scheduler's clock. Misfires older than the
        grace period are skipped, the rest coalesced into one run per job,
        and each run's fire time is claimed first (see the module docstring).
        """
        if self.runtime is None or self._closed:
            return []
        now = (now or self.clock()).astimezone(UTC)
        grace = max(self.settings.misfire_grace_seconds, TIMER_SLACK_SECONDS)
        entries: Iterable[Entry]
        if only is not None:
            entries = [e for e in map(self._jobs.get, only) if e is not None]
        else:
            entries = list(self._jobs.values())
        wanted, expired = due(entries, now, grace, running=self.runtime.channels,
                              channel=channel)
        if expired:
            await self._forget(expired)
        if not wanted:
            return []
        won = await self.store.claim([(e.job.id, _ts(fire)) for e, fire, _ in wanted])
        fires: list[Fire] = []
        lost: list[Entry] = []
        for entry, fire, count in wanted:
            entry.next_fire = entry.schedule.following(fire)
            if entry.job.id not in won:
                lost.append(entry)
                log.info("job %s: fire time %s already claimed or the job is paused; not run"
                         " here", entry.job.label, fire.isoformat())
                continue
            entry.job = replace(entry.job, last_fire=_ts(fire))
            if count > 1:
                log.info("job %s: %d runs due since the service was down, coalesced into one",
                         entry.job.label, count)
            started = Fire(entry.job, fire, count)
            fires.append(started)
            if self.on_fire is not None:
                self.on_fire(entry.job.kind)
            self._spawn(self._execute(entry, started))
        if lost:
            # A claim fails when another scheduler ran that fire time, or the row is gone.
            present = await self.store.existing(e.job.id for e in lost)
            gone = [e for e in lost if e.job.id not in present or e.next_fire is None]
            for entry in gone:
                self._jobs.pop(entry.job.id, None)
                self.alarm.untime(entry.job.id)
        return fires

    async def _forget(self, entries: Sequence[Entry]) -> None:
        """Drop jobs that will never fire again (one-shots whose time is long past)."""
        for entry in entries:
            self._jobs.pop(entry.job.id, None)
            self.alarm.untime(entry.job.id)
        await self.store.delete_many(e.job.id for e in entries if e.job.kind == "cron")

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("scheduled run crashed", exc_info=task.exception())

    async def _execute(self, entry: Entry, fire: Fire, *, manual: bool = False) -> None:
        if entry.spec is not None:
            await self._run_system(entry.spec, fire, manual=manual)
            return
        try:
            await self._run_cron(entry, fire, manual=manual)
        finally:
            # A run now leaves the job as scheduled.
            if entry.schedule.one_shot and not self._closed and not manual:
                # Done (or given up): a one-shot never fires again. On shutdown the
                # row stays and the next start deletes it (it has a last_fire).
                self._jobs.pop(entry.job.id, None)
                try:
                    await self.store.delete(entry.job.id)
                except (sqlite3.Error, ValueError):
                    log.exception("job %s ran but could not be deleted", entry.job.id)

    async def _run_system(self, spec: JobSpec, fire: Fire, *, manual: bool = False) -> None:
        assert self.runtime is not None
        status, error = "completed", ""
        try:
            await spec.func(self.runtime)
        except Exception as exc:
            status, error = "failed", str(exc) or type(exc).__name__
            log.exception("scheduled job %r (fire time %s) failed", spec.name,
                          fire.fire_time.isoformat())
        await self._record(fire, None, status, error, manual)

    async def _run_cron(self, entry: Entry, fire: Fire, *, manual: bool = False) -> None:
        assert self.runtime is not None
        # Read again: its pre-approvals may have changed, on any replica.
        job = await self.store.get(entry.job.id) or entry.job
        outcome = await run_cron_job(
            self.runtime, job, fire, entry.schedule.tz, self.retry, self.sleep,
            wanted=lambda: not self._closed and (manual or job.id in self._jobs))
        await self._record(fire, outcome.run_id, outcome.status, outcome.error, manual)

    async def _record(self, fire: Fire, run_id: str | None, status: str, error: str,
                      manual: bool) -> None:
        try:
            await self.store.record_run(JobRun(fire.job.id, _ts(fire.fire_time),
                                               _ts(self.clock()), run_id, status, error,
                                               manual))
        except (sqlite3.Error, ValueError, OSError) as exc:
            log.warning("job %s ran but its outcome could not be recorded: %s",
                        fire.job.label, exc)

    # -- what the Control UI uses ----------------------------------------------------------

    async def run_now(self, job_id: str) -> Job:
        """Start a run of the job at once, outside its schedule (which stays as it is).

        Raises :class:`JobError` (``NOT_FOUND``; ``NOT_ALLOWED`` for a system job not
        registered in this process, or before the scheduler started).
        """
        job = await self.store.get(job_id)
        if job is None:
            raise JobError(f"there is no job {job_id!r}", "NOT_FOUND")
        if self.runtime is None or self._closed:
            raise JobError("the scheduler is not running", "NOT_ALLOWED")
        entry = self._jobs.get(job_id)
        if entry is None and job.kind == "system":
            raise JobError(f"{job_id} is not registered in this process", "NOT_ALLOWED")
        if job.kind == "cron" and job.channel not in self.runtime.channels:
            raise JobError(f"its channel {job.channel!r} is not running in this process",
                           "NOT_ALLOWED")
        if entry is None:
            entry = self._load(job)  # added by another replica since this one started
            if entry is None:
                raise JobError(f"{job_id} has a schedule that cannot be used", "NOT_ALLOWED")
        if self.on_fire is not None:
            self.on_fire(job.kind)
        log.info("job %s: run now", job.label)
        self._spawn(self._execute(entry, Fire(job, self._now(), 1), manual=True))
        return job

    async def pause(self, job_id: str, paused: bool) -> Job:
        """Pause the job (its fire times pass without a run, on every replica) or resume it.

        Raises :class:`JobError` (``NOT_FOUND``).
        """
        when = _ts(self._now()) if paused else None
        if not await self.store.set_paused(job_id, when):
            raise JobError(f"there is no job {job_id!r}", "NOT_FOUND")
        entry = self._jobs.get(job_id)
        if entry is not None:
            entry.job = replace(entry.job, paused_at=when)
        job = await self.store.get(job_id)
        if job is None:
            raise JobError(f"there is no job {job_id!r}", "NOT_FOUND")
        log.info("job %s %s", job.label, "paused" if paused else "resumed")
        return job

    def view(self, job: Job) -> JobView:
        """``job`` as listed, with when it fires next in this process."""
        return self._view(job)

    # -- what the cron tool and /cron use ---------------------------------------------------

    async def add(self, *, owner_id: str, channel: str, chat_id: str, chat_type: ChatType,
                  thread_id: str | None, schedule: str, message: str, name: str = "",
                  timezone: str | None = None, max_jobs: int = MAX_JOBS_PER_USER,
                  min_interval: int = MIN_INTERVAL_SECONDS) -> JobView:
        """Create a cron job for ``owner_id`` that runs ``message`` in this chat.

        Raises :class:`JobError` with a message for the user when the request
        is invalid or over a limit (``max_jobs`` per owner, a recurring job's
        ``min_interval`` in seconds).
        """
        now = self._now()
        request = check_request(message, name, schedule, timezone, default_tz=self.tz,
                                now=now, min_interval=min_interval)
        parsed = request.schedule
        limit = max_jobs
        for _ in range(5):
            job = Job(new_id(), "cron", request.name, parsed.text, request.tz.key,
                      request.message, owner_id, channel, chat_id, chat_type, thread_id,
                      _ts(now))
            try:
                inserted = await self.store.insert(job, max_per_owner=limit)
            except sqlite3.IntegrityError:
                continue  # the random ID is taken; draw another
            break
        else:
            raise JobError("could not find a free job ID; try again", "INTERNAL")
        if not inserted:
            raise JobError(f"you already have {limit} scheduled jobs, the most allowed; remove "
                           "one first", "LIMIT_REACHED")
        entry = Entry(job, parsed, parsed.first())
        self._jobs[job.id] = entry
        self.alarm.time(entry, self._now())
        log.info("job %s added by %s:%s: %s", job.label, channel, owner_id, parsed.text)
        return JobView(job, entry.next_fire)

    async def jobs(self, *, channel: str | None = None,
                   owner_id: str | None = None) -> list[JobView]:
        """Cron jobs (of ``owner_id`` on ``channel`` when given), oldest first."""
        found = await self.store.find(channel=channel, owner_id=owner_id, kind="cron")
        return [self._view(j) for j in found]

    async def all_jobs(self) -> list[JobView]:
        """Every job, system jobs included (the admin view)."""
        return [self._view(j) for j in await self.store.all()]

    def _view(self, job: Job) -> JobView:
        entry = self._jobs.get(job.id)
        return JobView(job, entry.next_fire if entry else None)

    async def approve(self, job_id: str, tools: Sequence[str]) -> Job:
        """Pre-approve ``tools`` for cron job ``job_id`` (an admin's call; replaces the
        earlier ones, none clears them); the job as it is now.

        Raises :class:`JobError` (``NOT_FOUND``, ``NOT_ALLOWED``).
        """
        job = await self.store.get(job_id.strip())
        if job is None:
            raise JobError(f"there is no job {job_id!r}", "NOT_FOUND")
        if job.kind == "system":
            raise JobError(f"{job_id} is a system job from a plugin", "NOT_ALLOWED")
        names = tuple(dict.fromkeys(t for t in tools if t))
        if not await self.store.set_approved(job.id, names):
            raise JobError(f"there is no job {job_id!r}", "NOT_FOUND")
        log.info("job %s: tools pre-approved: %s", job.label, ", ".join(names) or "none")
        return replace(job, approved_tools=names)

    async def remove(self, job_id: str, *, channel: str, owner_id: str,
                     admin: bool = False) -> Job:
        """Delete a cron job: the owner's own, or any when ``admin``; the deleted job.

        Raises :class:`JobError` (``NOT_FOUND``, ``NOT_ALLOWED``).
        """
        job_id = job_id.strip()
        job = await self.store.get(job_id) if job_id else None
        if job is not None and job.kind == "system":
            raise JobError(f"{job_id} is a system job from a plugin; disable the plugin to "
                           "stop it", "NOT_ALLOWED")
        mine = job is not None and job.channel == channel and job.owner_id == owner_id
        if job is None or not (mine or admin):
            # Someone else's job is reported as missing: its ID says nothing then.
            raise JobError(f"you have no job {job_id!r}; list your jobs to see their IDs",
                           "NOT_FOUND")
        deleted = await self.store.delete(job_id) if admin else await self.store.delete(
            job_id, channel=channel, owner_id=owner_id)
        if not deleted:
            raise JobError(f"you have no job {job_id!r}", "NOT_FOUND")
        self._jobs.pop(job_id, None)
        self.alarm.untime(job_id)
        log.info("job %s removed by %s:%s", job.label, channel, owner_id)
        return job
