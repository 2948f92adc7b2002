"""The Control UI: its pages, found in :mod:`bot.ui.pages`, behind login, roles and CSRF.

Built on the first request to ``/ui`` (:mod:`bot.app.ui_mount`); nothing here is
imported before. :meth:`UiServer.resolve` answers the HTTP server's router for
every ``/ui`` path. Every handler is wrapped so that, before it runs, the user is
known (else a redirect to the login form, or 401 for htmx and SSE requests), holds
the route's role (else 403) and, on a POST, sent the login's CSRF token (form field
``csrf`` or header ``X-CSRF-Token``; else 403). Every answer carries the security
headers of :func:`bot.ui.kit.secure_headers`.
"""

from __future__ import annotations

import html
import importlib
import logging
import pkgutil
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
from aiohttp import web
from markupsafe import Markup

from bot.storage.ui_accounts import UiAccountStore
from bot.ui import pages
from bot.ui.accounts import new_token, same_token
from bot.ui.auth import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SESSION_TTL,
    Auth,
    LoginFailed,
    Refused,
    Visitor,
)
from bot.ui.kit import ROLE_RANK, NavEntry, UiRequest, UiRoute, UiUser, plain, secure_headers

if TYPE_CHECKING:
    from aiohttp.web_urldispatcher import UrlMappingMatchInfo

    from bot.app.roost import Roost

log = logging.getLogger("roost.app.ui")

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
_STATIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".txt": "text/plain",
                 ".svg": "image/svg+xml", ".png": "image/png"}

LOCAL_BANNER = ("No UI account exists: anyone on this machine can act here. Add one with "
                "`roost ui user add NAME --role admin` to require a login.")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- template filters ----------------------------------------------------------------

def format_time(value: object) -> Markup:
    """``<time datetime="…Z">YYYY-MM-DD HH:MM:SS UTC</time>``; ui.js shows it in local time."""
    if value is None or value == "":
        return Markup("&mdash;")
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
    else:
        try:
            moment = datetime.fromtimestamp(float(str(value)), UTC)
        except (ValueError, OverflowError, OSError):
            return Markup(html.escape(str(value)))
    moment = moment.astimezone(UTC)
    iso = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    return Markup(f'<time datetime="{iso}">{moment:%Y-%m-%d %H:%M:%S} UTC</time>')


def format_count(value: object) -> str:
    """An integer with thousands separators (``12,345``)."""
    try:
        return f"{int(float(str(value))):,}"
    except (TypeError, ValueError, OverflowError):
        return str(value)


def format_cost(value: object) -> str:
    """Dollars: two decimals from $1, four below (``$0.0031``)."""
    try:
        amount = float(str(value))
    except (TypeError, ValueError):
        return str(value)
    return f"${amount:,.2f}" if abs(amount) >= 1 else f"${amount:.4f}"


