"""The Control UI as an attacker sees it, route by route, over HTTP against a real app.

The routes are read from the UI server itself (every page module it discovered plus
its own), so a route added later is checked here without editing this file: no login
gets a redirect or 401, a viewer's POST gets 403 and changes nothing, a POST without
or with a wrong CSRF token gets 403 and changes nothing, every answer carries the
security headers, and no bad query parameter or unknown id answers 500.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.storage.ui_accounts import UiAccountStore
from bot.testing.app import ChatChannel, scripted, settle
from bot.testing.ui import UiClient, add_account, csrf_of, serve_ui
from bot.ui import kit
from bot.ui.auth import ACCOUNT_LIMIT, ADDRESS_LIMIT
from bot.ui.kit import ui_path
from bot.ui.server import UiServer
from tests.conftest import AppFactory
from tests.test_ui_core import assert_secure_headers

XSS = "<img src=x onerror=alert(1)><script>alert(2)</script>"
"""Chat-originated text (a message, a reply, an account name) every page must escape."""
PASSWORDS = {"viewer": "viewer-pass", "operator": "operator-pass", "admin": "admin-pass"}
FORM = {"name": "ada", "id": "1", "code": "ABCDEF", "user": "test:u1", "role": "viewer",
        "password": "another-pass"}
"""Fields every action reads: were a guard missing, the handler would act on them."""
ISSUE_ROLES = {"/ui/sessions": "operator", "/ui/outbox": "operator", "/ui/jobs": "operator",
               "/ui/access": "operator", "/ui/plugins": "admin", "/ui/users": "admin",
               "/ui/budgets": "admin"}
"""The least role of a POST under each page, as issue 29 says."""
UNGUARDED = {("POST", "/ui/login"), ("GET", "/ui/login")}
"""The login form posts before anyone is known (its own double-submit token: test_ui_core)."""


@pytest.fixture(name="ui")
async def ui_fixture(make_app: AppFactory) -> tuple[Roost, ChatChannel, str]:
    app, channel, _ = await make_app(scripted({"reply": f"hello {XSS}"}, loop=True))
    for role, password in PASSWORDS.items():
        await add_account(app, role, password, role)
    await add_account(app, "ada", "ada-password", "viewer")
    await add_account(app, XSS, "xss-password", "viewer")
    await channel.say(f"hi {XSS}")
    await settle(app)
    server = await serve_ui(app)
    return app, channel, server.url


VARIABLE = re.compile(r"\{\w+(?::(?:[^{}]|\{[^{}]*\})*)?\}")
"""A path variable of an aiohttp route, with its regex (which may hold ``{m,n}``)."""


def filled(path: str) -> str:
    """``path`` with each variable set to ``1`` (a value every variable of the UI admits)."""
    return VARIABLE.sub("1", path)


def secure(headers: Any, what: object) -> None:
    """The security headers are on the answer to ``what``."""
    try:
        assert_secure_headers(headers)
    except AssertionError:
        raise AssertionError(f"no security headers on the answer to {what}") from None


def routes(app: Roost) -> list[tuple[str, str]]:
    """(method, path with every variable filled) of each route the UI serves."""
    found = []
    for route in UiServer(app).router.routes():
        if route.method == "HEAD":
            continue  # the GET's own handler
        info = route.resource.get_info() if route.resource is not None else {}
        found.append((route.method, filled(str(info.get("formatter") or info.get("path")))))
    return sorted(set(found))


async def snapshot(app: Roost) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (the full-text indexes follow theirs)."""
    async with app.store.db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '%fts%' "
            "AND name != 'sqlite_sequence'") as cur:
        tables = [r[0] for r in await cur.fetchall()]
    rows = {}
    for table in tables:
        async with app.store.db.execute(f'SELECT * FROM "{table}"') as cur:
            rows[table] = sorted(map(tuple, await cur.fetchall()), key=repr)
    return rows


async def answer(client: UiClient, method: str, path: str, **kwargs: Any
                 ) -> tuple[int, str, Any]:
    """(status, body, headers); a live stream is closed after its headers."""
    kwargs.setdefault("allow_redirects", False)
    async with client.session.request(method, client.base_url + path, **kwargs) as response:
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            return response.status, "", response.headers
        return response.status, await response.text(), response.headers


async def logged_in(url: str, role: str) -> tuple[UiClient, str]:
    client = UiClient(url)
    status, page = await client.log_in(role, PASSWORDS[role])
    assert status == 200
    return client, csrf_of(page)


