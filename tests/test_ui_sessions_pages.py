"""The Control UI's sessions, transcript, run and error pages over HTTP: a real app
(``create_app`` with a scripted model) serving its HealthServer on a free port, a real
aiohttp client keeping cookies like a browser."""

from __future__ import annotations

import asyncio
import html
import io
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bot.app.roost import Roost
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import ChatMessage, ContentPart
from bot.contracts.tools import Tool, ToolContext, ToolError
from bot.testing.app import ChatChannel, EventRecorder, create_app, scripted, settle
from bot.testing.ui import UiClient, add_account, csrf_of, serve_ui
from tests.conftest import AppFactory
from tests.test_cli import clean_env

XSS_IMG = "<img src=x onerror=alert(1)>"
XSS_SCRIPT = "<script>alert(2)</script>"
KEY = "default:test:direct:u1"


class Failing:
    """A tool that fails with a stored error."""

    @staticmethod
    async def _billing(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        raise ToolError("permission denied for table invoices <b>", code="EACCES")

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        return [Tool("billing", "reads invoices", {"type": "object", "properties": {}},
                     self._billing)]


SCRIPT = [
    {"match": "use a tool", "steps": [
        {"tool_calls": [{"name": "billing", "arguments": {"note": XSS_SCRIPT}}]},
        {"reply": f"it failed {XSS_IMG}"}]},
    {"match": "think hard", "reply": "too late", "delay": 30},
    {"reply": f"hello {XSS_SCRIPT}"},
]


@pytest.fixture
async def ui(make_app: AppFactory) -> tuple[Roost, ChatChannel, EventRecorder, str]:
    app, channel, log = await make_app(scripted(*SCRIPT, loop=True), Failing(),
                                       compact_keep_messages=2)
    await add_account(app, "ada", "operator-pw", "operator")
    await add_account(app, "vic", "viewer-pw", "viewer")
    server = await serve_ui(app)
    return app, channel, log, server.url


async def client_as(url: str, name: str, password: str) -> UiClient:
    client = UiClient(url)
    status, _ = await client.log_in(name, password)
    assert status == 200
    return client


async def sid_of(app: Roost, key: str = KEY) -> int:
    return (await app.store.get(key)).id


async def test_the_list_search_and_filters_escape_what_came_from_chats(ui: Any) -> None:
    app, channel, _, url = ui
    await channel.say(f"hi {XSS_IMG} {XSS_SCRIPT}")
    await channel.say("a note about invoices", sender="u2")
    await settle(app)
    async with await client_as(url, "vic", "viewer-pw") as client:
        status, page = await client.get("/ui/sessions")
        assert status == 200
        assert "direct u1" in page and "direct u2" in page
        assert XSS_IMG not in page and XSS_SCRIPT not in page
        assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
        # newest first: u2 spoke last
        assert page.index("direct u2") < page.index("direct u1")
        status, found = await client.get("/ui/sessions?q=invoices")
        assert status == 200 and "<mark>invoices</mark>" in found
        assert f'/ui/sessions/{await sid_of(app, "default:test:direct:u2")}#m' in found
        status, hits = await client.get("/ui/sessions?q=onerror")
        assert status == 200 and "onerror" in hits and XSS_IMG not in hits
        assert "&lt;img src=x <mark>onerror</mark>=alert(1)&gt;" in hits
        _, only = await client.get("/ui/sessions?user=u2")
        assert "direct u2" in only and "direct u1" not in only
        _, none = await client.get("/ui/sessions?channel=telegram")
        assert "direct u1" not in none and "No conversation matches." in none
        _, agent = await client.get("/ui/sessions?agent=default&channel=test")
        assert "direct u1" in agent and "direct u2" in agent
        status, body = await client.get("/ui/sessions?before=garbage")
        assert status == 400 and "not a page cursor" in body


async def test_the_transcript_shows_tool_calls_results_runs_and_links_error_ids(
        ui: Any) -> None:
    app, channel, _, url = ui
    await channel.say("please use a tool")
    await settle(app)
    sid = await sid_of(app)
    (error,) = await app.services.errors.list()
    (run,) = await app.store.runs(KEY)
    async with await client_as(url, "vic", "viewer-pw") as client:
        status, page = await client.get(f"/ui/sessions/{sid}")
    assert status == 200
    assert "calls <strong>billing</strong>" in page
    # The arguments in full, as JSON, escaped.
    assert "&#34;note&#34;: &#34;&lt;script&gt;alert(2)&lt;/script&gt;&#34;" in page
    assert "result of billing" in page and "(failed)" in page
    assert f'<a href="/ui/errors/{error.id}">{error.id}</a>' in page
    assert "it failed &lt;img src=x onerror=alert(1)&gt;" in page
    assert XSS_IMG not in page and XSS_SCRIPT not in page
    assert f'href="/ui/runs/{run.run_id}"' in page and "(default, " in page
    # A viewer sees no action.
    assert "/stop" not in page and "Reset</button>" not in page


async def test_a_run_page_is_a_waterfall_of_its_spans(ui: Any) -> None:
    app, channel, _, url = ui
    await channel.say("please use a tool")
    await settle(app)
    (run,) = await app.store.runs(KEY)
    (error,) = await app.services.errors.list()
    async with await client_as(url, "vic", "viewer-pw") as client:
        status, page = await client.get(f"/ui/runs/{run.run_id}")
        missing = await client.get("/ui/runs/nope")
    assert status == 200
    rows = re.findall(r"<strong>(agent|llm|tool|delivery)</strong>", page)
    assert rows == ["agent", "llm", "tool", "llm", "delivery"]
    assert page.count("<svg") == 5 and "input_tokens" in page
    assert "<strong>tool</strong> billing <span class=\"bad\">(failed)</span>" in page
    assert f'href="/ui/errors/{error.id}"' in page
    assert f'href="/ui/sessions/{await sid_of(app)}"' in page
    assert missing[0] == 404 and "still running" in missing[1]


async def test_a_failed_runs_page_shows_its_error(ui: Any) -> None:
    app, channel, _, url = ui
    app.engine.provider = scripted({"error": "the model is down"})
    await channel.say("anything")
    await settle(app)
    (run,) = await app.store.runs(KEY)
    assert run.status == "failed"
    async with await client_as(url, "vic", "viewer-pw") as client:
        _, page = await client.get(f"/ui/runs/{run.run_id}")
    assert '<p class="bad">failed</p>' in page and "the model is down" in page


async def test_the_error_pages_filter_and_show_what_roost_errors_show_prints(
        ui: Any) -> None:
    app, channel, _, url = ui
    await channel.say("please use a tool")
    await settle(app)
    (error,) = await app.services.errors.list()
    async with await client_as(url, "vic", "viewer-pw") as client:
        _, listing = await client.get("/ui/errors")
        _, by_tool = await client.get("/ui/errors?tool=billing&kind=permission_denied&user=u1")
        _, other = await client.get("/ui/errors?tool=billing&kind=timeout")
        _, nobody = await client.get("/ui/errors?user=u9")
        status, page = await client.get(f"/ui/errors/{error.id}")
        assert (await client.get("/ui/errors/err_20240101_000000_000000"))[0] == 404
    assert f'href="/ui/errors/{error.id}"' in listing and error.id in by_tool
    assert error.id not in other and error.id not in nobody
    assert status == 200
    await app.close()
    shown = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "bot", "errors", "show", error.id],
        cwd=app.settings.data_dir.parent, capture_output=True, text=True, timeout=60,
        env=clean_env(ROOST_DATA_DIR=str(app.settings.data_dir)))
    assert shown.returncode == 0, shown.stderr
    report = re.search(r'<pre id="error-report">(.*?)</pre>', page, re.S)
    assert report is not None
    assert html.unescape(report.group(1)) == shown.stdout.rstrip("\n")
    assert "&lt;b&gt;" in report.group(1)


