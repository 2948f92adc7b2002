"""``/ui/`` Overview: readiness, replicas, queues, breakers, runs, errors and spend, live."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from bot.ui.kit import NavEntry, UiRequest, UiRoute, changes, sse
from bot.ui.queries.overview import read_overview

REFRESH = 2.0
"""Seconds between two reads of the facts while someone watches the page."""


async def overview(req: UiRequest) -> web.StreamResponse:
    """The page, with the facts as of now; the SSE stream keeps them current."""
    return req.render("overview.html", facts=await read_overview(req.app))


def facts(req: UiRequest) -> AsyncIterator[tuple[str, str]]:
    """A ``facts`` event each time the rendered facts change."""
    async def render() -> str:
        return req.fragment("_overview_facts.html", facts=await read_overview(req.app))

    return changes("facts", render, REFRESH)


async def events(req: UiRequest) -> web.StreamResponse:
    """The live facts as Server-Sent Events."""
    return await sse(req, facts(req))


ROUTES = [
    UiRoute("GET", "/ui/", overview),
    UiRoute("GET", "/ui/overview/events", events),
]
NAV = NavEntry(label="Overview", path="/ui/", order=10)
