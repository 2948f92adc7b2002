"""``/ui/errors``: the error store, filtered by tool, error kind, user and session,
newest first; ``/ui/errors/<error_id>``: one error in full, as ``roost errors show``
prints it (an error ID a chat showed opens here)."""

from __future__ import annotations

from aiohttp import web

from bot.ui.kit import NavEntry, UiRequest, UiRoute
from bot.ui.queries import errors as eq
from bot.ui.queries.reads import BadCursor


async def errors(req: UiRequest) -> web.StreamResponse:
    """The list with its filters."""
    q = req.web.query
    f = eq.ErrorFilter(tool=q.get("tool", "").strip(), kind=q.get("kind", "").strip(),
                       user=q.get("user", "").strip(), session=q.get("session", "").strip())
    try:
        page = await eq.list_errors(req.app.store, f, q.get("before") or None)
    except BadCursor as exc:
        return web.Response(status=400, text=f"{exc}\n")
    more = {"tool": f.tool, "kind": f.kind, "user": f.user, "session": f.session}
    return req.render("errors.html", filter=f, page=page, tools=await eq.tool_names(
        req.app.store), kinds=eq.KINDS, query={k: v for k, v in more.items() if v})


async def error(req: UiRequest) -> web.StreamResponse:
    """One error in full; 404 for an ID the store does not hold."""
    error_id = req.web.match_info["error_id"]
    found = await eq.error_detail(req.app.store, error_id)
    if found is None:
        return web.Response(status=404, text=f"no error {error_id}\n")
    return req.render("errors_detail.html", e=found)


ROUTES = [
    UiRoute("GET", "/ui/errors", errors),
    UiRoute("GET", "/ui/errors/{error_id:[A-Za-z0-9_]{1,64}}", error),
]
NAV = NavEntry(label="Errors", path="/ui/errors", order=30)
