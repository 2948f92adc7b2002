"""The WhatsApp plugin inside a Roost app: started through its ``roost_channels`` hook
and its settings table, its webhook on Roost's own HTTP server, against the fake
Cloud API. What a WhatsApp user sees: typing then the reply, ``/stop``, pairing,
approvals by reply buttons, a reply outside the 24-hour window given up at once.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp

from bot.app.roost import Roost
from bot.testing.app import EventRecorder, create_app, scripted, settle
from bot.testing.whatsapp import FakeWhatsApp
from bot.testing.whatsapp import fake_whatsapp as _fake_whatsapp  # noqa: F401  (the fixture)
from plugins.scripted_provider import ScriptedProvider
from roost import workspace_dir
from tests.conftest import AppFactory
from tests.media_samples import png
from tests.test_approvals import APPROVE_TOUCH, Touch, touching
from tests.test_durability import crash

ALICE = "15551234567"
BOSS = "15559990000"
CODE = re.compile(r"\b([A-Z2-9]{8})\b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(fake: FakeWhatsApp) -> dict[str, Any]:
    """The plugin's settings table for a channel talking to ``fake``."""
    return {"phone_number_id": fake.phone_number_id, "access_token": fake.token,
            "app_secret": fake.app_secret, "verify_token": fake.verify_token,
            "api_base": fake.base_url, "rate_limit_wait": 0.05, "pair_rate_limit_wait": 0.05}


async def start(make_app: AppFactory, fake: FakeWhatsApp, provider: ScriptedProvider,
                *plugins: object, **settings: Any) -> tuple[Roost, EventRecorder]:
    """An app serving HTTP with the WhatsApp channel started as ``roost run`` starts it."""
    port = free_port()
    fake.webhook_url = f"http://127.0.0.1:{port}/whatsapp/webhook"
    app, _, log = await make_app(provider, *plugins, http_port=port, http_host="127.0.0.1",
                                 plugins={"plugins.whatsapp": table(fake)}, **settings)
    await app.serve_http()
    assert "whatsapp" in app.configured_channels()
    await app.start_channel("whatsapp")
    return app, log


async def said(app: Roost, fake: FakeWhatsApp, text: str, sender: str = ALICE,
               replies: int = 1) -> list[str]:
    """``sender`` writes ``text``; the next ``replies`` texts they got."""
    before = len(fake.visible(sender))
    assert await fake.deliver(fake.text(sender, text)) == 200
    await fake.wait_until(lambda: len(fake.visible(sender)) >= before + replies)
    await settle(app)
    return fake.visible(sender)[before:]


async def test_a_dm_is_answered_after_the_typing_indicator_and_readyz_counts_the_channel(
        make_app: AppFactory, fake_whatsapp: FakeWhatsApp) -> None:
    app, _ = await start(make_app, fake_whatsapp, scripted({"reply": "Hi **there**"}))
    assert await said(app, fake_whatsapp, "hello") == ["Hi *there*"]
    read, reply = [c for c in fake_whatsapp.calls if c.method == "POST"]
    assert read.body["typing_indicator"] == {"type": "text"}
    assert reply.body["type"] == "text"
    assert app.http is not None
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{app.http.port}"
        async with http.get(f"{base}/metrics") as metrics:
            assert 'roost_deliveries_total{channel="whatsapp",outcome="ok"} 1.0' \
                in await metrics.text()
        async with http.get(f"{base}/readyz") as ready:
            assert ready.status == 200
        await app.channels["whatsapp"].stop_intake()
        async with http.get(f"{base}/readyz") as ready:
            assert ready.status == 503 and "whatsapp" in await ready.text()
        assert await fake_whatsapp.post(fake_whatsapp.text(ALICE, "late")) == 503