async def sse_events(client: UiClient, path: str, want: int,
                     seen: asyncio.Event) -> list[tuple[str, str]]:
    """The first ``want`` events of an SSE stream (``seen`` is set once it answered)."""
    events: list[tuple[str, str]] = []
    async with client.session.get(client.base_url + path,
                                  headers={"Accept": "text/event-stream"}) as response:
        assert response.status == 200
        seen.set()
        name, data = "", []
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and name:
                events.append((name, "\n".join(data)))
                name, data = "", []
                if len(events) >= want:
                    return events
    return events


async def test_a_new_message_reaches_the_live_transcript_and_list(ui: Any) -> None:
    app, channel, _, url = ui
    await channel.say("first")
    await settle(app)
    sid = await sid_of(app)
    async with await client_as(url, "vic", "viewer-pw") as client:
        _, page = await client.get(f"/ui/sessions/{sid}")
        after = re.search(r'/events\?after=(\d+)"', page)
        assert after is not None
        ready, ready_list = asyncio.Event(), asyncio.Event()
        stream = asyncio.ensure_future(sse_events(
            client, f"/ui/sessions/{sid}/events?after={after.group(1)}", 1, ready))
        listing = asyncio.ensure_future(sse_events(client, "/ui/sessions/events", 1,
                                                   ready_list))
        await asyncio.wait_for(asyncio.gather(ready.wait(), ready_list.wait()), 10)
        await asyncio.sleep(0.6)  # the list stream read the newest activity
        await channel.say(f"second {XSS_SCRIPT}")
        await settle(app)
        ((name, html),) = await asyncio.wait_for(stream, 10)
        ((list_name, rows),) = await asyncio.wait_for(listing, 10)
    assert name == "messages" and "second &lt;script&gt;" in html and XSS_SCRIPT not in html
    assert html.count("<article") == 2  # the question and the answer, not "first" again
    assert list_name == "rows" and "direct u1" in rows
    assert "&lt;script&gt;" in rows and XSS_SCRIPT not in rows


