"""``/ui/logs``: a live tail of this process's own log, filtered by level and logger.

The lines come from the HTTP server's in-memory ring (:class:`bot.observability.logring.LogRing`),
masked by the one masking function of the log files; the page shows the last
:data:`SHOWN` that pass the filter and the SSE stream appends new ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlencode

from aiohttp import web

from bot.observability.logring import LogLine
from bot.ui.kit import NavEntry, UiRequest, UiRoute, sse

SHOWN = 200
"""Lines the page opens with."""
POLL = 0.5
"""Seconds between two looks at the ring while someone watches."""
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _filters(req: UiRequest) -> tuple[str, str]:
    level = req.web.query.get("level", "").upper()
    logger = req.web.query.get("logger", "").strip()[:200]
    return (level if level in LEVELS else "DEBUG"), logger


def _matching(lines: list[LogLine], level: str, logger: str) -> list[LogLine]:
    floor = logging.getLevelName(level)
    return [line for line in lines if line.levelno >= floor
            and (not logger or line.logger == logger or line.logger.startswith(f"{logger}."))]


def _ring_lines(req: UiRequest, seq: int) -> tuple[list[LogLine], int]:
    server = req.app.http
    if server is None:
        return [], seq
    return server.logs.since(seq), server.logs.seq


async def logs(req: UiRequest) -> web.StreamResponse:
    """The page: the last lines that pass the filter, then live."""
    level, logger = _filters(req)
    lines, seq = _ring_lines(req, 0)
    stream = "/ui/logs/events?" + urlencode({"level": level, "logger": logger, "after": seq})
    return req.render("logs.html", lines=_matching(lines, level, logger)[-SHOWN:],
                      level=level, logger=logger, levels=LEVELS, stream=stream)


async def tail(req: UiRequest, level: str, logger: str, seq: int) -> AsyncIterator[tuple[str, str]]:
    """A ``log`` event for each batch of new lines that pass the filter."""
    while True:
        lines, last = _ring_lines(req, seq)
        seq = last
        shown = _matching(lines, level, logger)
        if shown:
            yield "log", req.fragment("_logs_lines.html", lines=shown)
        await asyncio.sleep(POLL)


async def events(req: UiRequest) -> web.StreamResponse:
    """New lines as Server-Sent Events, after the sequence number the page showed."""
    level, logger = _filters(req)
    try:
        after = max(0, int(req.web.query.get("after", "0")))
    except ValueError:
        after = 0
    return await sse(req, tail(req, level, logger, after))


ROUTES = [
    UiRoute("GET", "/ui/logs", logs),
    UiRoute("GET", "/ui/logs/events", events),
]
NAV = NavEntry(label="Logs", path="/ui/logs", order=100)
