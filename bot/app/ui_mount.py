"""Where the Control UI meets the HTTP server: ``/ui`` routed to a UI built on first use.

:class:`UiMount` is a router resource of :class:`bot.app.http.HealthServer` for
``/ui`` and everything below it. It imports :mod:`bot.ui.server` (Jinja2, the
templates, the page modules) on the first such request, never at start, so an
unused UI costs nothing but this module. :func:`secure_ui_answers` puts the UI's
security headers on every answer under ``/ui``, the HTTP server's own errors too.

On a bind that is not loopback the UI needs an account: :func:`check_accounts`
logs the one line saying so at start when none exists (``/ui`` answers it, 503).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from yarl import URL

if TYPE_CHECKING:
    from aiohttp.web_urldispatcher import AbstractRoute, _InfoDict, _Resolve

    from bot.app.roost import Roost

log = logging.getLogger("roost.app.ui")

PREFIX = "/ui"
LOOPBACK_HOSTS = frozenset({"localhost", "localhost.localdomain"})


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a bind address or the name of a ``Host`` header) is this machine only."""
    host = host.strip().lower().strip("[]").rstrip(".")
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refusal(host: str) -> str:
    """The one line of a UI refused for want of an account on a bind that is not loopback."""
    return (f"the Control UI is off: http_host {host} is not a loopback address and no UI "
            "account exists; add one with `roost ui user add NAME --role admin`")


async def check_accounts(app: Roost) -> None:
    """Log :func:`refusal` once if the bind is not loopback and no UI account exists."""
    host = app.settings.http_host
    if is_loopback_host(host):
        return
    from bot.storage.ui_accounts import UiAccountStore

    store = UiAccountStore(app.store.db, app.store.lock, app.store.writer)
    try:
        if await store.has_accounts():
            return
    except Exception as exc:  # the store's own check (/readyz) reports it
        log.warning("cannot tell whether a UI account exists (%s)", type(exc).__name__)
        return
    log.warning("%s", refusal(host))


async def secure_ui_answers(request: web.Request, response: web.StreamResponse) -> None:
    """Give every ``/ui`` answer the UI's security headers, also those made outside the UI
    (the listener's 413 and 408, aiohttp's own errors); ``on_response_prepare`` signal."""
    if "Content-Security-Policy" in response.headers or not (
            request.path == PREFIX or request.path.startswith(f"{PREFIX}/")):
        return
    from bot.ui.kit import secure_headers

    secure_headers(response)


class UiMount(web.AbstractResource):
    """The router resource of ``/ui`` and below; resolves through the UI, built on first use."""

    def __init__(self, app: Roost) -> None:
        super().__init__()
        self.app = app
        self._ui: Any = None

    @property
    def canonical(self) -> str:
        return PREFIX

    def url_for(self, **kwargs: str) -> URL:
        return URL.build(path=f"{PREFIX}/")

    def add_prefix(self, prefix: str) -> None:
        raise RuntimeError("the UI is mounted at /ui only")

    def get_info(self) -> _InfoDict:
        return {"prefix": PREFIX}

    def raw_match(self, path: str) -> bool:
        return path == PREFIX or path.startswith(f"{PREFIX}/")

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[AbstractRoute]:
        return iter(())

    async def resolve(self, request: web.Request) -> _Resolve:
        if not self.raw_match(request.rel_url.path):
            return None, set()
        if self._ui is None:
            from bot.ui.server import UiServer

            self._ui = UiServer(self.app)
        return await self._ui.resolve(request), set()
