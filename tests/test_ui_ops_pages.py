"""The Control UI's operations pages over HTTP: usage, access, outbox, jobs, plugins.

A real app (``create_app``, a scripted model) serves its HealthServer on a free port
of 127.0.0.1 and a real aiohttp client logs in as an admin, an operator or a viewer.
Each page shows what is stored; each action has its real effect (a code approved,
then that user's DM is answered; a refused reply retried, then delivered; a job run,
paused; a plugin disabled, its tool gone); a viewer's POST and a POST without the
CSRF token get 403; text that came from a chat is escaped. The reads run on
PostgreSQL too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.contracts.messages import OutboundMessage
from bot.storage.ui_accounts import UiAccountStore
from bot.testing.app import ChatChannel, create_app, scripted, settle
from bot.testing.postgres import PostgresCluster
from bot.testing.ui import UiClient, clients_by_role, csrf_of, serve_ui
from bot.ui.queries import access as access_queries
from tests import mcp_forks
from tests.test_scheduler import FakeClock

TOOLBOX = mcp_forks.SERVERS / "toolbox.py"
SCRIPT = "<script>alert('x')</script>"
IMG = "<img src=x onerror=alert(1)>"
PASSWORD = "correct horse battery"


class FlakyChat(ChatChannel):
    """The chat platform, refusing sends while ``down`` (a 502 from its API)."""

    def __init__(self) -> None:
        super().__init__("test", sender="u1")
        self.down = False

    async def send(self, message: OutboundMessage) -> None:
        if self.down:
            raise ConnectionError("platform unavailable: 502 Bad Gateway")
        await super().send(message)


@dataclass
class Ui:
    """An app with its chat, served, and a logged-in client per role."""

    app: Roost
    chat: FlakyChat
    clock: FakeClock
    clients: dict[str, UiClient]

    async def page(self, role: str, path: str) -> str:
        status, body = await self.clients[role].get(path)
        assert status == 200, (path, status, body[:300])
        return body

    async def act(self, role: str, path: str, form: dict[str, str], *,
                  page: str = "/ui/") -> tuple[int, str]:
        """POST ``form`` to ``path`` with the CSRF token of ``role``'s login."""
        csrf = csrf_of(await self.page(role, page))
        return await self.clients[role].post(path, form, csrf=csrf)


Start = Callable[..., Awaitable[Ui]]


@pytest.fixture(name="start")
async def start_fixture(tmp_path: Path) -> AsyncIterator[Start]:
    apps: list[Roost] = []
    clients: list[UiClient] = []

    async def start(*, accounts: bool = True, **settings: Any) -> Ui:
        """An app on ``settings``; ``accounts=False``: its database has them already
        (a second replica on one PostgreSQL)."""
        clock = FakeClock()
        settings.setdefault("memory_flush", False)
        settings.setdefault("admins", ["test:u1"])  # u1 may DM under the pairing policy
        app, recorder = await create_app(
            scripted({"reply": "answer: {message}"}, loop=True),
            data_dir=tmp_path / f"data{len(apps)}", clock=clock, stream_replies=False,
            **settings)
        apps.append(app)
        chat = FlakyChat()
        await chat.attach(app, recorder)
        await app.recover()  # as `roost run`: with replicas, claiming and sweeping start
        server = await serve_ui(app)
        logged = await clients_by_role(app, server.url, ("admin", "operator", "viewer"),
                                       PASSWORD, add=accounts)
        clients.extend(logged.values())
        return Ui(app, chat, clock, logged)

    yield start
    for client in clients:
        await client.session.close()
    for app in apps:
        await app.close()


async def committed(app: Roost) -> None:
    """Wait until every queued write is committed."""
    await app.store.writer.write(lambda db: asyncio.sleep(0))


async def until(check: Callable[[], Awaitable[bool]], limit: float = 5.0) -> None:
    """Wait until ``check()`` holds."""
    for _ in range(int(limit / 0.02)):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("it did not happen in time")


async def audited(app: Roost) -> list[tuple[str, str, str]]:
    """The audit log's actions, oldest first, logins left out: (who, what, target)."""
    store = UiAccountStore(app.store.db, app.store.lock, app.store.writer)
    return [(e.user_name, e.action, e.target) for e in reversed(await store.audit_page(None, 100))
            if not e.action.startswith("log ")]


def assert_escaped(page: str) -> None:
    """No markup that came from a chat is live in ``page``."""
    assert SCRIPT not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page or \
        "&lt;img src=x onerror=alert(1)&gt;" in page