async def test_stop_cancels_a_slow_run(make_app: AppFactory,
                                       fake_whatsapp: FakeWhatsApp) -> None:
    provider = scripted({"match": "^think$", "reply": "too late", "delay": 30},
                        {"reply": "unused"})
    app, log = await start(make_app, fake_whatsapp, provider)
    assert await fake_whatsapp.deliver(fake_whatsapp.text(ALICE, "think")) == 200
    await log.wait_for("activity")
    assert await said(app, fake_whatsapp, "/stop") == ["Stopped."]
    assert "run.cancelled" in log.types()
    assert fake_whatsapp.visible(ALICE) == ["Stopped."]


async def test_a_stranger_gets_a_pairing_code_and_is_answered_once_approved(
        make_app: AppFactory, fake_whatsapp: FakeWhatsApp) -> None:
    app, _ = await start(make_app, fake_whatsapp, scripted({"reply": "welcome"}, loop=True),
                         dm_policy="pairing", admins=[f"whatsapp:{BOSS}"])
    (offer,) = await said(app, fake_whatsapp, "hello?")
    found = CODE.search(offer)
    assert found is not None, offer
    (approved,) = await said(app, fake_whatsapp, f"/pair approve {found.group(1)}", BOSS)
    assert ALICE in approved or "approved" in approved.lower(), approved
    assert await said(app, fake_whatsapp, "now?") == ["welcome"]


async def test_a_reply_that_whatsapp_refuses_outside_the_window_is_given_up_at_once(
        make_app: AppFactory, fake_whatsapp: FakeWhatsApp, tmp_path: Path) -> None:
    provider = scripted({"reply": "a day late"})
    app, log = await start(make_app, fake_whatsapp, provider)
    fake_whatsapp.fail("131047")
    assert await fake_whatsapp.deliver(fake_whatsapp.text(ALICE, "remind me")) == 200
    await log.wait_for("run.completed")
    await settle(app)
    await app.close()
    db = sqlite3.connect(tmp_path / "data" / "roost.db")
    try:
        state, attempts, error = db.execute(
            "SELECT state, attempts, last_error FROM outbox").fetchone()
    finally:
        db.close()
    assert (state, attempts) == ("failed", 1)
    assert "24-hour window" in error
    assert fake_whatsapp.sent == []


async def test_replicas_on_postgresql_each_take_webhooks_and_answer_each_message_once(
        pg_url: str, tmp_path: Path, fake_whatsapp: FakeWhatsApp) -> None:
    fake = fake_whatsapp
    apps: list[Roost] = []
    urls: list[str] = []
    try:
        for name in ("a", "b"):
            port = free_port()
            app, _ = await create_app(
                scripted({"reply": "echo: {message}"}, loop=True), data_dir=tmp_path / name,
                database_url=pg_url, http_port=port, http_host="127.0.0.1",
                plugins={"plugins.whatsapp": table(fake)})
            apps.append(app)
            await app.serve_http()
            await app.start_channel("whatsapp")
            await app.recover()
            urls.append(f"http://127.0.0.1:{port}/whatsapp/webhook")
        first = fake.text(ALICE, "one")
        for url, payload in ((urls[0], first), (urls[1], first),
                             (urls[1], fake.text(ALICE, "two"))):
            fake.webhook_url = url
            assert await fake.deliver(payload) == 200
        await fake.wait_until(lambda: len(fake.visible(ALICE)) >= 2)
        for app in apps:
            await settle(app, 30)
        # The window noted by one replica is the other's too.
        noted = [await app.channels["whatsapp"].state.get(f"inbound:{ALICE}") for app in apps]
        assert noted[0] is not None and noted[0] == noted[1]
    finally:
        for app in apps:
            await app.close()
    assert sorted(fake.visible(ALICE)) == ["echo: one", "echo: two"]


