"""``/ui/usage``: tokens and cost per day (charts), the biggest spenders by user, group,
agent, model and scheduled job, the prompt cache's hit ratio, and the budget gauges
(who is near or over a ``[budgets]`` limit today and this month)."""

from __future__ import annotations

import time

from aiohttp import web

from bot.ui.kit import NavEntry, UiRequest, UiRoute
from bot.ui.opsweb import number, svg_bars
from bot.ui.queries.usage import MAX_DAYS, SCOPES, usage_report

RANGES = (1, 7, 30, 90, 365)
"""The day ranges offered (any 1..366 is accepted in ``?days=``)."""
TABLE_DAYS = 31
"""Ranges up to this many days also list their days in a table (longer: the chart's
bars carry each day's figure in their title)."""
SCOPE_TITLES = {"user": "Users", "group": "Groups", "agent": "Agents", "model": "Models",
                "job": "Scheduled jobs"}


async def usage(req: UiRequest) -> web.StreamResponse:
    """The usage page for ``?days=`` (30 by default) ending today, UTC."""
    days = number(req.web.query.get("days")) or 30
    days = min(days, MAX_DAYS)
    report = await usage_report(req.app.store, req.app.settings, days=days, now=time.time())
    return req.render(
        "usage.html", report=report, days=days, ranges=RANGES,
        scopes=[(scope, SCOPE_TITLES[scope]) for scope in SCOPES],
        token_bars=svg_bars([(f"{d.key}: {d.tokens:,} tokens", float(d.tokens))
                             for d in report.days]),
        cost_bars=svg_bars([(f"{d.key}: {d.cost:.4f}", d.cost) for d in report.days]),
        day_table=days <= TABLE_DAYS)


ROUTES = [UiRoute("GET", "/ui/usage", usage)]
NAV = NavEntry(label="Usage", path="/ui/usage", order=40)