async def test_every_route_needs_a_login_the_role_and_the_csrf_token(ui: Any) -> None:
    app, _, url = ui
    table = routes(app)
    posts = [(m, p) for m, p in table if m == "POST" and (m, p) not in UNGUARDED]
    gets = [(m, p) for m, p in table if m == "GET"]
    assert len(posts) >= 15 and len(gets) >= 15, table
    roles = {(r.method, filled(r.path)): r.role for r in UiServer(app).routes}
    for method, path in posts:
        if path == "/ui/logout":
            continue
        page = "/".join(path.split("/")[:3])
        assert roles[(method, path)] == ISSUE_ROLES.get(page, "operator") or (
            page not in ISSUE_ROLES and roles[(method, path)] == "admin"), (path, roles)
    clients = [await logged_in(url, role) for role in PASSWORDS]
    before = await snapshot(app)
    async with UiClient(url) as anonymous:
        for method, path in table:
            if (method, path) in UNGUARDED or path.startswith("/ui/static/") or path == "/ui":
                continue
            status, _, headers = await answer(anonymous, method, path,
                                              data=FORM if method == "POST" else None)
            secure(headers, (method, path))
            if method == "GET":
                assert (status, headers.get("Location")) == (303, "/ui/login"), path
                status, _, _ = await answer(anonymous, method, path,
                                            headers={"Accept": "text/event-stream"})
            assert status == 401, (method, path)

    try:
        rank = list(PASSWORDS)
        for (client, _), role in zip(clients, PASSWORDS, strict=True):
            for method, path in posts:
                allowed = rank.index(role) >= rank.index(roles[(method, path)])
                why = "CSRF" if allowed else "needs the"
                for forged in ({"data": FORM}, {"data": dict(FORM, csrf="x" * 43)},
                               {"data": FORM, "headers": {"X-CSRF-Token": "y" * 43}}):
                    status, body, headers = await answer(client, method, path, **forged)
                    assert (status, why in body) == (403, True), (role, method, path, body)
                    secure(headers, (method, path))
        viewer, csrf = clients[0]
        for method, path in posts:
            if path == "/ui/logout":
                continue
            status, body, headers = await answer(viewer, method, path,
                                                 data=dict(FORM, csrf=csrf))
            assert (status, "needs the" in body) == (403, True), (method, path)
            secure(headers, (method, path))
        after = await snapshot(app)
        assert {t: rows for t, rows in after.items() if rows != before.get(t)} == {
            t: rows for t, rows in before.items() if rows != after.get(t)}
        for method, path in gets:
            role = roles.get((method, path), "viewer")
            status, _, headers = await answer(viewer, method, path)
            secure(headers, (method, path))
            assert status == (403 if role != "viewer" else status), path
            assert status != 401 and status < 500, (path, status)
    finally:
        for client, _ in clients:
            await client.session.close()



BAD_QUERY = ("?before=zz%27%3B--&after=-1&days=abc&q=%22%28*&level=%3Cb%3E&logger=%00"
             "&done=%3Cscript%3E&tool=%25&kind=x&user=%5C&session=x&channel=%00&agent=%FF")


async def test_no_bad_query_or_unknown_id_answers_500(ui: Any) -> None:
    app, _, url = ui
    client, _ = await logged_in(url, "admin")
    async with client:
        for method, path in routes(app):
            if method != "GET" or path.startswith("/ui/static/"):
                continue
            for variant in (path + BAD_QUERY, path.replace("/1", "/999999999") + BAD_QUERY):
                status, body, headers = await answer(client, method, variant)
                secure(headers, variant)
                assert status < 500, (variant, status, body)
                assert "Traceback" not in body


async def test_concurrent_wrong_logins_cannot_outrun_the_throttle(ui: Any) -> None:
    _, _, url = ui
    clients = [UiClient(url) for _ in range(4 * ACCOUNT_LIMIT)]
    try:
        forms = [await client.get("/ui/login") for client in clients]
        answers = await asyncio.gather(*(
            client.post("/ui/login", {"name": "admin", "password": "wrong"},
                        csrf=csrf_of(form)) for client, (_, form) in zip(clients, forms,
                                                                          strict=True)))
    finally:
        for client in clients:
            await client.session.close()
    statuses = sorted(status for status, _ in answers)
    assert statuses == [401] * ACCOUNT_LIMIT + [429] * (3 * ACCOUNT_LIMIT)
    # A right password after the failures is refused as well, until the window passes.
    async with UiClient(url) as client:
        status, _ = await client.log_in("admin", PASSWORDS["admin"])
    assert status == 429