async def test_an_approval_is_asked_with_reply_buttons_and_decided_by_a_press(
        make_app: AppFactory, fake_whatsapp: FakeWhatsApp) -> None:
    fake = fake_whatsapp
    touch = Touch()
    app, _ = await start(make_app, fake, scripted(touching("/srv/s", "done")), touch,
                         agents=APPROVE_TOUCH)
    assert await fake.deliver(fake.text(ALICE, "touch it")) == 200
    await fake.wait_until(lambda: any(s.type == "interactive" for s in fake.sent))
    (prompt,) = [s for s in fake.sent if s.type == "interactive"]
    buttons = {b["reply"]["title"]: b["reply"]["id"]
               for b in prompt.payload["interactive"]["action"]["buttons"]}
    assert list(buttons) == ["Approve", "Deny", "Approve for this se…"]
    assert "/srv/s" in prompt.text and touch.ran == []
    assert await fake.deliver(fake.press(ALICE, prompt.wamid, buttons["Approve"])) == 200
    await fake.wait_until(lambda: "done" in fake.visible(ALICE))
    await settle(app)
    assert touch.ran == ["/srv/s"]
    assert "Approved." in fake.visible(ALICE)


async def test_a_photo_reaches_the_model_through_the_media_lookup(
        make_app: AppFactory, fake_whatsapp: FakeWhatsApp) -> None:
    fake = fake_whatsapp
    provider = scripted({"reply": "a red square"})
    app, _ = await start(make_app, fake, provider)
    assert await fake.deliver(fake.media(ALICE, "image", png(64, 64), "image/png",
                                         caption="what is it?")) == 200
    await fake.wait_until(lambda: fake.visible(ALICE) == ["a red square"])
    await settle(app)
    content = str(provider.requests[-1].messages[-1].content)
    # Downloaded, stored and measured: the size is the bytes', not a declared one.
    assert content.startswith("what is it?") and "64×64" in content, content
    assert [c.path for c in fake.calls if c.method == "GET"][-2:] == [
        next(iter(fake.media_store)), "download"]


async def test_a_reply_held_up_past_the_window_by_a_crash_is_given_up_at_its_redelivery(
        make_app: AppFactory, fake_whatsapp: FakeWhatsApp, tmp_path: Path) -> None:
    fake = fake_whatsapp
    first, _ = await start(make_app, fake, scripted({"reply": "your reminder"}))
    fake.fail("hold")  # WhatsApp takes the request and never applies it
    assert await fake.deliver(fake.text(ALICE, "remind me")) == 200
    await fake.wait_until(lambda: bool(fake.held))
    await crash(first)
    # Back a day later: Alice's window closed meanwhile.
    again, _ = await start(make_app, fake, scripted({"reply": "unused"}))
    await again.channels["whatsapp"].state.put(f"inbound:{ALICE}",
                                               repr(time.time() - 25 * 3600))
    await again.recover()
    await settle(again)
    await asyncio.gather(*again.dispatcher.redeliveries.tasks)
    await again.store.writer.close()
    async with again.store.db.execute("SELECT state, last_error FROM outbox") as cursor:
        ((state, error),) = list(await cursor.fetchall())
    assert state == "failed" and "24-hour window" in error
    assert fake.sent == []


async def test_send_file_uploads_the_workspace_file_then_sends_it_by_media_id(
        make_app: AppFactory, fake_whatsapp: FakeWhatsApp) -> None:
    fake = fake_whatsapp
    app, _ = await start(make_app, fake, scripted({"steps": [
        {"tool_calls": [{"name": "send_file",
                         "arguments": {"path": "chart.png", "caption": "Here it is"}}]},
        {"reply": "done"}]}))
    workspace = workspace_dir(app.settings.workspaces_dir, "whatsapp", ALICE)
    workspace.mkdir(parents=True, exist_ok=True)
    data = png(400, 300)
    (workspace / "chart.png").write_bytes(data)
    assert await fake.deliver(fake.text(ALICE, "send me the chart")) == 200
    await fake.wait_until(lambda: "done" in fake.visible(ALICE))
    await settle(app)
    (image,) = [s for s in fake.sent if s.type == "image"]
    assert image.payload["image"]["caption"] == "Here it is"
    assert fake.media_store[image.payload["image"]["id"]].data == data