async def seed(ui: Ui) -> str:
    """Chat-originated data on every page: a pairing request, a reply the platform
    refused, a cron job and usage, all carrying markup; returns the job's id."""
    app = ui.app
    access = app.services.access
    assert access is not None
    await access.refuse("test", IMG, "chat1", display_name=SCRIPT)
    ui.chat.down = True
    await ui.chat.say(f"echo {IMG}")
    await settle(app)
    scheduler = app.services.scheduler
    assert scheduler is not None
    view = await scheduler.add(owner_id="u1", channel="test", chat_id="u1",
                               chat_type="direct", thread_id=None, schedule="every 1h",
                               message=f"remind me {SCRIPT}", name=IMG)
    usage = app.services.usage
    assert usage is not None
    usage.record([("user", f"test:{SCRIPT}"), ("agent", "default"), ("model", IMG)],
                 1200, 300, 0.25, cache_read_tokens=600)
    await usage.flush()
    await committed(app)
    return view.job.id


# -- pages ----------------------------------------------------------------------------------


async def test_each_page_shows_what_is_stored_escaped_and_without_buttons_for_a_viewer(
        start: Start) -> None:
    ui = await start(dm_policy="pairing", admins=["test:boss", "test:u1"],
                     dm_allowlist=["test:friend"], budgets={"user_daily_tokens": 1000})
    job_id = await seed(ui)
    usage = await ui.page("viewer", "/ui/usage?days=7")
    assert_escaped(usage)
    assert "1,500" in usage and "50.0 %" in usage  # tokens; 600 of 1,200 read from the cache
    assert "&lt;img src=x onerror=alert(1)&gt;" in usage  # the model's row
    assert "<meter" in usage and "over" in usage  # 1,500 of the 1,000 daily tokens
    access = await ui.page("viewer", "/ui/access")
    assert_escaped(access)
    assert "test:friend" in access and "test:boss" in access
    assert "/ui/access/approve" not in access and "Revoke" not in access
    outbox = await ui.page("viewer", "/ui/outbox")
    assert_escaped(outbox)
    assert "502 Bad Gateway" in outbox and "/ui/outbox/retry" not in outbox
    jobs = await ui.page("viewer", "/ui/jobs")
    assert_escaped(jobs)
    assert job_id in jobs and "every 1h" in jobs and "/ui/jobs/run" not in jobs
    plugins = await ui.page("viewer", "/ui/plugins")
    assert "plugins.cron" in plugins and "roost_tools" in plugins
    assert "/ui/plugins/disable" not in plugins
    # The operator sees the buttons of its actions; plugins' stay the admin's.
    assert "/ui/access/approve" in await ui.page("operator", "/ui/access")
    assert "/ui/outbox/retry" in await ui.page("operator", "/ui/outbox")
    assert "/ui/jobs/run" in await ui.page("operator", "/ui/jobs")
    assert "/ui/plugins/disable" not in await ui.page("operator", "/ui/plugins")
    assert "/ui/plugins/disable" in await ui.page("admin", "/ui/plugins")
    # A cursor a page never handed out: one line, 400.
    for path in ("/ui/access?before=x", "/ui/outbox?before=1%20OR%201=1", "/ui/jobs?after=z"):
        status, body = await ui.clients["viewer"].get(path)
        assert status == 400 and "not a page cursor" in body


POSTS = ["/ui/access/approve", "/ui/access/deny", "/ui/access/revoke", "/ui/outbox/retry",
         "/ui/outbox/drop", "/ui/jobs/run", "/ui/jobs/pause", "/ui/jobs/resume",
         "/ui/jobs/delete", "/ui/plugins/enable", "/ui/plugins/disable",
         "/ui/plugins/mcp-test"]


async def test_a_viewers_post_and_a_post_without_csrf_get_403_and_change_nothing(
        start: Start) -> None:
    ui = await start(dm_policy="pairing")
    job_id = await seed(ui)
    access = ui.app.services.access
    assert access is not None
    (request,) = await access.pending()
    (reply,) = (await ui.app.inbox.undelivered())
    form = {"code": request.code, "user": request.user, "id": job_id, "name": "plugins.cron"}
    for path in POSTS:
        data = dict(form, id=str(reply.id)) if "outbox" in path else form
        status, body = await ui.act("viewer", path, data)
        assert status == 403, (path, status)
        status, body = await ui.clients["admin"].post(path, data)  # no CSRF token
        assert status == 403 and "CSRF" in body, (path, status)
    for path in ("/ui/plugins/enable", "/ui/plugins/disable", "/ui/plugins/mcp-test"):
        status, _ = await ui.act("operator", path, form)
        assert status == 403, path
    assert [r.code for r in await access.pending()] == [request.code]
    assert [r.id for r in await ui.app.inbox.undelivered()] == [reply.id]
    scheduler = ui.app.services.scheduler
    assert scheduler is not None
    job = await scheduler.store.get(job_id)
    assert job is not None and job.paused_at is None and job.last_fire is None
    assert "cron" in ui.app.plugins.now.tools


