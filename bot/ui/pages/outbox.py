"""``/ui/outbox``: replies not delivered yet or given up, with their attempts and last
error; retry one now (on any replica) or drop it."""

from __future__ import annotations

from aiohttp import web

from bot.ui.kit import NavEntry, UiRequest, UiRoute
from bot.ui.opsweb import field, number, plain
from bot.ui.queries import outbox as queries
from bot.ui.queries.opsdb import BadCursor


async def outbox(req: UiRequest, *, error: str = "", status: int = 200) -> web.StreamResponse:
    """Open replies, newest first; ``?before=`` pages them."""
    try:
        page = await queries.outbox_page(req.app, before=req.web.query.get("before"))
    except BadCursor as exc:
        return plain(400, str(exc))
    response = req.render("outbox.html", page=page, error=error,
                          paged="before" in req.web.query)
    response.set_status(status)
    return response


async def retry(req: UiRequest) -> web.StreamResponse:
    """Send the reply in the form again now."""
    outbox_id = number(field(await req.form(), "id"))
    if outbox_id is None or await queries.retry(req.app, outbox_id) is None:
        return await outbox(req, error="that reply was delivered, dropped or is being sent",
                            status=409)
    await req.audit("retry reply", str(outbox_id))
    return req.redirect("/ui/outbox")


async def drop(req: UiRequest) -> web.StreamResponse:
    """Delete the reply in the form (it is never sent)."""
    outbox_id = number(field(await req.form(), "id"))
    if outbox_id is None or not await queries.drop(req.app, outbox_id):
        return await outbox(req, error="that reply was delivered, dropped or is being sent",
                            status=409)
    await req.audit("drop reply", str(outbox_id))
    return req.redirect("/ui/outbox")


ROUTES = [
    UiRoute("GET", "/ui/outbox", outbox),
    UiRoute("POST", "/ui/outbox/retry", retry, role="operator"),
    UiRoute("POST", "/ui/outbox/drop", drop, role="operator"),
]
NAV = NavEntry(label="Outbox", path="/ui/outbox", order=60)
