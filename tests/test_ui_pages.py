"""uicore's pages over HTTP: Overview (live), Config, Logs (live, escaped), Audit, Users.

A real app serves its HealthServer on 127.0.0.1; a real aiohttp client reads the
pages and their Server-Sent Events. The Overview and the audit log run on SQLite
and on a real PostgreSQL server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from bot.app.http import HealthServer
from bot.app.roost import Roost
from bot.storage.usage import day_of
from bot.testing.app import build_app, create_app, scripted
from bot.testing.ui import TEST_SCRYPT_N, UiClient, add_account, csrf_of, serve_ui
from bot.ui.accounts import hash_password
from bot.ui.pages import users as users_page

HOSTILE = ("<script>alert(1)</script>", "<img src=x onerror=alert(2)>")


async def next_event(response: aiohttp.ClientResponse, name: str,
                     limit: float = 20.0) -> str:
    """The data of the next SSE event called ``name`` (other events skipped)."""
    event, data = "", []
    async with asyncio.timeout(limit):
        while True:
            raw = await response.content.readline()
            if not raw:
                raise AssertionError("the stream ended")
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "":
                if event == name:
                    return "\n".join(data)
                event, data = "", []


async def execute(app: Roost, sql: str, *params: object) -> None:
    """Write one row as the stores would (through the writer: SQLite and PostgreSQL)."""

    async def body(db: object) -> None:
        await db.execute(sql, params)  # type: ignore[attr-defined]

    await app.store.writer.write(body)


@pytest.fixture(name="app")
async def app_fixture(tmp_path: Path, database_url: str) -> AsyncIterator[Roost]:
    app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=tmp_path,
                              database_url=database_url)
    yield app
    await app.close()


# -- Overview ------------------------------------------------------------------------------

async def test_overview_shows_readyz_facts_queues_runs_errors_and_spend(app: Roost) -> None:
    now = time.time()
    await execute(app, "INSERT INTO inbox (channel, event_id, session_key, chat_id, kind,"
                       " message, state, received_at) VALUES ('telegram', 'e1', 'k', 'c',"
                       " 'message', '{}', 'pending', ?)", now - 90)
    await execute(app, "INSERT INTO inbox (channel, event_id, session_key, chat_id, kind,"
                       " message, state, received_at) VALUES ('telegram', 'e2', 'k', 'c',"
                       " 'message', '{}', 'done', ?)", now - 900)
    await execute(app, "INSERT INTO outbox (channel, chat_id, message, state, created_at,"
                       " updated_at) VALUES ('telegram', 'c', '{}', 'pending', ?, ?)",
                  now - 30, now - 30)
    for n in range(3):
        await execute(app, "INSERT INTO runs (id, session_key, status, started_at, ended_at)"
                           " VALUES (?, 'k', 'completed', ?, ?)", f"r{n}", now - 20, now - 10)
    await execute(app, "INSERT INTO runs (id, session_key, status, started_at, ended_at)"
                       " VALUES ('old', 'k', 'completed', ?, ?)", now - 4000, now - 3900)
    for n in range(2):
        await execute(app, "INSERT INTO agent_errors (id, timestamp, session_id, tool_name,"
                           " raw_error, short_summary) VALUES (?, ?, 's', 'exec', 'x', 'x')",
                      f"E{n}", now - 60)
    await execute(app, "INSERT INTO usage (scope, subject, period, input_tokens, output_tokens,"
                       " runs, cost) VALUES ('agent', 'main', ?, 12345, 678, 3, 1.5)",
                  day_of(now))
    server = HealthServer(app, "127.0.0.1", 0, expected=["telegram"])
    await server.start()
    app.http = server
    async with UiClient(server.url) as client:
        assert await client.get("/readyz") == (503, "telegram: not started\n")
        status, page = await client.get("/ui/")
    assert status == 200
    assert "Not ready" in page and "telegram: <span class=\"bad\">not started</span>" in page
    inbox = page[page.index('id="ov-inbox"'):page.index('id="ov-outbox"')]
    assert '<p class="big">1</p>' in inbox  # the done entry is not open
    oldest = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(now - 90))
    assert f'datetime="{oldest}' in inbox
    outbox = page[page.index('id="ov-outbox"'):page.index('id="ov-runs"')]
    assert '<p class="big">1</p>' in outbox
    assert '<span class="big">3</span> runs in the last minute' in page
    assert ">2</span> tool errors in the last hour" in page
    assert "12,345 tokens in, 678 out" in page and "$1.50" in page
    assert "This process <strong>leads</strong>" in page


async def test_overview_updates_live_over_sse_without_a_reload(app: Roost) -> None:
    server = await serve_ui(app)
    async with aiohttp.ClientSession() as session, session.get(
            f"{server.url}/ui/overview/events", headers={"Accept": "text/event-stream"},
            timeout=aiohttp.ClientTimeout(total=60)) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"] == "text/event-stream"
        assert stream.headers["Cache-Control"] == "no-store"
        first = await next_event(stream, "facts")
        assert "0</span> tool errors in the last hour" in first
        await execute(app, "INSERT INTO agent_errors (id, timestamp, session_id, tool_name,"
                           " raw_error, short_summary) VALUES ('E1', ?, 's', 'exec', 'x', 'x')",
                      time.time())
        second = await next_event(stream, "facts")
        assert '<span class="bad">1</span> tool errors in the last hour' in second


# -- Audit -------------------------------------------------------------------------------

async def test_audit_lists_every_ui_action_newest_first_paged_by_keyset(
        app: Roost, monkeypatch: pytest.MonkeyPatch) -> None:
    # 55 accounts added through the page at a test's scrypt cost (the page's own cost is
    # checked in tests/test_ui_core.py): what this test reads is the audit log.
    monkeypatch.setattr(users_page, "hash_password",
                        functools.partial(hash_password, n=TEST_SCRYPT_N))
    await add_account(app, "ada", "admin pass")
    server = await serve_ui(app)
    async with UiClient(server.url) as client:
        status, page = await client.log_in("ada", "admin pass")
        assert status == 200
        for n in range(55):
            status, _ = await client.post("/ui/users/add", {
                "name": f"user{n:02}", "role": "viewer", "password": "password1"},
                csrf=csrf_of(page))
            assert status == 303
        status, _ = await client.post("/ui/users/remove", {"name": "user00"}, csrf=csrf_of(page))
        assert status == 303
        status, first = await client.get("/ui/audit")
        assert status == 200
        rows = re.findall(r"<td>ada</td>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>", first)
        assert len(rows) == 50
        assert rows[0] == ("remove account", "user00")
        assert rows[1] == ("add account", "user54")
        older = re.search(r'href="/ui/audit\?before=(\d+)"', first)
        assert older is not None
        status, second = await client.get(f"/ui/audit?before={older[1]}")
        rows = re.findall(r"<td>ada</td>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>", second)
        assert rows == [*(("add account", f"user{n:02}") for n in range(5, -1, -1)),
                        ("log in", "")]
        assert "from 127.0.0.1" in second
        assert "before=" not in second.split('aria-label="Audit pages"')[1]


# -- Config ------------------------------------------------------------------------------

async def test_config_shows_what_config_show_prints_masked_with_each_origin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.config.settings import load_settings
    from bot.pluginhost.manager import get_plugin_manager

    config = tmp_path / "roost.toml"
    config.write_text('bot_name = "Filed"\nmodel = "from-file"\n', encoding="utf-8")
    monkeypatch.setenv("ROOST_MODEL", "from-env")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456:SECRETSECRETSECRET")
    monkeypatch.chdir(tmp_path)
    settings = load_settings(config, data_dir=tmp_path / "data", dm_policy="open")
    from bot.app.roost import Roost as RoostApp

    app = await RoostApp.create(settings, host=get_plugin_manager(), provider=scripted())
    try:
        server = await serve_ui(app)
        async with UiClient(server.url) as client:
            status, page = await client.get("/ui/config")
    finally:
        await app.close()
    assert status == 200
    rows = dict((key, (origin, line)) for key, origin, line in re.findall(
        r"<td><code>(\w+)</code></td>\s*<td>([^<]*)</td>\s*<td><code>([^<]*)</code></td>", page))
    assert rows["model"] == ("env", "model = &#34;from-env&#34;")
    assert rows["bot_name"] == ("file", "bot_name = &#34;Filed&#34;")
    assert rows["telegram_bot_token"][0] == "env"
    assert "SECRETSECRETSECRET" not in page
    assert rows["telegram_bot_token"][1] == (
        "telegram_bot_token = &#34;********&#34;  # masked: not the real value")
    assert rows["max_tokens"][0] == "default"


# -- Logs --------------------------------------------------------------------------------

async def test_logs_page_escapes_chat_originated_markup_and_tails_live(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    turns = [{"steps": [{"tool_calls": [{"name": "cron", "arguments": {
        "action": "add", "schedule": "every 2h", "message": "check", "name": name}}]},
        {"reply": "scheduled"}]} for name in HOSTILE]
    chat = await build_app(turns, data_dir=tmp_path)
    app = chat.app
    assert app is not None
    try:
        caplog.set_level(logging.INFO, logger="roost")
        server = await serve_ui(app)
        await chat.say("remind me, name it <script>alert(1)</script>")
        await chat.settle()
        async with UiClient(server.url) as client:
            status, page = await client.get("/ui/logs?level=INFO&logger=roost.scheduling")
            assert status == 200
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
            for raw in HOSTILE:
                assert raw not in page
            stream_url = re.search(r'sse-connect="([^"]+)"', page)
            assert stream_url is not None
            async with client.session.get(
                    server.url + stream_url[1].replace("&amp;", "&"),
                    headers={"Accept": "text/event-stream"}) as stream:
                assert stream.status == 200
                await chat.say("another, name it <img src=x onerror=alert(2)>")
                await chat.settle()
                fragment = await next_event(stream, "log")
        assert "&lt;img src=x onerror=alert(2)&gt;" in fragment
        assert "<img" not in fragment
        assert "roost.scheduling" in fragment
    finally:
        await app.close()


async def test_logs_page_filters_by_level_and_logger_and_masks_secrets(
        app: Roost) -> None:
    from bot.observability import redact

    server = await serve_ui(app)
    redact.install(["sk-test-SECRETVALUE-123"])
    try:
        logging.getLogger("roost.engine.x").warning("engine warn with sk-test-SECRETVALUE-123")
        logging.getLogger("roost.engine.x").error("engine error")
        logging.getLogger("roost.storage").error("storage error")
    finally:
        redact.install([])
    async with UiClient(server.url) as client:
        _, all_lines = await client.get("/ui/logs")
        _, errors = await client.get("/ui/logs?level=ERROR&logger=roost.engine")
    assert "engine warn with ********" in all_lines
    assert "SECRETVALUE" not in all_lines
    assert "engine error" in errors
    assert "storage error" not in errors and "engine warn" not in errors


async def test_an_open_live_view_does_not_hold_up_the_shutdown(tmp_path: Path) -> None:
    app, _ = await create_app(scripted({"reply": "hi"}, loop=True), data_dir=tmp_path)
    server = await serve_ui(app)
    async with aiohttp.ClientSession() as session:
        streams = [await session.get(f"{server.url}{path}",
                                     headers={"Accept": "text/event-stream"})
                   for path in ("/ui/overview/events", "/ui/logs/events")]
        assert [s.status for s in streams] == [200, 200]
        await next_event(streams[0], "facts")
        async with asyncio.timeout(30):  # a hang guard: close() must return
            await app.close()
            for stream in streams:
                with contextlib.suppress(aiohttp.ClientError):
                    while await stream.content.readline():
                        pass
                stream.release()


async def test_a_login_on_one_replica_is_valid_on_another_and_logout_ends_it_on_both(
        tmp_path: Path, pg_url: str) -> None:
    apps = []
    try:
        for n in range(2):
            app, _ = await create_app(scripted({"reply": "hi"}, loop=True),
                                      data_dir=tmp_path / f"r{n}", database_url=pg_url)
            apps.append(app)
        await add_account(apps[0], "ada", "admin pass")
        first, second = [await serve_ui(app) for app in apps]
        async with UiClient(first.url) as client:
            status, page = await client.log_in("ada", "admin pass")
            assert status == 200
            token = client.session.cookie_jar.filter_cookies(
                URL(first.url + "/ui/"))["roost_ui"].value
            async with UiClient(second.url) as other:
                status, there = await other.get("/ui/", headers={"Cookie": f"roost_ui={token}"})
                assert status == 200 and "ada (admin)" in there
                status, _ = await client.post("/ui/logout", {}, csrf=csrf_of(page))
                assert status == 303
                response = await other.response("GET", "/ui/",
                                                headers={"Cookie": f"roost_ui={token}"})
                assert (response.status, response.headers["Location"]) == (303, "/ui/login")
    finally:
        for app in apps:
            await app.close()
