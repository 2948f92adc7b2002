"""Who is asking: the login cookie, the no-account loopback mode, login and logout.

* With at least one account, every page needs a login: a form posts name and
  password, a random session token goes into an HttpOnly, SameSite=Strict cookie
  (Secure when the request came over TLS) and only its hash into the database.
* With no account, a loopback bind serves everyone on this machine as ``local``
  (admin), for requests naming a loopback host (a DNS-rebound name is refused);
  any other bind refuses the UI (:func:`bot.app.ui_mount.refusal`).
* Failed logins are throttled per client address and per account name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from bot.app.ui_mount import is_loopback_host, refusal
from bot.storage.ui_accounts import UiAccountStore, valid_name
from bot.ui.accounts import Throttle, new_token, token_hash, verify_password
from bot.ui.kit import Role, UiUser

SESSION_COOKIE = "roost_ui"
"""The login session's cookie (HttpOnly, SameSite=Strict, path /ui)."""
LOGIN_COOKIE = "roost_ui_login"
"""The login form's own CSRF cookie (double submit): a forged login is refused too."""
SESSION_TTL = 12 * 3600.0
"""Seconds a login lasts; then the user logs in again."""
ADDRESS_LIMIT, ACCOUNT_LIMIT, LIMIT_WINDOW = 10, 5, 900.0
"""Failed logins allowed per client address and per account name within the window (s)."""


@dataclass(frozen=True, slots=True)
class Visitor:
    """A request's user and the CSRF token their forms carry."""

    user: UiUser
    csrf: str


class Refused(Exception):
    """The UI does not answer this request at all (``status``, one line)."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(line)
        self.status = status
        self.line = line


class LoginFailed(Exception):
    """A login attempt refused; the line is shown on the form."""

    def __init__(self, line: str, status: int = 401) -> None:
        super().__init__(line)
        self.line = line
        self.status = status


def host_name(header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8080`` → ``::1``)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class Auth:
    """Identifies each request's user; logs users in and out."""

    def __init__(self, store: UiAccountStore, *, bind_host: str,
                 trusted_proxies: Sequence[str] = (),
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.bind_host = bind_host
        self.loopback = is_loopback_host(bind_host)
        self.proxies = [ipaddress.ip_network(p, strict=False) for p in trusted_proxies]
        self.refusal = refusal(bind_host)
        """What /ui answers (503) on a non-loopback bind while no account exists."""
        self.clock = clock
        self.local_csrf = new_token()
        """The CSRF token of the no-account loopback mode (this process's own)."""
        self.by_address = Throttle(ADDRESS_LIMIT, LIMIT_WINDOW)
        self.by_account = Throttle(ACCOUNT_LIMIT, LIMIT_WINDOW)

    # -- the client ---------------------------------------------------------------

    def _trusted(self, request: web.Request) -> bool:
        peer = request.remote or ""
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in net for net in self.proxies)

    def is_tls(self, request: web.Request) -> bool:
        """Whether the browser reached Roost over TLS (a trusted proxy's word counts)."""
        if request.secure:
            return True
        if self._trusted(request):
            proto = request.headers.get("X-Forwarded-Proto", "")
            return proto.split(",")[0].strip().lower() == "https"
        return False

    def client(self, request: web.Request) -> str:
        """The client's address: the peer, or past trusted proxies, X-Forwarded-For's."""
        peer = request.remote or "?"
        if not self._trusted(request):
            return peer
        hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",")]
        for hop in reversed([h for h in hops if h]):
            try:
                address = ipaddress.ip_address(hop)
            except ValueError:
                return hop[:64]
            if not any(address in net for net in self.proxies):
                return hop
        return peer

    # -- who is asking --------------------------------------------------------------

    async def visitor(self, request: web.Request) -> Visitor | None:
        """The logged-in (or local) user of ``request``; ``None``: not logged in.

        Raises :class:`Refused` when the UI does not serve this request at all.
        """
        if not await self.store.has_accounts():
            if not self.loopback:
                raise Refused(503, self.refusal)
            if not is_loopback_host(host_name(request.host)):
                raise Refused(421, "the Control UI without accounts answers only to "
                                   "127.0.0.1, ::1 or localhost")
            return Visitor(UiUser("local", "admin"), self.local_csrf)
        token = request.cookies.get(SESSION_COOKIE, "")
        if not token:
            return None
        login = await self.store.login(token_hash(token), self.clock())
        if login is None:
            return None
        role: Role = "admin" if login.role == "admin" else \
            "operator" if login.role == "operator" else "viewer"
        return Visitor(UiUser(login.user_name, role), login.csrf)

    # -- logging in and out -----------------------------------------------------------

    async def log_in(self, request: web.Request, name: str, password: str) -> str:
        """Check ``name`` and ``password``; the new session token, else :class:`LoginFailed`."""
        address, account = self.client(request), name.strip().lower()
        wait = max(self.by_address.wait(address), self.by_account.wait(account))
        if wait > 0:
            raise LoginFailed(f"too many failed logins: try again in {int(wait) + 1} s", 429)
        if not valid_name(name.strip()):
            # No account has such a name: counted per address only, so a name of a
            # megabyte is never kept as a key of the per-account limit.
            self.by_address.failed(address)
            raise LoginFailed("wrong name or password")
        # Counted as failed before the (slow) check, so attempts sent at once cannot all
        # pass the limit while the first ones are still being checked.
        self.by_address.failed(address)
        self.by_account.failed(account)
        found = await self.store.account(name.strip())
        ok = await asyncio.to_thread(verify_password, password,
                                     found.password_hash if found else None)
        if found is None or not ok:
            raise LoginFailed("wrong name or password")
        self.by_address.forgive(address)
        self.by_account.clear(account)
        token, now = new_token(), self.clock()
        await self.store.add_login(token_hash(token), found.name, new_token(), now,
                                   now + SESSION_TTL)
        return token

    async def log_out(self, request: web.Request) -> None:
        """End the request's login session, if any."""
        token = request.cookies.get(SESSION_COOKIE, "")
        if token:
            await self.store.end_login(token_hash(token))

    def set_cookie(self, request: web.Request, response: web.StreamResponse, name: str,
                   value: str, max_age: float | None = None) -> None:
        """Set a UI cookie: HttpOnly, SameSite=Strict, path /ui, Secure over TLS."""
        response.set_cookie(name, value, path="/ui", httponly=True, samesite="Strict",
                            secure=self.is_tls(request),
                            max_age=None if max_age is None else int(max_age))
