"""``/ui/jobs``: cron jobs and system jobs (the heartbeat): next fire, last fires with
their outcome and cost; run now, pause, resume, delete."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from bot.storage.jobs import Job
from bot.ui.kit import NavEntry, UiRequest, UiRoute
from bot.ui.opsweb import field, plain
from bot.ui.queries import jobs as queries
from bot.ui.queries.opsdb import BadCursor


async def jobs(req: UiRequest, *, error: str = "", status: int = 200) -> web.StreamResponse:
    """Jobs, oldest first; ``?after=`` pages them."""
    try:
        page = await queries.jobs_page(req.app, after=req.web.query.get("after"),
                                       now=time.time())
    except BadCursor as exc:
        return plain(400, str(exc))
    except queries.SchedulerUnavailable as exc:
        return plain(503, str(exc))
    response = req.render("jobs.html", page=page, error=error, paged="after" in req.web.query)
    response.set_status(status)
    return response


def _action(what: str, act: Callable[[UiRequest, str], Awaitable[Job]]
            ) -> Callable[[UiRequest], Awaitable[web.StreamResponse]]:
    async def handler(req: UiRequest) -> web.StreamResponse:
        job_id = field(await req.form(), "id")
        if job_id is None:
            return await jobs(req, error="say which job", status=400)
        try:
            job = await act(req, job_id)
        except queries.JobError as exc:
            return await jobs(req, error=f"cannot {what} {job_id}: {exc}", status=409)
        except queries.SchedulerUnavailable as exc:
            return plain(503, str(exc))
        await req.audit(f"{what} job", job.id, job.name)
        return req.redirect("/ui/jobs")

    return handler


ROUTES = [
    UiRoute("GET", "/ui/jobs", jobs),
    UiRoute("POST", "/ui/jobs/run", _action(
        "run", lambda req, job_id: queries.run_now(req.app, job_id)), role="operator"),
    UiRoute("POST", "/ui/jobs/pause", _action(
        "pause", lambda req, job_id: queries.pause(req.app, job_id, True)), role="operator"),
    UiRoute("POST", "/ui/jobs/resume", _action(
        "resume", lambda req, job_id: queries.pause(req.app, job_id, False)), role="operator"),
    UiRoute("POST", "/ui/jobs/delete", _action(
        "delete", lambda req, job_id: queries.delete(req.app, job_id)), role="operator"),
]
NAV = NavEntry(label="Jobs", path="/ui/jobs", order=70)
