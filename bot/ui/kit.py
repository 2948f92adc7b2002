"""The page API of the Control UI: what a module in :mod:`bot.ui.pages` works with.

A page module defines ``ROUTES: list[UiRoute]`` and ``NAV: NavEntry | None``.
Before a handler runs, the framework (:mod:`bot.ui.server`) has checked the login,
the route's role and, on every POST, the CSRF token; the handler gets a
:class:`UiRequest` and answers with :meth:`UiRequest.render`,
:meth:`UiRequest.redirect` or :func:`sse`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from aiohttp import web

if TYPE_CHECKING:
    from bot.app.roost import Roost

__all__ = ["ROLE_RANK", "NavEntry", "Role", "Site", "UiRequest", "UiRoute", "UiUser",
           "changes", "plain", "secure_headers", "sse", "ui_path"]

log = logging.getLogger("roost.app.ui")

Role = Literal["viewer", "operator", "admin"]
"""Who may do what: admin > operator > viewer."""

ROLE_RANK: Mapping[str, int] = {"viewer": 0, "operator": 1, "admin": 2}

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
"""No inline script or style, nothing from another origin, never framed."""

SSE_KEEPALIVE = 15.0
"""Seconds of silence after which an SSE stream sends a comment (finds a client gone)."""
SSE_RECHECK = 5.0
"""Seconds between two checks that an SSE stream's login still stands (logout, an
account removed or its role changed, on any replica, end the stream)."""


def secure_headers(response: web.StreamResponse, *, cache: bool = False) -> None:
    """Put the UI's security headers on ``response`` (before it is prepared).

    ``cache``: a static file, cached for a day; every other answer is ``no-store``.
    """
    headers = response.headers
    headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    headers["X-Frame-Options"] = "DENY"
    headers["X-Content-Type-Options"] = "nosniff"
    headers["Referrer-Policy"] = "no-referrer"
    headers["Cross-Origin-Opener-Policy"] = "same-origin"
    headers["Cache-Control"] = "public, max-age=86400" if cache else "no-store"


def plain(status: int, line: str) -> web.Response:
    """A one-line text answer with the security headers (no page: a refusal before the
    user is known, a live stream's or an image's error)."""
    response = web.Response(status=status, text=f"{line}\n")
    secure_headers(response)
    return response


ERROR_TITLES: Mapping[int, str] = {400: "Bad request", 403: "Not allowed", 404: "Not found",
                                   409: "Conflict", 503: "Unavailable"}
"""The heading of :meth:`UiRequest.fail`'s page by status."""

_UI_PATH = re.compile(r"/ui(?:[/?][\x21-\x7e]*)?")


def ui_path(path: str) -> str:
    """``path`` if it is a page of this UI (``/ui``, ``/ui/...``, printable, no ``..`` or
    backslash), else ``/ui/``: a redirect never leaves the UI, whatever built it."""
    where = path.partition("?")[0]
    if not _UI_PATH.fullmatch(path) or "\\" in path or ".." in where.split("/"):
        return "/ui/"
    return path


@dataclass(frozen=True, slots=True)
class UiUser:
    """Who is using the UI: an account's name and role (``local``, admin, without accounts)."""

    name: str
    role: Role


@dataclass(frozen=True)
class UiRoute:
    """One page or action: method, aiohttp path, handler and the least role allowed."""

    method: str
    path: str
    handler: Callable[[UiRequest], Awaitable[web.StreamResponse]]
    role: Role = "viewer"


@dataclass(frozen=True)
class NavEntry:
    """A page's entry in the navigation, sorted by ``order``."""

    label: str
    path: str
    order: int


class Site(Protocol):
    """What a :class:`UiRequest` needs of the UI it belongs to (:class:`bot.ui.server.UiServer`)."""

    def render(self, req: UiRequest, template: str, context: dict[str, object]) -> str:
        """The HTML of ``template`` with ``context`` and the layout's own values."""

    async def audit(self, user: UiUser, action: str, target: str, detail: str) -> None:
        """Write one audit log row."""

    async def still_allowed(self, req: UiRequest) -> bool:
        """Whether ``req``'s login still stands, for the same user with the same role."""