async def test_every_action_refuses_a_viewer_and_a_post_without_csrf(ui: Any) -> None:
    app, channel, _, url = ui
    await channel.say("first")
    await settle(app)
    sid = await sid_of(app)
    async with await client_as(url, "vic", "viewer-pw") as viewer, \
            await client_as(url, "ada", "operator-pw") as operator:
        _, page = await viewer.get(f"/ui/sessions/{sid}")
        _, op_page = await operator.get(f"/ui/sessions/{sid}")
        for action in ("stop", "reset", "compact"):
            status, body = await viewer.post(f"/ui/sessions/{sid}/{action}", {},
                                             csrf=csrf_of(page))
            assert status == 403 and "needs the operator role" in body
            status, body = await operator.post(f"/ui/sessions/{sid}/{action}", {})
            assert status == 403 and "CSRF" in body
            status, _ = await operator.post(f"/ui/sessions/{sid}/{action}", {},
                                            csrf="x" * 43)
            assert status == 403
    assert f'action="/ui/sessions/{sid}/reset"' in op_page
    assert (await app.store.get(KEY)).id == sid  # nothing was reset


async def test_stop_stops_a_running_run(ui: Any) -> None:
    app, channel, log, url = ui
    await channel.say("first")
    await settle(app)
    sid = await sid_of(app)
    await channel.say("think hard")
    await log.wait_for("activity")
    assert app.dispatcher.running_count(KEY) == 1
    async with await client_as(url, "ada", "operator-pw") as client:
        _, page = await client.get(f"/ui/sessions/{sid}")
        assert "1 running" in page
        status, _ = await client.post(f"/ui/sessions/{sid}/stop", {}, csrf=csrf_of(page))
        assert status == 303
        await settle(app)
        assert "run.cancelled" in log.types()
        _, after = await client.get(f"/ui/sessions/{sid}?done=stopped")
        status, again = await client.post(f"/ui/sessions/{sid}/stop", {}, csrf=csrf_of(page),
                                          allow_redirects=True)
        _, audit = await client.get("/ui/audit")
    assert "Stopped." in after and "0 running" in after
    assert status == 200 and "Nothing is running." in again
    assert channel.replies[-1] != "too late"
    audit = await app.store.db.execute_fetchall(
        "SELECT user_name, action, target, detail FROM ui_audit WHERE action = 'stop'"
        " ORDER BY id")
    assert [tuple(r) for r in audit] == [("ada", "stop", f"session {sid}", f"{KEY}: stopped"),
                                         ("ada", "stop", f"session {sid}", f"{KEY}: idle")]


async def test_reset_and_compact_change_the_session(ui: Any) -> None:
    app, channel, _, url = ui
    for text in ("one", "two", "three"):
        await channel.say(text)
        await settle(app)
    sid = await sid_of(app)
    async with await client_as(url, "ada", "operator-pw") as client:
        _, page = await client.get(f"/ui/sessions/{sid}")
        status, body = await client.post(f"/ui/sessions/{sid}/compact", {},
                                          csrf=csrf_of(page), allow_redirects=True)
        assert status == 200 and "Compacted" in body
        session = await app.store.get(KEY)
        assert session.compactions == 1 and len(session.messages) == 2 and session.summary
        assert "Summary of the compacted history" in body and "compacted into the summary" in body
        status, body = await client.post(f"/ui/sessions/{sid}/reset", {}, csrf=csrf_of(page),
                                          allow_redirects=True)
        assert status == 200 and "Started a fresh conversation" in body
        fresh = await app.store.get(KEY)
        assert fresh.id != sid and fresh.messages == []
        assert f"/ui/sessions/{fresh.id}/" in body
        _, old = await client.get(f"/ui/sessions/{sid}")
        assert "Archived" in old and f'action="/ui/sessions/{sid}/reset"' not in old


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (900, 600), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