def truncate_chars(value: object, limit: int = 200) -> str:
    """At most ``limit`` characters, an ellipsis marking a cut."""
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def environment() -> jinja2.Environment:
    """The templates' Jinja2 environment: autoescape on for every template."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["time"] = format_time
    env.filters["count"] = format_count
    env.filters["cost"] = format_cost
    env.filters["truncate_chars"] = truncate_chars
    return env


# -- answers without a page ------------------------------------------------------------


def wants_fragment(request: web.Request) -> bool:
    """htmx and SSE requests get status codes, not redirects to the login form."""
    return ("HX-Request" in request.headers
            or "text/event-stream" in request.headers.get("Accept", ""))


class UiServer:
    """The UI of one app: routes discovered in :mod:`bot.ui.pages`, checked and rendered."""

    def __init__(self, app: Roost, *, clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.accounts = UiAccountStore(app.store.db, app.store.lock, app.store.writer)
        self.auth = Auth(self.accounts, bind_host=app.settings.http_host,
                         trusted_proxies=app.settings.ui_trusted_proxies, clock=clock)
        self.clock = clock
        self.env = environment()
        self.nav: list[NavEntry] = []
        self.routes: list[UiRoute] = []
        """Every guarded route served (the pages' and the logout), with its least role."""
        self._roles: dict[str, str] = {}
        self.router = web.UrlDispatcher()
        self._fallback = web.UrlDispatcher()
        self._static: dict[str, tuple[bytes, str]] = {}
        self._mount()

    # -- routing -----------------------------------------------------------------------

    def _mount(self) -> None:
        router = self.router
        router.add_get("/ui", self._to_root)
        router.add_get("/ui/static/{name}", self._file)
        router.add_get("/ui/login", self._login_form)
        router.add_post("/ui/login", self._login)
        self._add(UiRoute("POST", "/ui/logout", self._logout))
        for info in sorted(pkgutil.iter_modules(pages.__path__), key=lambda m: m.name):
            try:
                module = importlib.import_module(f"{pages.__name__}.{info.name}")
            except Exception:
                # One broken page must not take the others down with it.
                log.exception("the UI page module %s cannot be loaded; its pages are off",
                              info.name)
                continue
            for route in getattr(module, "ROUTES", []):
                self._add(route)
            entry = getattr(module, "NAV", None)
            if entry is not None:
                self.nav.append(entry)
        self.nav.sort(key=lambda e: (e.order, e.label))
        self._fallback.add_route("*", "/{tail:.*}", self._not_found)

    def _add(self, route: UiRoute) -> None:
        self.router.add_route(route.method, route.path, self._guard(route))
        self.routes.append(route)
        if route.method == "GET":
            self._roles[route.path] = route.role

    async def resolve(self, request: web.Request) -> UrlMappingMatchInfo:
        """The match (handler and path variables) of a ``/ui`` request; unknown paths: 404."""
        match = await self.router.resolve(request)
        if match.http_exception is not None:
            status = match.http_exception.status
            return await self._fallback.resolve(request) if status == 404 else \
                await self._method_fallback(request, status)
        return match

    async def _method_fallback(self, request: web.Request, status: int) -> UrlMappingMatchInfo:
        fallback = web.UrlDispatcher()

        async def refuse(_request: web.Request) -> web.StreamResponse:
            return plain(status, "method not allowed" if status == 405 else "refused")

        fallback.add_route("*", "/{tail:.*}", refuse)
        return await fallback.resolve(request)

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        """404: a page in the layout for a known user's GET, else one line."""
        if request.method == "GET" and not wants_fragment(request):
            try:
                visitor = await self.auth.visitor(request)
            except Refused as refused:
                return plain(refused.status, refused.line)
            if visitor is not None:
                req = UiRequest(request, self.app, visitor.user, visitor.csrf, self)
                return req.fail(404, "no such page", back="/ui/")
        return plain(404, "no such page")

    async def _to_root(self, _request: web.Request) -> web.StreamResponse:
        response = web.Response(status=308, headers={"Location": "/ui/"})
        secure_headers(response)
        return response

    async def _file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        cached = self._static.get(name)
        if cached is None:
            kind = _STATIC_TYPES.get(Path(name).suffix)
            path = STATIC / name
            if not _STATIC_NAME.match(name) or kind is None or not path.is_file():
                return plain(404, "no such file")
            cached = self._static[name] = (path.read_bytes(), kind)
        body, kind = cached
        response = web.Response(body=body, headers={"Content-Type": kind})
        secure_headers(response, cache=True)
        return response

    # -- the checks every page passes ------------------------------------------------------

    def _guard(self, route: UiRoute) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                visitor = await self.auth.visitor(request)
            except Refused as refused:
                return plain(refused.status, refused.line)
            if visitor is None:
                if request.method != "GET" or wants_fragment(request):
                    return plain(401, "log in first: /ui/login")
                response = web.Response(status=303, headers={"Location": "/ui/login"})
                secure_headers(response)
                return response
            ui_request = UiRequest(request, self.app, visitor.user, visitor.csrf, self)
            if ROLE_RANK[visitor.user.role] < ROLE_RANK[route.role]:
                line = (f"this needs the {route.role} role; "
                        f"{visitor.user.name} is {visitor.user.role}")
                if request.method == "GET" and not wants_fragment(request):
                    return ui_request.fail(403, line)
                return plain(403, line)
            if request.method == "POST" and not await self._csrf_ok(request, visitor.csrf):
                return plain(403, "missing or wrong CSRF token: reload the page")
            return await self._run(route, ui_request, visitor)

        return handle

    async def _csrf_ok(self, request: web.Request, expected: str) -> bool:
        given = request.headers.get("X-CSRF-Token", "")
        if not given:
            form = await request.post()
            value = form.get("csrf", "")
            given = value if isinstance(value, str) else ""
        return bool(given) and same_token(given, expected)

    async def _run(self, route: UiRoute, req: UiRequest, visitor: Visitor) -> web.StreamResponse:
        request = req.web
        try:
            response = await route.handler(req)
        except web.HTTPException as exc:
            secure_headers(exc)
            raise
        except Exception:
            log.exception("UI %s %s failed (user %s)", request.method, request.path,
                          visitor.user.name)
            return plain(500, "this page failed; the log has the details")
        if not response.prepared:
            secure_headers(response)
        return response

    # -- the layout ------------------------------------------------------------------------

    def render(self, req: UiRequest, template: str, context: dict[str, object]) -> str:
        """``template`` with ``context`` and what base.html shows: user, csrf, nav, banner."""
        local = req.user.name == "local" and req.csrf == self.auth.local_csrf
        values: dict[str, object] = {
            "user": req.user, "csrf": req.csrf, "can": req.can,
            "nav": [e for e in self.nav
                    if ROLE_RANK[req.user.role] >= ROLE_RANK[self._roles.get(e.path, "viewer")]],
            "path": req.web.path, "banner": LOCAL_BANNER if local else "",
            "logged_in": not local, "error": "",
        }
        values.update(context)
        return self.env.get_template(template).render(values)

    def _page(self, template: str, status: int = 200, **context: object) -> web.Response:
        values: dict[str, object] = {"user": None, "csrf": "", "nav": [], "path": "",
                                     "banner": "", "logged_in": False, "error": "",
                                     "can": lambda _role: False}
        values.update(context)
        response = web.Response(status=status, text=self.env.get_template(template).render(values),
                                content_type="text/html", charset="utf-8")
        secure_headers(response)
        return response

    async def still_allowed(self, req: UiRequest) -> bool:
        """Whether ``req``'s login still stands, for the same user with the same role."""
        try:
            visitor = await self.auth.visitor(req.web)
        except Refused:
            return False
        return visitor is not None and visitor.user == req.user

    async def audit(self, user: UiUser, action: str, target: str, detail: str) -> None:
        """Write one audit log row for ``user``."""
        await self.accounts.audit(self.clock(), user.name, action, target, detail)

    # -- logging in and out ------------------------------------------------------------------

    async def _login_form(self, request: web.Request, *, error: str = "",
                          status: int = 200) -> web.StreamResponse:
        if not await self.accounts.has_accounts():
            if not self.auth.loopback:
                return plain(503, self.auth.refusal)
            response = web.Response(status=303, headers={"Location": "/ui/"})
            secure_headers(response)
            return response
        token = new_token()
        response = self._page("login.html", status, csrf=token, error=error)
        self.auth.set_cookie(request, response, LOGIN_COOKIE, token)
        return response

    async def _login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        given, expected = form.get("csrf", ""), request.cookies.get(LOGIN_COOKIE, "")
        if not (isinstance(given, str) and given and expected and same_token(given, expected)):
            return plain(403, "missing or wrong CSRF token: reload the login page")
        name, password = form.get("name", ""), form.get("password", "")
        if not isinstance(name, str) or not isinstance(password, str):
            return await self._login_form(request, error="name and password are text",
                                          status=400)
        try:
            token = await self.auth.log_in(request, name, password)
        except LoginFailed as failed:
            log.warning("UI login refused from %s: %s", self.auth.client(request), failed.line)
            return await self._login_form(request, error=failed.line, status=failed.status)
        await self.accounts.audit(self.clock(), name.strip(), "log in", "",
                                  f"from {self.auth.client(request)}")
        response = web.Response(status=303, headers={"Location": "/ui/"})
        secure_headers(response)
        self.auth.set_cookie(request, response, SESSION_COOKIE, token, SESSION_TTL)
        response.del_cookie(LOGIN_COOKIE, path="/ui")
        return response

    async def _logout(self, req: UiRequest) -> web.StreamResponse:
        await self.auth.log_out(req.web)
        await req.audit("log out", "")
        response = web.Response(status=303, headers={"Location": "/ui/login"})
        response.del_cookie(SESSION_COOKIE, path="/ui")
        return response


__all__ = ["UiServer", "environment", "format_cost", "format_count", "format_time",
           "truncate_chars"]
