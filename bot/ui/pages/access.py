"""``/ui/access``: pending pairing requests (approve, deny), paired users (revoke), the
allowlist and the admins. Approving does what ``/pair approve`` does: that user's next
DM is answered."""

from __future__ import annotations

from aiohttp import web

from bot.ui.kit import NavEntry, UiRequest, UiRoute
from bot.ui.opsweb import field, plain
from bot.ui.queries import access as queries
from bot.ui.queries.opsdb import BadCursor


async def access(req: UiRequest, *, error: str = "", status: int = 200) -> web.StreamResponse:
    """The access page; ``?before=`` pages the paired users."""
    try:
        page = await queries.access_page(req.app, before=req.web.query.get("before"))
    except BadCursor as exc:
        return plain(400, str(exc))
    except queries.AccessUnavailable as exc:
        return plain(503, str(exc))
    response = req.render("access.html", page=page, error=error,
                          paged="before" in req.web.query)
    response.set_status(status)
    return response


async def approve(req: UiRequest) -> web.StreamResponse:
    """Approve the pairing code in the form."""
    code = field(await req.form(), "code")
    if code is None:
        return await access(req, error="say which code to approve", status=400)
    request = await queries.approve(req.app, code, f"ui:{req.user.name}")
    if request is None:
        return await access(req, error=f"no pending request has the code {code} (wrong, "
                                       "expired or already used)", status=404)
    await req.audit("approve pairing", request.user, f"code {request.code}")
    return req.redirect("/ui/access")


async def deny(req: UiRequest) -> web.StreamResponse:
    """Refuse the pairing code in the form."""
    code = field(await req.form(), "code")
    if code is None or not await queries.deny(req.app, code, f"ui:{req.user.name}"):
        return await access(req, error="no pending request has that code", status=404)
    await req.audit("deny pairing", code)
    return req.redirect("/ui/access")


async def revoke(req: UiRequest) -> web.StreamResponse:
    """Forget the paired user in the form (``channel:user_id``)."""
    user = field(await req.form(), "user")
    if user is None or not await queries.revoke(req.app, user, f"ui:{req.user.name}"):
        return await access(req, error="no such paired user", status=404)
    await req.audit("revoke pairing", user)
    return req.redirect("/ui/access")


ROUTES = [
    UiRoute("GET", "/ui/access", access),
    UiRoute("POST", "/ui/access/approve", approve, role="operator"),
    UiRoute("POST", "/ui/access/deny", deny, role="operator"),
    UiRoute("POST", "/ui/access/revoke", revoke, role="operator"),
]
NAV = NavEntry(label="Access", path="/ui/access", order=50)
