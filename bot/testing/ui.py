"""Helpers for tests of the Control UI over HTTP: an app served on port 0 and a browser-like client.

``UiClient`` keeps cookies like a browser (the session cookie is path ``/ui``),
reads the CSRF token a page carries and posts forms with it::

    server = await serve_ui(app)
    client = UiClient(server.url)
    await client.log_in("ada", "secret")
    status, page = await client.get("/ui/")
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any

import aiohttp

from bot.app.http import HealthServer
from bot.app.roost import Roost

__all__ = ["TEST_SCRYPT_N", "UiClient", "add_account", "clients_by_role", "csrf_of", "serve_ui"]

_CSRF = re.compile(r'name="csrf"\s+value="([^"]+)"|name="csrf-token"\s+content="([^"]+)"')


def csrf_of(page: str) -> str:
    """The CSRF token a rendered page carries (its forms' field, or the meta tag)."""
    match = _CSRF.search(page)
    if match is None:
        raise AssertionError(f"no CSRF token in the page: {page[:300]!r}")
    return match.group(1) or match.group(2)


async def serve_ui(app: Roost, host: str = "127.0.0.1") -> HealthServer:
    """Start ``app``'s HTTP server on a free port of ``host`` (``app.close()`` stops it)."""
    server = HealthServer(app, host, 0, expected=[])
    await server.start()
    app.http = server
    return server


TEST_SCRYPT_N = 16
"""scrypt's work factor for test accounts: the hash format and the check are the product's,
the cost is not (``tests/test_ui_cli.py`` checks the product's own cost)."""


async def add_account(app: Roost, name: str, password: str, role: str = "admin") -> None:
    """Create a UI account in ``app``'s database, as ``roost ui user add`` does, hashed at a
    test's cost (:data:`TEST_SCRYPT_N`)."""
    import time

    from bot.storage.ui_accounts import UiAccountStore
    from bot.ui.accounts import hash_password

    store = UiAccountStore(app.store.db, app.store.lock, app.store.writer)
    hashed = hash_password(password, n=TEST_SCRYPT_N)
    if not await store.add_account(name, role, hashed, time.time()):
        raise AssertionError(f"the account {name} exists already")


class UiClient:
    """A cookie-keeping HTTP client of one UI, like one browser."""

    def __init__(self, base_url: str, **headers: str) -> None:
        self.base_url = base_url
        self.session = aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True), headers=headers)

    async def __aenter__(self) -> UiClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.session.close()

    async def get(self, path: str, **kwargs: Any) -> tuple[int, str]:
        """(status, body) of a GET, redirects followed."""
        async with self.session.get(self.base_url + path, **kwargs) as response:
            return response.status, await response.text()

    async def response(self, method: str, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        """The whole response (headers too); its body read."""
        kwargs.setdefault("allow_redirects", False)
        async with self.session.request(method, self.base_url + path, **kwargs) as response:
            await response.read()
            return response

    async def post(self, path: str, data: dict[str, str], *, csrf: str | None = None,
                   **kwargs: Any) -> tuple[int, str]:
        """(status, body) of a form POST; ``csrf`` is added as the form field when given."""
        form = dict(data)
        if csrf is not None:
            form["csrf"] = csrf
        kwargs.setdefault("allow_redirects", False)
        async with self.session.post(self.base_url + path, data=form, **kwargs) as response:
            return response.status, await response.text()

    async def log_in(self, name: str, password: str) -> tuple[int, str]:
        """Open the login form and post it; (status, body) of the answer, redirect followed."""
        status, page = await self.get("/ui/login")
        if status != 200:
            return status, page
        async with self.session.post(self.base_url + "/ui/login", data={
                "csrf": csrf_of(page), "name": name, "password": password}) as response:
            return response.status, await response.text()


async def clients_by_role(app: Roost, url: str, roles: tuple[str, ...], password: str, *,
                          add: bool = True) -> dict[str, UiClient]:
    """A client logged in to the UI at ``url`` per role, as the account named after it
    (added with ``password`` first, unless ``add`` is false: a second replica on one
    database has them). The caller closes each client's ``session``."""
    logged: dict[str, UiClient] = {}
    for role in roles:
        if add:
            await add_account(app, role, password, role)
        client = UiClient(url)
        logged[role] = client
        status, _ = await client.log_in(role, password)
        if status != 200:
            raise AssertionError(f"{role} could not log in: {status}")
    return logged