async def test_image_thumbnails_are_served_from_the_workspace_without_following_links(
        ui: Any, tmp_path: Path) -> None:
    app, _, _, url = ui
    workspace = app.settings.workspaces_dir / "test" / "u1"
    (workspace / "inbox").mkdir(parents=True)
    (workspace / "inbox" / "photo.png").write_bytes(_png())
    secret = tmp_path / "secret.png"
    secret.write_bytes(_png())
    (workspace / "inbox" / "link.png").symlink_to(secret)
    session = await app.store.get(KEY)

    def part(path: str, root: Path = workspace) -> ContentPart:
        return ContentPart("image", path, "image/png", 900, 600, 1000, str(root))

    await app.store.append_run(session, "r-img", [ChatMessage(
        "user", "look", sender_id="u1", parts=(
            part("inbox/photo.png"), part("inbox/link.png"), part("../../../secret.png"),
            part("secret.png", tmp_path)))])
    async with await client_as(url, "vic", "viewer-pw") as client:
        _, page = await client.get(f"/ui/sessions/{session.id}")
        (mid,) = re.findall(rf"/ui/sessions/{session.id}/files/(\d+)/0", page)[:1]
        response = await client.response("GET", f"/ui/sessions/{session.id}/files/{mid}/0")
        thumb = await client.session.get(f"{url}/ui/sessions/{session.id}/files/{mid}/0")
        body = await thumb.read()
        refused = [(await client.response(
            "GET", f"/ui/sessions/{session.id}/files/{mid}/{i}")).status for i in (1, 2, 3, 9)]
        other = await client.response("GET", f"/ui/sessions/{session.id + 1}/files/{mid}/0")
    assert response.status == 200 and response.headers["Content-Type"] == "image/png"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert max(Image.open(io.BytesIO(body)).size) == 320
    assert refused == [404, 404, 404, 404] and other.status == 404


async def test_postgres_serves_the_pages(make_app: AppFactory, pg_url: str) -> None:
    app, channel, _, = await make_app(scripted(*SCRIPT, loop=True), Failing(),
                                      database_url=pg_url)
    await add_account(app, "vic", "viewer-pw", "viewer")
    server = await serve_ui(app)
    await channel.say("please use a tool about invoices")
    await settle(app)
    (error,) = await app.services.errors.list()
    (run,) = await app.store.runs(KEY)
    async with await client_as(server.url, "vic", "viewer-pw") as client:
        pages = [await client.get(path) for path in (
            "/ui/sessions", "/ui/sessions?q=invoice", f"/ui/sessions/{await sid_of(app)}",
            f"/ui/runs/{run.run_id}", "/ui/errors?kind=permission_denied",
            f"/ui/errors/{error.id}")]
    assert [status for status, _ in pages] == [200] * 6
    assert "direct u1" in pages[0][1] and "<mark>invoices</mark>" in pages[1][1]
    assert "calls <strong>billing</strong>" in pages[2][1] and error.id in pages[4][1]


async def test_unknown_ids_answer_404(ui: Any) -> None:
    _, _, _, url = ui
    async with await client_as(url, "vic", "viewer-pw") as client:
        assert (await client.get("/ui/sessions/999"))[0] == 404
        assert (await client.get("/ui/sessions/abc"))[0] == 404
        assert (await client.get("/ui/sessions/1/events?after=x"))[0] == 400



async def test_stop_from_the_ui_of_one_replica_stops_the_run_on_the_other(
        pg_url: str, tmp_path: Path) -> None:
    made: list[tuple[Roost, ChatChannel, EventRecorder]] = []
    try:
        for name in ("a", "b"):
            app, log = await create_app(scripted({"reply": "too late", "delay": 30}),
                                        data_dir=tmp_path / name, database_url=pg_url)
            channel = ChatChannel("test", sender="u1")
            await channel.attach(app, log)
            made.append((app, channel, log))
        (a, chat_a, log_a), (b, _, _) = made
        await add_account(b, "ada", "operator-pw", "operator")
        server = await serve_ui(b)
        await chat_a.say("think hard")
        await log_a.wait_for("activity")
        assert a.dispatcher.running_count(KEY) == 1 and b.dispatcher.running_count(KEY) == 0
        sid = await sid_of(b)
        async with await client_as(server.url, "ada", "operator-pw") as client:
            _, page = await client.get(f"/ui/sessions/{sid}")
            assert "1 running" in page  # read from the shared inbox
            status, body = await client.post(f"/ui/sessions/{sid}/stop", {},
                                             csrf=csrf_of(page), allow_redirects=True)
        assert status == 200 and "Stopped." in body
        await log_a.wait_for("run.cancelled")
        await chat_a.settle()
        assert chat_a.replies == []
    finally:
        for app, _, _ in made:
            await app.close()