class UiRequest:
    """One request to a page, its user already checked."""

    def __init__(self, request: web.Request, app: Roost, user: UiUser, csrf: str,
                 site: Site) -> None:
        self.web = request
        """The aiohttp request (``match_info``, ``query``, ``post()``)."""
        self.app = app
        """The running app: settings, store, dispatcher, ..."""
        self.user = user
        self.csrf = csrf
        """This login's CSRF token, for forms (field ``csrf``)."""
        self.site = site

    def can(self, role: Role) -> bool:
        """Whether the user holds ``role`` or a higher one."""
        return ROLE_RANK[self.user.role] >= ROLE_RANK[role]

    def render(self, template: str, /, **context: object) -> web.Response:
        """``template`` as an HTML page; the layout adds user, csrf, nav and banner."""
        return web.Response(text=self.site.render(self, template, context),
                            content_type="text/html", charset="utf-8")

    def fail(self, status: int, line: str, *, back: str | None = None) -> web.Response:
        """An error page in the layout (nav and all): ``line`` says what is wrong (a bad
        cursor, an unknown id) and a link leads ``back``: by default to the page family's
        list (``/ui/sessions`` from ``/ui/sessions/12``), or the overview after a 403."""
        if back is None:
            back = "/ui/" if status == 403 else "/".join(self.web.path.split("/")[:3])
        response = self.render("error.html", title=ERROR_TITLES.get(status, "Error"),
                               line=line, back=ui_path(back))
        response.set_status(status)
        return response

    def fragment(self, template: str, /, **context: object) -> str:
        """``template`` (a partial, ``_name.html``) rendered to a string: an SSE event's HTML."""
        return self.site.render(self, template, context)

    async def form(self) -> dict[str, str]:
        """The POSTed form fields (files left out); the CSRF token was checked already."""
        data = await self.web.post()
        return {key: value for key, value in data.items() if isinstance(value, str)}

    async def audit(self, action: str, target: str, detail: str = "") -> None:
        """Record in the audit log that this user did ``action`` to ``target``."""
        await self.site.audit(self.user, action, target, detail)

    def redirect(self, path: str) -> web.Response:
        """``303 See Other`` to ``path`` (POST, redirect, GET); see :func:`ui_path`."""
        return web.Response(status=303, headers={"Location": ui_path(path)})


async def changes(event: str, render: Callable[[], Awaitable[str]],
                  every: float) -> AsyncIterator[tuple[str, str]]:
    """A feed for :func:`sse`: ``(event, html)`` at once and each time ``render()``
    gives another fragment than the last one, read every ``every`` seconds."""
    last = ""
    while True:
        html = await render()
        if html != last:
            last = html
            yield event, html
        await asyncio.sleep(every)


async def sse(req: UiRequest, events: AsyncIterator[tuple[str, str]]) -> web.StreamResponse:
    """Stream ``events`` as Server-Sent Events: each (name, HTML fragment) is one event.

    Ends when the client goes, ``events`` ends or fails (logged; the browser
    reconnects), the server begins to shut down, or the login ends (checked every
    :data:`SSE_RECHECK` seconds). A comment goes out after :data:`SSE_KEEPALIVE`
    seconds of silence so a client gone is noticed.
    """
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Accel-Buffering": "no"})
    secure_headers(response)
    await response.prepare(req.web)
    server = req.app.http
    closing: asyncio.Future[Any] = asyncio.ensure_future(
        server.wait_closing() if server is not None else asyncio.Event().wait())
    pending: asyncio.Future[Any] | None = None
    clock = asyncio.get_running_loop().time
    checked = wrote = clock()
    try:
        while not closing.done():
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending, closing},
                                         timeout=min(SSE_KEEPALIVE, SSE_RECHECK),
                                         return_when=asyncio.FIRST_COMPLETED)
            if clock() - checked >= SSE_RECHECK:
                checked = clock()
                if not await req.site.still_allowed(req):
                    break
            if pending not in done:
                if not closing.done() and clock() - wrote >= SSE_KEEPALIVE:
                    await response.write(b": keepalive\n\n")
                    wrote = clock()
                continue
            try:
                name, fragment = pending.result()
            except StopAsyncIteration:
                break
            except Exception:
                log.exception("the live view %s failed", req.web.path)
                break
            finally:
                pending = None
            lines = "".join(f"data: {line}\n" for line in fragment.splitlines() or [""])
            await response.write(f"event: {name}\n{lines}\n".encode())
            wrote = clock()
    except ConnectionError:
        pass  # the client went
    finally:
        for future in (pending, closing):
            if future is not None and not future.done():
                future.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await future
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
    return response
