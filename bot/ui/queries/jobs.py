"""The jobs page: cron jobs and plugins' system jobs (the heartbeat), when each fires
next, its last fires with their outcome and cost; and run now, pause, resume, delete.

The actions call the scheduler (:class:`bot.scheduling.scheduler.Scheduler`), as the
``cron`` tool and ``/cron`` do; pausing is stored with the job, so no replica claims
its fire times while it is paused. A fire's cost is its run's tokens priced by the
price table of the run's agent (:class:`bot.config.budgets.ModelPrice`, as the cost
budgets price them); a job's spend today is its usage counter (``cron:<id>``,
``heartbeat``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from bot.config.settings import Settings
from bot.contracts.llm import agent_of
from bot.scheduling.requests import JobError
from bot.scheduling.scheduler import Scheduler
from bot.storage.jobs import Job
from bot.storage.usage import day_of
from bot.ui.queries.opsdb import make_pair_cursor, pair_cursor, rows
from bot.ui.queries.usage import Totals

if TYPE_CHECKING:
    from bot.app.roost import Roost

RUNS_SHOWN = 5
"""Last fires shown per job."""
JOBS_PER_PAGE = 25
"""Jobs per page (each with its last fires)."""


class SchedulerUnavailable(RuntimeError):
    """The app runs without a scheduler."""


@dataclass(frozen=True, slots=True)
class FireRow:
    """One recorded fire of a job and its run (tokens and cost when the run's trace is
    still kept; ``cost`` ``None`` when its model has no price)."""

    fired_at: float
    ended_at: float
    run_id: str | None
    status: str
    error: str
    manual: bool
    model: str
    tokens: int
    cost: float | None


@dataclass(frozen=True, slots=True)
class JobRow:
    """A job, when it fires next here (``None``: not scheduled in this process), its
    last fires (newest first) and its spend today."""

    job: Job
    next_fire: datetime | None
    fires: list[FireRow]
    today: Totals

    @property
    def usage_subject(self) -> str:
        """The job's usage counter: ``cron:<id>``, or a system job's name (``heartbeat``)."""
        return usage_subject(self.job)


@dataclass(frozen=True, slots=True)
class JobsPage:
    """A page of jobs, oldest first, and the cursor of the next."""

    rows: list[JobRow]
    next_cursor: str | None


def usage_subject(job: Job) -> str:
    """The ``job`` usage counter a job's runs add to."""
    return f"cron:{job.id}" if job.kind == "cron" else job.name


def scheduler_of(app: Roost) -> Scheduler:
    """The app's scheduler; :class:`SchedulerUnavailable` without one."""
    scheduler = app.services.scheduler
    if not isinstance(scheduler, Scheduler):
        raise SchedulerUnavailable("the scheduler is not running")
    return scheduler


async def jobs_page(app: Roost, *, after: str | None = None, now: float,
                    limit: int = JOBS_PER_PAGE) -> JobsPage:
    """Jobs created after cursor ``after``, oldest first, with their last fires."""
    scheduler = scheduler_of(app)
    found = await scheduler.store.page(pair_cursor(after), limit + 1)
    jobs = found[:limit]
    fires = await _fires(app, [j.id for j in jobs])
    today = await _today(app, [usage_subject(j) for j in jobs], day_of(now))
    page = [JobRow(j, scheduler.view(j).next_fire, fires.get(j.id, []),
                   today.get(usage_subject(j), Totals(usage_subject(j)))) for j in jobs]
    more = len(found) > limit
    return JobsPage(page, make_pair_cursor(jobs[-1].created_at, jobs[-1].id) if more else None)


async def _fires(app: Roost, job_ids: list[str]) -> dict[str, list[FireRow]]:
    if not job_ids:
        return {}
    marks = ", ".join("?" * len(job_ids))
    found = await rows(
        app.store,
        "SELECT f.job_id, f.fired_at, f.ended_at, f.run_id, f.status, f.error, f.manual,"
        " r.model, r.input_tokens, r.output_tokens, r.cache_read_tokens,"
        " r.cache_write_tokens, r.session_key FROM (SELECT job_id, fired_at, ended_at,"
        " run_id, status, error, manual, ROW_NUMBER() OVER (PARTITION BY job_id"
        f" ORDER BY id DESC) AS n, id FROM job_runs WHERE job_id IN ({marks})) f"
        " LEFT JOIN runs r ON r.id = f.run_id WHERE f.n <= ? ORDER BY f.job_id, f.id DESC",
        (*job_ids, RUNS_SHOWN))
    out: dict[str, list[FireRow]] = {}
    for r in found:
        model = str(r[7] or "")
        counts = (int(r[8] or 0), int(r[9] or 0), int(r[10] or 0), int(r[11] or 0))
        out.setdefault(str(r[0]), []).append(FireRow(
            float(r[1]), float(r[2]), None if r[3] is None else str(r[3]), str(r[4]),
            str(r[5]), bool(r[6]), model, counts[0] + counts[1],
            run_cost(app.settings, str(r[12] or ""), model, *counts) if model else None))
    return out


def run_cost(settings: Settings, session_key: str, model: str, input_tokens: int,
             output_tokens: int, cache_read_tokens: int, cache_write_tokens: int) -> float | None:
    """What a run cost by its agent's price table; ``None`` when its model has no price."""
    price = settings.budgets_for(agent_of(session_key)).prices.get(model)
    if price is None:
        return None
    return price.cost(input_tokens, output_tokens, cache_read_tokens, cache_write_tokens)


async def _today(app: Roost, subjects: list[str], day: str) -> dict[str, Totals]:
    if not subjects:
        return {}
    marks = ", ".join("?" * len(subjects))
    found = await rows(
        app.store,
        "SELECT subject, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,"
        f" cost, runs FROM usage WHERE scope = 'job' AND period = ? AND subject IN ({marks})",
        (day, *subjects))
    return {str(r[0]): Totals(str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]),
                              float(r[5]), int(r[6])) for r in found}


async def run_now(app: Roost, job_id: str) -> Job:
    """Start a run of the job now; raises :class:`JobError` (no such job, ...)."""
    return await scheduler_of(app).run_now(job_id)


async def pause(app: Roost, job_id: str, paused: bool) -> Job:
    """Pause or resume the job; raises :class:`JobError` when there is none."""
    return await scheduler_of(app).pause(job_id, paused)


async def delete(app: Roost, job_id: str) -> Job:
    """Delete a cron job (as an admin's ``/cron remove``); raises :class:`JobError`."""
    return await scheduler_of(app).remove(job_id, channel="", owner_id="", admin=True)


__all__ = ["FireRow", "JobError", "JobRow", "JobsPage", "SchedulerUnavailable", "delete",
           "jobs_page", "pause", "run_cost", "run_now", "usage_subject"]
