"""The Control UI's framework over HTTP: who may use it, login, roles, CSRF, headers, lazy load.

A real app (``create_app``) serves its HealthServer on a free port of 127.0.0.1;
a real aiohttp client keeps cookies like a browser.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app.roost import Roost
from bot.testing.app import create_app, scripted
from bot.testing.ui import UiClient, add_account, csrf_of, serve_ui
from bot.ui.auth import ACCOUNT_LIMIT, ADDRESS_LIMIT

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(name="app")
async def app_fixture(tmp_path: Path) -> AsyncIterator[Roost]:
    app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=tmp_path)
    yield app
    await app.close()


def assert_secure_headers(headers: object, *, page: bool = True) -> None:
    get = headers.get  # type: ignore[attr-defined]
    csp = get("Content-Security-Policy", "")
    assert "script-src 'self'" in csp and "style-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "frame-ancestors 'none'" in csp
    assert get("X-Frame-Options") == "DENY"
    assert get("X-Content-Type-Options") == "nosniff"
    assert get("Referrer-Policy") == "no-referrer"
    if page:
        assert get("Cache-Control") == "no-store"


# -- no account ---------------------------------------------------------------------------

async def test_without_an_account_a_loopback_bind_serves_everyone_as_local_admin_with_a_banner(
        app: Roost) -> None:
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        response = await client.response("GET", "/ui/")
        status, page = await client.get("/ui/")
    assert response.status == 200
    assert_secure_headers(response.headers)
    assert status == 200
    assert "anyone on this machine can act" in page
    assert "local (admin)" in page
    assert "Log out" not in page  # nothing to log out of


async def test_without_an_account_a_dns_rebound_host_name_is_refused(app: Roost) -> None:
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        status, body = await client.get("/ui/", headers={"Host": f"evil.example:{server.port}"})
    assert status == 421
    assert "answers only to 127.0.0.1, ::1 or localhost" in body


async def test_without_an_account_a_public_bind_refuses_the_ui_but_serves_health(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # http_host names what roost run binds; the test server listens on 127.0.0.1 all the same.
    app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=tmp_path,
                              http_host="0.0.0.0")
    try:
        with caplog.at_level(logging.WARNING, logger="roost.app.ui"):
            server = await serve_ui(app)
        refusals = [r.getMessage() for r in caplog.records if "Control UI is off" in r.getMessage()]
        assert refusals == ["the Control UI is off: http_host 0.0.0.0 is not a loopback address "
                            "and no UI account exists; add one with `roost ui user add NAME "
                            "--role admin`"]
        async with UiClient(server.url) as client:
            for path in ("/ui/", "/ui/login", "/ui/static/ui.css"):
                status, body = await client.get(path)
                if path == "/ui/static/ui.css":
                    assert status == 200  # the stylesheet is no secret
                    continue
                assert (status, body) == (503, refusals[0] + "\n")
            assert await client.get("/healthz") == (200, "ok\n")
            assert await client.get("/readyz") == (200, "ready\n")
            status, metrics = await client.get("/metrics")
            assert status == 200 and "roost_" in metrics
            # An account added (roost ui user add, from another process) opens the login.
            await add_account(app, "ada", "correct horse")
            status, page = await client.get("/ui/")
            assert status == 200 and 'action="/ui/login"' in page
    finally:
        await app.close()


# -- logging in ---------------------------------------------------------------------------

async def test_login_sets_a_strict_httponly_cookie_whose_token_is_stored_hashed_and_logout_ends_it(
        app: Roost) -> None:
    await add_account(app, "ada", "correct horse")
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        first = await client.response("GET", "/ui/")
        assert (first.status, first.headers["Location"]) == (303, "/ui/login")
        status, form = await client.get("/ui/login")
        assert status == 200
        answer = await client.response("POST", "/ui/login", data={
            "csrf": csrf_of(form), "name": "ada", "password": "correct horse"})
        assert (answer.status, answer.headers["Location"]) == (303, "/ui/")
        assert "?" not in answer.headers["Location"]
        cookie = answer.cookies["roost_ui"]
        assert cookie["httponly"] and cookie["samesite"] == "Strict"
        assert cookie["path"] == "/ui" and not cookie["secure"]
        token = cookie.value
        async with app.store.db.execute("SELECT token_hash, csrf FROM ui_sessions") as cur:
            rows = [tuple(r) for r in await cur.fetchall()]
        assert [r[0] for r in rows] == [hashlib.sha256(token.encode()).hexdigest()]
        status, page = await client.get("/ui/")
        assert status == 200 and "ada (admin)" in page and token not in page
        assert csrf_of(page) == rows[0][1]
        assert "anyone on this machine" not in page
        status, _ = await client.post("/ui/logout", {}, csrf=csrf_of(page))
        assert status == 303
        async with app.store.db.execute("SELECT COUNT(*) FROM ui_sessions") as cur:
            assert (await cur.fetchone())[0] == 0
    # The old cookie, replayed after logout, logs nobody in.
    async with UiClient(server.url) as replay:
        again = await replay.response("GET", "/ui/", headers={"Cookie": f"roost_ui={token}"})
        assert (again.status, again.headers["Location"]) == (303, "/ui/login")


async def test_a_wrong_password_or_unknown_name_is_refused_with_one_line(app: Roost) -> None:
    await add_account(app, "ada", "correct horse")
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        for name, password in (("ada", "wrong"), ("bob", "correct horse")):
            status, page = await client.log_in(name, password)
            assert status == 401
            assert "wrong name or password" in page
        status, _ = await client.get("/ui/login")
        assert status == 200
        response = await client.response("GET", "/ui/")
        assert response.status == 303  # still not logged in


async def test_a_login_post_without_the_login_forms_token_is_refused(app: Roost) -> None:
    await add_account(app, "ada", "correct horse")
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        status, body = await client.post("/ui/login", {"name": "ada",
                                                       "password": "correct horse"})
        assert status == 403 and "CSRF" in body
        status, body = await client.post("/ui/login", {"name": "ada", "password": "correct horse"},
                                         csrf="forged")
        assert status == 403


async def test_failed_logins_are_throttled_per_account_then_per_address(app: Roost) -> None:
    await add_account(app, "ada", "correct horse")
    await add_account(app, "bob", "battery staple")
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        for _ in range(ACCOUNT_LIMIT):
            status, _ = await client.log_in("ada", "wrong")
            assert status == 401
        # The right password no longer helps this account for a while...
        status, page = await client.log_in("ada", "correct horse")
        assert status == 429 and "too many failed logins" in page
        # ...but another account from the same address may still log in.
        status, page = await client.log_in("bob", "battery staple")
        assert status == 200 and "bob (admin)" in page
        # Failures spread over many names hit the limit per address.
        for n in range(ADDRESS_LIMIT - ACCOUNT_LIMIT):
            status, _ = await client.log_in(f"guess{n}", "wrong")
            assert status == 401
        status, page = await client.log_in("bob", "battery staple")
        assert status == 429 and "too many failed logins" in page


async def test_the_cookie_is_secure_behind_a_trusted_tls_proxy_only(tmp_path: Path) -> None:
    for trusted, secure in (([], False), (["127.0.0.0/8"], True)):
        app, _ = await create_app(scripted({"reply": "hi"}, loop=True),
                                  data_dir=tmp_path / str(secure), ui_trusted_proxies=trusted)
        try:
            await add_account(app, "ada", "correct horse")
            server = await serve_ui(app)
            async with UiClient(server.url, **{"X-Forwarded-Proto": "https"}) as client:
                form = await client.response("GET", "/ui/login")
                pre = form.cookies["roost_ui_login"]
                assert bool(pre["secure"]) is secure
                # The client's jar keeps a Secure cookie for https only: sent by hand here.
                answer = await client.response("POST", "/ui/login", data={
                    "csrf": csrf_of(await form.text()), "name": "ada",
                    "password": "correct horse"}, headers={"Cookie": f"roost_ui_login={pre.value}"})
                assert answer.status == 303
                assert bool(answer.cookies["roost_ui"]["secure"]) is secure
        finally:
            await app.close()


# -- roles and CSRF -----------------------------------------------------------------------

async def test_each_role_reaches_what_it_may_and_a_forged_post_gets_403(app: Roost) -> None:
    await add_account(app, "vic", "viewer pass", role="viewer")
    await add_account(app, "otto", "operator pass", role="operator")
    await add_account(app, "ada", "admin pass", role="admin")
    server = await serve_ui(app)
    for name, password, role in (("vic", "viewer pass", "viewer"),
                                 ("otto", "operator pass", "operator"),
                                 ("ada", "admin pass", "admin")):
        async with UiClient(server.url) as client:
            status, page = await client.log_in(name, password)
            assert status == 200 and f"{name} ({role})" in page
            status, users = await client.get("/ui/users")
            if role != "admin":
                assert status == 403 and f"{name} is {role}" in users
                # A forged POST with this login's own CSRF token: still 403 for the role.
                status, body = await client.post("/ui/users/remove", {"name": "ada"},
                                                 csrf=csrf_of(page))
                assert status == 403 and "needs the admin role" in body
            else:
                assert status == 200
                assert "Remove" in users
    async with app.store.db.execute("SELECT name FROM ui_users ORDER BY name") as cur:
        assert [r[0] for r in await cur.fetchall()] == ["ada", "otto", "vic"]


async def test_a_post_without_or_with_a_wrong_csrf_token_is_refused(app: Roost) -> None:
    await add_account(app, "ada", "admin pass")
    await add_account(app, "vic", "viewer pass", role="viewer")
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        status, page = await client.log_in("ada", "admin pass")
        assert status == 200
        for csrf in (None, "", "0" * 43):
            status, body = await client.post("/ui/users/remove", {"name": "vic"}, csrf=csrf)
            assert status == 403 and "CSRF" in body
        status, body = await client.post("/ui/logout", {})
        assert status == 403
        # The header htmx sends is as good as the form field.
        status, _ = await client.post("/ui/users/remove", {"name": "vic"},
                                      headers={"X-CSRF-Token": csrf_of(page)})
        assert status == 303
    async with app.store.db.execute("SELECT name FROM ui_users") as cur:
        assert [r[0] for r in await cur.fetchall()] == ["ada"]


async def test_a_post_in_the_local_mode_needs_the_csrf_token_too(app: Roost) -> None:
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        _, page = await client.get("/ui/users")
        status, _ = await client.post("/ui/users/add", {
            "name": "ada", "role": "admin", "password": "pw123456"})
        assert status == 403
        status, _ = await client.post("/ui/users/add", {
            "name": "ada", "role": "admin", "password": "pw123456"}, csrf=csrf_of(page))
        assert status == 303
    async with app.store.db.execute("SELECT name, role, password_hash FROM ui_users") as cur:
        [(name, role, hashed)] = await cur.fetchall()
    assert (name, role) == ("ada", "admin")
    assert hashed.startswith("scrypt$16384$8$1$")  # the page hashes at the product's cost


async def test_unauthenticated_htmx_and_sse_requests_get_401_not_a_redirect(app: Roost) -> None:
    await add_account(app, "ada", "admin pass")
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        status, _ = await client.get("/ui/overview/events",
                                     headers={"Accept": "text/event-stream"})
        assert status == 401
        status, _ = await client.get("/ui/", headers={"HX-Request": "true"})
        assert status == 401


async def test_static_files_are_served_with_the_headers_and_nothing_outside_them(
        app: Roost) -> None:
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        for name in ("htmx.min.js", "sse.js", "ui.js", "ui.css"):
            response = await client.response("GET", f"/ui/static/{name}")
            assert response.status == 200
            assert_secure_headers(response.headers, page=False)
            assert "max-age" in response.headers["Cache-Control"]
        for name in ("..%2f..%2fpyproject.toml", "../server.py", ".hidden", "nothing.js"):
            status, _ = await client.get(f"/ui/static/{name}")
            assert status == 404
        status, body = await client.get("/ui/no/such/page")
        assert status == 404 and "no such page" in body


# -- cost when unused ---------------------------------------------------------------------

def test_the_ui_is_imported_on_the_first_ui_request_not_at_start(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import asyncio, sys
        import aiohttp
        from bot.testing.app import create_app, scripted
        from bot.testing.ui import serve_ui

        async def main():
            app, _ = await create_app(scripted({{"reply": "hi"}}), data_dir={str(tmp_path)!r})
            server = await serve_ui(app)
            async with aiohttp.ClientSession() as client:
                async with client.get(server.url + "/healthz") as r:
                    assert r.status == 200
                print("after start:", sorted(m for m in sys.modules
                                             if m.startswith(("bot.ui", "jinja2"))))
                async with client.get(server.url + "/ui/") as r:
                    assert r.status == 200, r.status
                print("after /ui:", "bot.ui.server" in sys.modules, "jinja2" in sys.modules)
            await app.close()

        asyncio.run(main())
    """)
    # bot.testing.ui imports only the storage side; the UI package stays out.
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["after start: []", "after /ui: True True"]


