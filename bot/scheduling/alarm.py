"""APScheduler as the scheduler's alarm clock: it wakes Roost at fire times, nothing more.

Every job is an APScheduler job with the job's own trigger, run by an
``AsyncIOScheduler`` on the service's loop. What runs at a wakeup is decided by
:meth:`bot.scheduling.scheduler.Scheduler.run_due`; the alarm only says which jobs
woke it, gathering those due at the same second into one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.jobstores.base import JobLookupError  # type: ignore[import-untyped]
from apscheduler.schedulers.asyncio import AsyncIOScheduler  # type: ignore[import-untyped]

from bot.scheduling.due import Entry

log = logging.getLogger("roost.scheduling.alarm")

Wake = Callable[[Collection[str]], Awaitable[object]]
"""``(job ids) -> ...``: runs what is due among the jobs that woke the alarm."""


class Alarm:
    """APScheduler's jobs for the scheduler's entries; ``wake(ids)`` when some are due.

    ``spawn`` runs the wakeup as one of the scheduler's tasks (it waits for them on close).
    """

    def __init__(self, tz: ZoneInfo, wake: Wake,
                 spawn: Callable[[Awaitable[None]], None]) -> None:
        self.tz = tz
        self._wake_up = wake
        self._spawn = spawn
        self.aps: Any = None
        """The ``AsyncIOScheduler`` while the alarm is set."""
        self._woken: set[str] = set()
        self._waking = False

    def start(self, entries: Iterable[Entry], now: datetime) -> None:
        """Time ``entries`` and start APScheduler."""
        # APScheduler logs every job added and every run at INFO: thousands of lines
        # for what Roost logs itself. Quiet it unless someone configured it.
        aps_log = logging.getLogger("apscheduler")
        if aps_log.level == logging.NOTSET:
            aps_log.setLevel(logging.WARNING)
        self.aps = AsyncIOScheduler(timezone=self.tz, job_defaults={
            # run_due decides about lateness and coalescing; APScheduler must just call.
            "misfire_grace_time": None, "coalesce": True, "max_instances": 3})
        # Added before start: APScheduler then sorts them once instead of waking per job.
        for entry in entries:
            self.time(entry, now)
        self.aps.start()

    def time(self, entry: Entry, now: datetime) -> None:
        """(Re)set ``entry``'s job; nothing while the alarm is off or the job is over."""
        if self.aps is None or entry.next_fire is None:
            return
        options: dict[str, Any] = {}
        if entry.next_fire > now:
            # The trigger's first fire time from now, already known: handing it over
            # saves APScheduler computing it again (most of its cost per job).
            options["next_run_time"] = entry.next_fire
        self.aps.add_job(self._on_timer, trigger=entry.schedule.trigger, args=(entry.job.id,),
                         id=entry.job.id, name=entry.job.name or entry.job.id,
                         replace_existing=True, **options)

    def untime(self, job_id: str) -> None:
        """Remove job ``job_id`` from the alarm (if it is there)."""
        if self.aps is not None:
            with contextlib.suppress(JobLookupError):
                self.aps.remove_job(job_id)

    async def stop(self) -> None:
        """Shut APScheduler down; nothing wakes the scheduler after this."""
        aps, self.aps = self.aps, None
        if aps is not None and aps.running:
            # Pause first and let the calls APScheduler already started finish (they
            # return at once now): its shutdown cancels unfinished ones and logs each
            # as a failed job.
            aps.pause()
            for _ in range(3):
                await asyncio.sleep(0)
            aps.shutdown(wait=False)
            await asyncio.sleep(0)  # the shutdown itself runs as a loop callback

    async def _on_timer(self, job_id: str) -> None:
        """What APScheduler calls at a fire time: queue the job for one batched look.

        APScheduler starts one call per due job; jobs due at the same second
        (everyone's ``0 9 * * *``) are gathered and claimed by one statement.
        """
        self._woken.add(job_id)
        if not self._waking:
            self._waking = True
            self._spawn(self._wake())

    async def _wake(self) -> None:
        # One loop turn: the calls APScheduler started in the same wakeup get queued.
        await asyncio.sleep(0)
        ids, self._woken, self._waking = self._woken, set(), False
        try:
            await self._wake_up(ids)
        except Exception:
            log.exception("scheduler: checking %d due job(s) failed", len(ids))