# -- actions --------------------------------------------------------------------------------


async def test_approving_a_code_lets_that_users_next_dm_be_answered_and_is_audited(
        start: Start) -> None:
    ui = await start(dm_policy="pairing")
    refusal = await ui.chat.ask("hello?", sender="carol")
    assert "pair" in refusal[-1].lower()
    page = await ui.page("operator", "/ui/access")
    access = ui.app.services.access
    assert access is not None
    (request,) = await access.pending()
    assert request.code in page
    status, _ = await ui.act("operator", "/ui/access/approve", {"code": request.code},
                             page="/ui/access")
    assert status == 303
    assert await ui.chat.ask("hello again", sender="carol") == ["answer: hello again"]
    page = await ui.page("operator", "/ui/access")
    assert "test:carol" in page and "ui:operator" in page
    assert await audited(ui.app) == [("operator", "approve pairing", "test:carol")]
    # Revoked from the page: refused again.
    status, _ = await ui.act("operator", "/ui/access/revoke", {"user": "test:carol"})
    assert status == 303
    assert "pair" in (await ui.chat.ask("still there?", sender="carol"))[-1].lower()
    status, body = await ui.act("operator", "/ui/access/approve", {"code": "NOPE2345"})
    assert status == 404 and "no pending request" in body


async def test_retry_now_delivers_a_refused_reply_and_drop_removes_one(start: Start) -> None:
    ui = await start()
    ui.chat.down = True
    await ui.chat.say("first")
    await ui.chat.say("second")
    await settle(ui.app)
    await committed(ui.app)
    first, second = sorted((await ui.app.inbox.undelivered()), key=lambda e: e.id)
    page = await ui.page("operator", "/ui/outbox")
    assert "answer: first" in page and "502 Bad Gateway" in page
    ui.chat.down = False
    status, _ = await ui.act("operator", "/ui/outbox/retry", {"id": str(first.id)})
    assert status == 303
    await ui.chat.wait_for_message()
    assert ui.chat.replies == ["answer: first"]
    status, _ = await ui.act("operator", "/ui/outbox/drop", {"id": str(second.id)})
    assert status == 303

    async def empty() -> bool:
        return not await ui.app.inbox.undelivered()

    await until(empty)
    page = await ui.page("operator", "/ui/outbox")
    assert "answer: first" not in page and "answer: second" not in page
    status, body = await ui.act("operator", "/ui/outbox/retry", {"id": str(second.id)})
    assert status == 409 and "delivered, dropped or is being sent" in body
    assert await audited(ui.app) == [("operator", "retry reply", str(first.id)),
                                     ("operator", "drop reply", str(second.id))]
    assert ui.chat.replies == ["answer: first"]  # the dropped reply never went out


async def test_run_now_runs_a_job_and_pause_stops_it_firing(start: Start) -> None:
    ui = await start()
    scheduler = ui.app.services.scheduler
    assert scheduler is not None
    view = await scheduler.add(owner_id="u1", channel="test", chat_id="u1", chat_type="direct",
                               thread_id=None, schedule="every 1h", message="water the plants")
    job_id = view.job.id
    status, _ = await ui.act("operator", "/ui/jobs/run", {"id": job_id})
    assert status == 303
    await scheduler.wait_idle()
    await settle(ui.app)
    assert ui.chat.replies == ["answer: water the plants"]
    page = await ui.page("viewer", "/ui/jobs")
    assert "(run now)" in page and "completed" in page
    status, _ = await ui.act("operator", "/ui/jobs/pause", {"id": job_id})
    assert status == 303
    assert "(paused)" in await ui.page("viewer", "/ui/jobs")
    ui.clock.advance(hours=3)
    assert await scheduler.run_due() == []
    assert ui.chat.replies == ["answer: water the plants"]
    status, _ = await ui.act("operator", "/ui/jobs/resume", {"id": job_id})
    assert status == 303
    ui.clock.advance(hours=1)
    assert len(await scheduler.run_due()) == 1
    await scheduler.wait_idle()
    await settle(ui.app)
    assert len(ui.chat.replies) == 2
    status, _ = await ui.act("operator", "/ui/jobs/delete", {"id": job_id})
    assert status == 303
    assert await scheduler.store.get(job_id) is None
    status, body = await ui.act("operator", "/ui/jobs/run", {"id": job_id})
    assert status == 409 and "no job" in body
    assert await audited(ui.app) == [("operator", f"{action} job", job_id)
                                     for action in ("run", "pause", "resume", "delete")]