async def test_a_page_module_that_fails_to_import_is_left_out_and_the_others_serve(
        app: Roost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from bot.ui import pages

    extra = tmp_path / "pages"
    extra.mkdir()
    (extra / "zz_broken.py").write_text("raise RuntimeError('a bug in a page')\n",
                                        encoding="utf-8")
    monkeypatch.setattr(pages, "__path__", [*pages.__path__, str(extra)])
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        status, page = await client.get("/ui/")
    assert status == 200 and "Overview" in page
    assert any("zz_broken cannot be loaded" in r.getMessage() for r in caplog.records)


def test_trusted_proxies_come_from_the_env_comma_separated_and_a_bad_one_names_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.config.settings import ConfigError, load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROOST_UI_TRUSTED_PROXIES", "10.0.0.5, 10.1.0.0/16,::1")
    assert load_settings().ui_trusted_proxies == ["10.0.0.5", "10.1.0.0/16", "::1"]
    monkeypatch.setenv("ROOST_UI_TRUSTED_PROXIES", "10.0.0.5,proxy.example")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert str(refused.value) == ("invalid config: ui_trusted_proxies: Value error, "
                                  "'proxy.example' is not an IP address or network "
                                  "(in roost.toml or ROOST_UI_TRUSTED_PROXIES)")


async def test_behind_a_trusted_proxy_failed_logins_count_per_forwarded_client(
        tmp_path: Path) -> None:
    app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=tmp_path,
                              ui_trusted_proxies=["127.0.0.1"])
    try:
        await add_account(app, "ada", "correct horse")
        server = await serve_ui(app)
        attacker = {"X-Forwarded-For": "198.51.100.7, 203.0.113.1"}
        async with UiClient(server.url, **attacker) as client:
            for n in range(ADDRESS_LIMIT):
                status, _ = await client.log_in(f"guess{n}", "wrong")
                assert status == 401
            status, page = await client.log_in("ada", "correct horse")
            assert status == 429 and "too many failed logins" in page
        # Another client behind the same proxy is not locked out (the proxy's own
        # address would have been, had X-Forwarded-For not been believed).
        async with UiClient(server.url, **{"X-Forwarded-For": "203.0.113.2"}) as client:
            status, page = await client.log_in("ada", "correct horse")
            assert status == 200 and "ada (admin)" in page
    finally:
        await app.close()
