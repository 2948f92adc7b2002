"""``/ui/users`` (admin): the UI's accounts; add one, remove one (what ``roost ui user`` does)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from bot.storage.ui_accounts import NAME_RULE, ROLES, UiAccountStore, valid_name
from bot.ui.accounts import hash_password
from bot.ui.kit import NavEntry, UiRequest, UiRoute


def _store(req: UiRequest) -> UiAccountStore:
    store = req.app.store
    return UiAccountStore(store.db, store.lock, store.writer)


async def users(req: UiRequest, *, error: str = "", status: int = 200) -> web.StreamResponse:
    """Every account with its role."""
    response = req.render("users.html", accounts=await _store(req).accounts(), roles=ROLES,
                          error=error)
    response.set_status(status)
    return response


async def add(req: UiRequest) -> web.StreamResponse:
    """Add an account from the form (name, role, password)."""
    form = await req.form()
    name, role, password = (form.get("name", "").strip(), form.get("role", ""),
                            form.get("password", ""))
    if not valid_name(name):
        return await users(req, error=f"a name is {NAME_RULE}", status=400)
    if role not in ROLES:
        return await users(req, error=f"the role is one of {', '.join(ROLES)}", status=400)
    if len(password) < 8:
        return await users(req, error="the password needs at least 8 characters", status=400)
    hashed = await asyncio.to_thread(hash_password, password)
    if not await _store(req).add_account(name, role, hashed, time.time()):
        return await users(req, error=f"the account {name} exists already", status=409)
    await req.audit("add account", name, role)
    return req.redirect("/ui/users")


async def remove(req: UiRequest) -> web.StreamResponse:
    """Remove an account; its logins end at once. The last admin stays."""
    name = (await req.form()).get("name", "")
    store = _store(req)
    admins = [a.name for a in await store.accounts() if a.role == "admin"]
    if admins == [name]:
        # Without an admin nobody could manage users here; without any account a
        # loopback UI would serve everyone on this machine without a login.
        return await users(req, error=f"{name} is the last admin: add another admin first "
                                      "(or use `roost ui user remove` on the host)",
                           status=409)
    if not await store.remove_account(name):
        return await users(req, error=f"no account is called {name}", status=404)
    await req.audit("remove account", name)
    return req.redirect("/ui/users")


ROUTES = [
    UiRoute("GET", "/ui/users", users, role="admin"),
    UiRoute("POST", "/ui/users/add", add, role="admin"),
    UiRoute("POST", "/ui/users/remove", remove, role="admin"),
]
NAV = NavEntry(label="Users", path="/ui/users", order=120)
