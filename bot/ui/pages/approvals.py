"""``/ui/approvals``: tool calls waiting for a person's decision, live, with Approve,
Deny and Approve for this session (admins); and every decision taken (who, what, the
arguments in full, the outcome, when), newest first.

A decision here is one of :meth:`bot.engine.approvals.Approvals.decide_as`: recorded
with the UI user as the decider, final like a press (a second one is answered, not
acted on), and the run waiting for it goes on, on whichever replica holds it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from aiohttp import web

from bot.engine.approvals import CHOICES, OUTCOMES, render_arguments
from bot.storage.approvals import Approval
from bot.ui.kit import NavEntry, UiRequest, UiRoute, changes, sse
from bot.ui.opsweb import field
from bot.ui.queries.reads import PAGE_SIZE, BadCursor, parse_time_cursor, time_cursor

REFRESH = 1.0
"""Seconds between two reads of the pending questions while someone watches the page."""
PENDING_SHOWN = 100
"""Pending questions listed (oldest first): more than this many open at once is a backlog."""


@dataclass(frozen=True, slots=True)
class Shown:
    """One approval as the page shows it."""

    row: Approval
    arguments: str
    """The call's arguments in full, as the chat's prompt showed them (secrets masked)."""
    outcome: str


def shown(row: Approval) -> Shown:
    """``row`` with its arguments rendered and its outcome in words."""
    try:
        arguments = render_arguments(json.loads(row.arguments))
    except (ValueError, TypeError):
        arguments = row.arguments
    return Shown(row, arguments, OUTCOMES.get(row.state, row.state))


async def _pending(req: UiRequest) -> list[Shown]:
    return [shown(r) for r in await req.app.approvals.store.pending(PENDING_SHOWN)]


async def approvals(req: UiRequest, *, error: str = "",
                    status: int = 200) -> web.StreamResponse:
    """The pending questions and a page of the decided ones; ``?before=`` pages those."""
    before = req.web.query.get("before")
    try:
        cursor = parse_time_cursor(before) if before else None
    except BadCursor as exc:
        return req.fail(400, str(exc))
    rows = await req.app.approvals.store.decided(cursor, PAGE_SIZE + 1)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    next_cursor = time_cursor(rows[-1].created_at, rows[-1].id) if more else None
    response = req.render("approvals.html", pending=await _pending(req),
                          history=[shown(r) for r in rows], next_cursor=next_cursor,
                          paged=before is not None, error=error)
    response.set_status(status)
    return response


def pending_events(req: UiRequest) -> AsyncIterator[tuple[str, str]]:
    """A ``pending`` event each time the rendered list of open questions changes."""
    async def render() -> str:
        return req.fragment("_approvals_pending.html", pending=await _pending(req))

    return changes("pending", render, REFRESH)


async def events(req: UiRequest) -> web.StreamResponse:
    """The live list of pending questions as Server-Sent Events."""
    return await sse(req, pending_events(req))


CHOICE_LABELS: Mapping[str, str] = {"a": "approve", "d": "deny", "s": "approve for the session"}


async def decide(req: UiRequest) -> web.StreamResponse:
    """Decide the approval in the form (``id``, ``choice`` a, d or s) as this UI user."""
    form = await req.form()
    ident, choice = field(form, "id"), field(form, "choice") or ""
    if ident is None or choice not in CHOICES:
        return await approvals(req, error="say which approval and approve, deny or session",
                               status=400)
    acted, note = await req.app.approvals.decide_as(ident, CHOICES[choice], req.user.name)
    if not acted:
        return await approvals(req, error=f"{ident}: {note}", status=409)
    await req.audit(f"{CHOICE_LABELS[choice]} tool call", ident)
    return req.redirect("/ui/approvals")


ROUTES = [
    UiRoute("GET", "/ui/approvals", approvals),
    UiRoute("GET", "/ui/approvals/events", events),
    UiRoute("POST", "/ui/approvals/decide", decide, role="admin"),
]
NAV = NavEntry(label="Approvals", path="/ui/approvals", order=75)