async def test_answers_made_outside_the_pages_carry_the_security_headers_too(ui: Any) -> None:
    app, _, url = ui
    client, _ = await logged_in(url, "operator")
    async with client:
        too_big = "x" * (app.settings.http_max_body + 1)
        for method, path, kwargs in (
                ("POST", "/ui/jobs/run", {"data": too_big}),  # the listener's 413
                ("GET", "/ui/", {"data": "a body on a GET"}),
                ("POST", "/ui/login", {"data": too_big})):
            status, _, headers = await answer(client, method, path, **kwargs)
            assert status == 413
            secure(headers, (method, path))
        status, _, headers = await answer(client, "GET", "/healthz")
        assert status == 200 and "Content-Security-Policy" not in headers


def test_a_redirect_never_leaves_the_ui() -> None:
    for outside in ("//evil.example/ui/", "/\t/evil.example", "https://evil.example/ui/",
                    "/healthz", "/uix", "/ui/../metrics", "/ui\\\\evil.example", "ui/",
                    "/ui/\r\nSet-Cookie: a=b", "/ui/x y", ""):
        assert ui_path(outside) == "/ui/", outside
    for inside in ("/ui", "/ui/", "/ui/sessions/12?done=stopped", "/ui/access", "/ui?x=1"):
        assert ui_path(inside) == inside


async def test_a_forwarded_for_header_from_an_untrusted_peer_does_not_reset_the_throttle(
        ui: Any) -> None:
    _, _, url = ui  # no ui_trusted_proxies: 127.0.0.1 is the client, whatever it claims
    for n in range(ADDRESS_LIMIT):
        async with UiClient(url, **{"X-Forwarded-For": f"198.51.100.{n}"}) as client:
            status, _ = await client.log_in(f"guess{n}", "wrong")
            assert status == 401
    async with UiClient(url, **{"X-Forwarded-For": "203.0.113.9"}) as client:
        status, page = await client.log_in("admin", PASSWORDS["admin"])
    assert status == 429 and "too many failed logins" in page


async def test_every_page_names_its_icon_so_the_browser_asks_no_other_path(ui: Any) -> None:
    # Without one the browser asks /favicon.ico, which the HTTP server answers 405.
    app, _, url = ui
    client, _ = await logged_in(url, "admin")
    async with client:
        pages = 0
        for method, path in routes(app):
            if method != "GET" or path.startswith("/ui/static/"):
                continue
            _, body, headers = await answer(client, method, path)
            if not headers.get("Content-Type", "").startswith("text/html"):
                continue
            pages += 1
            assert '<link rel="icon" href="/ui/static/icon.svg"' in body, path
        response = await client.response("GET", "/ui/static/icon.svg")
    assert pages >= 12
    assert (response.status, response.content_type) == (200, "image/svg+xml")


async def test_a_bad_cursor_an_unknown_id_or_a_missing_role_is_a_page_with_the_nav(
        ui: Any) -> None:
    _, _, url = ui
    client, _ = await logged_in(url, "viewer")
    async with client:
        for path, status, line, back in (
                ("/ui/sessions?before=zz", 400, "not a page cursor", "/ui/sessions"),
                ("/ui/sessions/999999", 404, "no session 999999", "/ui/sessions"),
                ("/ui/runs/nosuch", 404, "no trace of run nosuch", "/ui/sessions"),
                ("/ui/errors/err_nosuch", 404, "no error err_nosuch", "/ui/errors"),
                ("/ui/errors?before=zz", 400, "not a page cursor", "/ui/errors"),
                ("/ui/access?before=zz", 400, "not a page cursor", "/ui/access"),
                ("/ui/outbox?before=zz", 400, "not a page cursor", "/ui/outbox"),
                ("/ui/jobs?after=zz", 400, "not a page cursor", "/ui/jobs"),
                ("/ui/users", 403, "this needs the admin role; viewer is viewer", "/ui/"),
                ("/ui/no/such/page", 404, "no such page", "/ui/")):
            got, body, headers = await answer(client, "GET", path)
            assert (got, headers["Content-Type"]) == (status, "text/html; charset=utf-8"), path
            assert '<nav class="pages"' in body and 'class="skip"' in body, path
            alert = re.search(r'<p class="error" role="alert">([^<]*)</p>', body)
            assert alert is not None and line in alert.group(1), (path, body[-400:])
            assert f'<a href="{back}">Back</a>' in body
            assert "Traceback" not in body