async def test_disabling_a_plugin_removes_its_tool_and_an_mcp_server_is_tested(
        start: Start) -> None:
    ui = await start(mcp={"servers": {"toolbox": mcp_forks.stdio(TOOLBOX, startup="lazy")}})
    assert "cron" in ui.app.plugins.now.tools
    status, body = await ui.act("admin", "/ui/plugins/disable", {"name": "plugins.cron"})
    assert status == 200 and "plugins.cron is now disabled" in body
    assert "cron" not in ui.app.plugins.now.tools
    status, body = await ui.act("admin", "/ui/plugins/enable", {"name": "plugins.cron"})
    assert status == 200 and "cron" in ui.app.plugins.now.tools
    page = await ui.page("admin", "/ui/plugins")
    assert "toolbox" in page
    status, body = await ui.act("admin", "/ui/plugins/mcp-test", {"name": "toolbox"})
    assert status == 200 and "toolbox: connected" in body
    assert [a[1:] for a in await audited(ui.app)] == [
        ("disable plugin", "plugins.cron"), ("enable plugin", "plugins.cron"),
        ("test mcp server", "toolbox")]


# -- PostgreSQL -----------------------------------------------------------------------------


async def test_the_pages_read_postgresql(start: Start, postgres_cluster: PostgresCluster
                                         ) -> None:
    url = await postgres_cluster.create_database()
    ui = await start(database_url=url, dm_policy="pairing",
                     budgets={"user_daily_tokens": 1000})
    job_id = await seed(ui)
    await ui.chat.ask("hi there", sender="dave")
    assert "&lt;script&gt;" in await ui.page("viewer", "/ui/usage?days=30")
    access = await ui.page("viewer", "/ui/access")
    assert "test:dave" in access
    # Keyset pages on PostgreSQL: paired users newest first, jobs oldest first.
    store = ui.app.services.access
    assert store is not None
    for n in range(3):
        await store.refuse("test", f"p{n}", f"p{n}")
        (request,) = [r for r in await store.pending() if r.user_id == f"p{n}"]
        await store.approve(request.code, "cli")
    seen, cursor = [], None
    for _ in range(3):
        page = await access_queries.access_page(ui.app, before=cursor, limit=1)
        seen += [u.user_id for u in page.paired]
        cursor = page.next_cursor
    assert seen == ["p2", "p1", "p0"] and cursor is None
    assert "502 Bad Gateway" in await ui.page("viewer", "/ui/outbox")
    status, _ = await ui.act("operator", "/ui/jobs/run", {"id": job_id})
    assert status == 303
    scheduler = ui.app.services.scheduler
    assert scheduler is not None
    await scheduler.wait_idle()
    await settle(ui.app)
    assert "(run now)" in await ui.page("viewer", "/ui/jobs")
    status, _ = await ui.act("operator", "/ui/jobs/pause", {"id": job_id})
    assert status == 303 and "(paused)" in await ui.page("viewer", "/ui/jobs")
    # Retried on PostgreSQL: the replicas are woken and one of them sends it.
    (reply,) = await ui.app.inbox.undelivered()
    ui.chat.down = False
    status, _ = await ui.act("operator", "/ui/outbox/retry", {"id": str(reply.id)})
    assert status == 303
    sent = await ui.chat.wait_for_message(lambda m: "echo" in m.text)
    assert sent.text == f"answer: echo {IMG}"


async def test_a_retry_from_another_replica_is_sent_once(
        start: Start, postgres_cluster: PostgresCluster) -> None:
    url = await postgres_cluster.create_database()
    a = await start(database_url=url)
    b = await start(database_url=url, accounts=False)
    for ui in (a, b):
        ui.chat.down = True
    await a.chat.say("once only")
    for ui in (a, b):
        await settle(ui.app)
    await committed(a.app)
    await committed(b.app)

    async def refused() -> bool:
        return bool(await a.app.inbox.undelivered())

    await until(refused)
    (reply,) = await a.app.inbox.undelivered()
    # The replica that committed it stops taking work (its attempt in 5 s still waits).
    assert a.app.dispatcher.replicas is not None
    await a.app.dispatcher.replicas.halt()
    for ui in (a, b):
        ui.chat.down = False
    # Retried from the other replica's UI: that one is woken, takes it over and sends it.
    status, _ = await b.act("operator", "/ui/outbox/retry", {"id": str(reply.id)})
    assert status == 303
    await b.chat.wait_for_message(limit=15)
    # The attempt the committing replica had waiting wakes and finds the reply no longer
    # its own: it does not send a second copy.
    await asyncio.gather(*a.app.dispatcher.redeliveries.tasks, return_exceptions=True)
    assert [m.text for m in a.chat.sent + b.chat.sent] == ["answer: once only"]
    assert not await b.app.inbox.undelivered()
