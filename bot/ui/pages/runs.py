"""``/ui/runs/<run_id>``: one run's trace as a waterfall (model calls with their tokens
and cache reads, tool calls with durations and outcomes, the reply's delivery), and
its error if it failed."""

from __future__ import annotations

from aiohttp import web

from bot.ui.kit import UiRequest, UiRoute
from bot.ui.queries.runs import run_trace


async def run(req: UiRequest) -> web.StreamResponse:
    """The run page; 404 while the run has no stored trace (running, or pruned)."""
    run_id = req.web.match_info["run_id"]
    trace = await run_trace(req.app.store, run_id)
    if trace is None:
        return web.Response(status=404, text=f"no trace of run {run_id}: it is still running, "
                                             "or its trace was pruned\n")
    return req.render("runs.html", trace=trace)


ROUTES = [UiRoute("GET", "/ui/runs/{run_id:[A-Za-z0-9_.:-]{1,100}}", run)]
NAV = None