async def test_an_unknown_path_tells_nothing_to_a_visitor_not_logged_in(ui: Any) -> None:
    _, _, url = ui
    async with UiClient(url) as anonymous:
        status, body, headers = await answer(anonymous, "GET", "/ui/no/such/page")
    assert (status, body) == (404, "no such page\n")
    secure(headers, "/ui/no/such/page")


async def test_a_live_view_ends_when_its_login_ends(ui: Any, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    app, _, url = ui
    monkeypatch.setattr(kit, "SSE_RECHECK", 0.2)
    watcher, _ = await logged_in(url, "viewer")
    async with watcher:
        for path in ("/ui/logs/events", "/ui/overview/events", "/ui/sessions/events"):
            async with watcher.session.get(url + path) as stream:
                assert stream.status == 200
                # Another replica, the CLI or an admin removes the account meanwhile.
                await UiAccountStore(app.store.db, app.store.lock, app.store.writer
                                     ).remove_account("viewer")
                # Without the fix the stream never ends: this would hang until the guard.
                await asyncio.wait_for(stream.read(), 30)
            await add_account(app, "viewer", PASSWORDS["viewer"], "viewer")
            status, _ = await watcher.log_in("viewer", PASSWORDS["viewer"])
            assert status == 200


async def test_no_page_lets_chat_originated_markup_through(ui: Any) -> None:
    app, _, url = ui
    client, _ = await logged_in(url, "admin")
    async with client:
        async with client.session.get(url + "/ui/sessions") as response:
            first = re.search(r'href="/ui/sessions/(\d+)"', await response.text())
        assert first is not None
        sid = first.group(1)
        seen = 0
        for method, path in routes(app):
            if method != "GET" or path.startswith("/ui/static/"):
                continue
            for variant in (path.replace("/1", f"/{sid}"), f"{path}?q=hi&user=test"):
                _, body, headers = await answer(client, method, variant)
                if not headers.get("Content-Type", "").startswith("text/html"):
                    continue
                assert "<img src=x" not in body and "<script>alert" not in body, variant
                seen += body.count("&lt;img src=x onerror=alert(1)&gt;")
    assert seen >= 4  # the list, its search, the transcript, the users page


GARBAGE_FORMS = ({}, {"id": "-1", "code": "", "name": "", "user": ""},
                 {"id": "9" * 30, "code": "x" * 5000, "name": "\x00\n<b>", "user": ":::",
                  "role": "root", "password": "short"},
                 {"id": "nosuch", "code": "NOSUCH", "name": "nosuch", "user": "test:nobody"})


async def test_no_garbage_form_makes_an_action_answer_500(ui: Any) -> None:
    app, _, url = ui
    client, csrf = await logged_in(url, "admin")
    async with client:
        for method, path in routes(app):
            if method != "POST" or (method, path) in UNGUARDED or path == "/ui/logout":
                continue
            for form in GARBAGE_FORMS:
                status, body, headers = await answer(client, method, path,
                                                     data=dict(form, csrf=csrf))
                secure(headers, (method, path))
                assert status < 500 and "Traceback" not in body, (path, form, status, body)


async def test_the_last_admin_cannot_be_removed_from_the_ui(ui: Any) -> None:
    app, _, url = ui
    client, csrf = await logged_in(url, "admin")
    async with client:
        status, body, _ = await answer(client, "POST", "/ui/users/remove",
                                       data={"name": "admin", "csrf": csrf})
        assert status == 409 and "admin is the last admin" in body
        # With a second admin, either may go.
        await add_account(app, "root", "root-password", "admin")
        status, _, _ = await answer(client, "POST", "/ui/users/remove",
                                    data={"name": "root", "csrf": csrf})
        assert status == 303
    async with app.store.db.execute(
            "SELECT name FROM ui_users WHERE role = 'admin'") as cur:
        assert [r[0] for r in await cur.fetchall()] == ["admin"]


async def test_a_login_name_no_account_can_have_counts_per_address_only(ui: Any) -> None:
    # Kept per account, each such name (up to the 1 MB body) would stay in memory as a
    # key of the per-account limit, 10,000 of them; no account can be called so.
    _, _, url = ui
    huge = "x" * 100_000
    async with UiClient(url) as client:
        for _ in range(ADDRESS_LIMIT):
            status, page = await client.log_in(huge, "wrong")
            assert status == 401 and "wrong name or password" in page
        status, page = await client.log_in("admin", PASSWORDS["admin"])
    assert status == 429  # the address's limit holds all the same
