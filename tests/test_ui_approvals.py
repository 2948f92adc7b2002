"""The Control UI's approvals page over HTTP: the open questions live, Approve / Deny /
Approve for this session from the page (the UI user recorded as the decider, final like
a press), and the decided history in full; on one app and on two replicas.

A real app (``create_app``, a scripted model calling a tool that needs approval, the test
chat) serves its HealthServer on a free port and a real aiohttp client logs in.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.contracts.messages import OutboundMessage
from bot.storage.approvals import Asked
from bot.testing.app import ChatChannel, create_app, scripted
from bot.testing.ui import UiClient, clients_by_role, csrf_of, serve_ui
from bot.ui.queries.reads import PAGE_SIZE
from tests.test_approvals import APPROVE_TOUCH, Touch, touching
from tests.test_approvals_replicas import prompted
from tests.test_ui_ops_pages import audited

PASSWORD = "correct horse battery"
SCRIPT = "<script>alert('x')</script>"


@dataclass
class Side:
    """One app with its chat, its tool and logged-in clients by role."""

    app: Roost
    chat: ChatChannel
    touch: Touch
    clients: dict[str, UiClient]

    async def page(self, role: str, path: str = "/ui/approvals") -> str:
        status, body = await self.clients[role].get(path)
        assert status == 200, (path, status, body[:300])
        return body

    async def decide(self, role: str, ident: str, choice: str, *,
                     csrf: bool = True) -> tuple[int, str]:
        token = csrf_of(await self.page(role)) if csrf else None
        return await self.clients[role].post("/ui/approvals/decide",
                                             {"id": ident, "choice": choice}, csrf=token)


Start = Callable[..., Awaitable[Side]]


@pytest.fixture(name="start")
async def start_fixture(tmp_path: Path) -> AsyncIterator[Start]:
    apps: list[Roost] = []
    clients: list[UiClient] = []

    async def start(turns: list[dict[str, Any]], *, roles: tuple[str, ...] = ("admin",),
                    accounts: bool = True, **settings: Any) -> Side:
        touch = Touch()
        app, recorder = await create_app(scripted(*turns), touch,
                                         data_dir=tmp_path / f"data{len(apps)}",
                                         agents=APPROVE_TOUCH, **settings)
        apps.append(app)
        chat = ChatChannel()
        await chat.attach(app, recorder)
        await app.recover()
        server = await serve_ui(app)
        logged = await clients_by_role(app, server.url, roles, PASSWORD, add=accounts)
        clients.extend(logged.values())
        return Side(app, chat, touch, logged)

    yield start
    for client in clients:
        await client.session.close()
    for app in apps:
        await app.close()


def is_prompt(m: OutboundMessage) -> bool:
    return bool(m.buttons)


async def pending_id(side: Side) -> str:
    [row] = await side.app.approvals.store.pending()
    return row.id


async def test_an_admin_approves_from_the_page_and_a_second_decision_is_only_answered(
        start: Start) -> None:
    side = await start([touching(f"/srv/{SCRIPT}", "done")], roles=("admin", "viewer"))
    await side.chat.say("touch it")
    await side.chat.wait_for_message(is_prompt)
    ident = await pending_id(side)
    viewer = await side.page("viewer")
    assert ident in viewer and "/ui/approvals/decide" not in viewer  # no buttons
    assert SCRIPT not in viewer and "&lt;script&gt;" in viewer  # chat text is escaped
    admin = await side.page("admin")
    assert admin.count("/ui/approvals/decide") == 3
    status, _ = await side.decide("admin", ident, "a")
    assert status == 303
    await side.chat.settle()
    assert side.touch.ran == [f"/srv/{SCRIPT}"] and side.chat.replies[-1] == "done"
    # The chat's prompt shows who decided, as after a press.
    assert side.chat.edits[-1][1].startswith("Approved by admin (Control UI)")
    status, body = await side.decide("admin", ident, "d")
    assert status == 409 and "Already decided: Approved by admin (Control UI)" in body
    assert side.touch.ran == [f"/srv/{SCRIPT}"]
    history = await side.page("viewer")
    assert "No tool call is waiting" in history
    assert "Approved by admin (Control UI)" in history and "/srv/&lt;script&gt;" in history
    assert await audited(side.app) == [("admin", "approve tool call", ident)]


async def test_deny_and_approve_for_the_session_from_the_page(start: Start) -> None:
    side = await start([touching("one", "denied"), touching("two"), touching("three")])
    await side.chat.say("touch one")
    await side.chat.wait_for_message(is_prompt)
    assert (await side.decide("admin", await pending_id(side), "d"))[0] == 303
    await side.chat.settle()
    assert side.touch.ran == [] and side.chat.replies[-1] == "denied"
    await side.chat.say("touch two")
    await side.chat.wait_for_message(lambda m: is_prompt(m) and len(side.chat.sent) > 2)
    assert (await side.decide("admin", await pending_id(side), "s"))[0] == 303
    await side.chat.settle()
    await side.chat.ask("touch three")  # approved for the session: not asked again
    assert side.touch.ran == ["two", "three"]
    assert sum(is_prompt(m) for m in side.chat.sent) == 2


async def test_only_an_admin_decides_and_every_post_needs_the_csrf_token(
        start: Start) -> None:
    side = await start([touching()], roles=("admin", "operator", "viewer"))
    await side.chat.say("touch it")
    await side.chat.wait_for_message(is_prompt)
    ident = await pending_id(side)
    for role in ("viewer", "operator"):
        assert (await side.decide(role, ident, "a"))[0] == 403
    status, body = await side.decide("admin", ident, "a", csrf=False)
    assert status == 403 and "CSRF" in body
    for bad in ({"id": ident, "choice": "x"}, {"id": "", "choice": "a"}):
        token = csrf_of(await side.page("admin"))
        assert (await side.clients["admin"].post("/ui/approvals/decide", bad,
                                                 csrf=token))[0] == 400
    assert (await side.decide("admin", "0" * 20, "a"))[0] == 409
    assert [r.id for r in await side.app.approvals.store.pending()] == [ident]
    assert side.touch.ran == [] and await audited(side.app) == []
    status, body = await side.clients["viewer"].get("/ui/approvals?before=nope")
    assert status == 400 and "not a page cursor" in body


async def test_the_history_pages_back_by_its_cursor_without_gaps_or_repeats(
        start: Start) -> None:
    side = await start([], roles=("viewer",))
    store = side.app.approvals.store
    clock = [1_700_000_000.0]
    store.clock = lambda: clock[0]
    for n in range(PAGE_SIZE + 5):
        clock[0] += (n + 1) % 2  # pairs share a second (one pair across the page
        # boundary): the id breaks the tie
        await store.record(Asked(None, f"c{n}", "run", "k", 1, "test", "u1", "direct", None,
                                 "u1", "touch", {"path": f"/p/{n:03}"}), "denied", "boss")
    first = await side.page("viewer")
    older = re.search(r'href="/ui/approvals\?before=([^"]+)"', first)
    assert older is not None
    second = await side.page("viewer", f"/ui/approvals?before={older.group(1)}")
    assert "?before=" not in second.split('aria-label="Decided approvals pages"')[1]
    shown = re.findall(r"/p/(\d{3})", first) + re.findall(r"/p/(\d{3})", second)
    assert sorted(shown) == [f"{n:03}" for n in range(PAGE_SIZE + 5)]
    assert shown[0] == f"{PAGE_SIZE + 4:03}"  # newest first (alone in its second)


async def test_a_question_shows_up_on_the_open_page_live(start: Start) -> None:
    side = await start([touching("/live")])
    response = await side.clients["admin"].session.get(
        side.clients["admin"].base_url + "/ui/approvals/events")
    try:
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
        assert b"No tool call is waiting" in first
        await side.chat.say("touch it")
        event = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
        assert b"event: pending" in event and b"/live" in event
    finally:
        response.close()
    assert (await side.decide("admin", await pending_id(side), "d"))[0] == 303
    await side.chat.settle()


async def test_a_decision_on_the_other_replicas_page_resumes_the_run_once(
        start: Start, pg_url: str) -> None:
    sides = [await start([touching("r", "done")], database_url=pg_url),
             await start([touching("r", "done")], database_url=pg_url, accounts=False)]
    await sides[0].chat.say("touch it")
    runner, _ = await prompted([s.chat for s in sides])
    ran, other = sides[runner], sides[1 - runner]
    ident = await pending_id(other)
    assert ident in await other.page("admin")
    assert (await other.decide("admin", ident, "a"))[0] == 303
    await ran.chat.settle(30)
    assert ran.touch.ran == ["r"] and other.touch.ran == [] and ran.chat.replies[-1] == "done"
    assert "Approved by admin (Control UI)" in await ran.page("admin")
