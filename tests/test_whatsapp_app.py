"""The WhatsApp plugin inside a Roost app: started through its ``roost_channels`` hook
and its settings table, its webhook on Roost's own HTTP server, against the fake
Cloud API. What a WhatsApp user sees: typing then the reply, ``/stop``, pairing,
approvals by reply buttons, a reply outside the 24-hour window given up at once.
"""

from __future__ import annotations

import re
import socket
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp

from bot.app.roost import Roost
from bot.testing.app import EventRecorder, scripted, settle
from bot.testing.whatsapp import FakeWhatsApp
from bot.testing.whatsapp import fake_whatsapp as _fake_whatsapp  # noqa: F401  (the fixture)
from plugins.scripted_provider import ScriptedProvider
from tests.conftest import AppFactory

ALICE = "15551234567"
BOSS = "15559990000"
CODE = re.compile(r"\b([A-Z2-9]{8})\b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start(make_app: AppFactory, fake: FakeWhatsApp, provider: ScriptedProvider,
                **settings: Any) -> tuple[Roost, EventRecorder]:
    """An app serving HTTP with the WhatsApp channel started as ``roost run`` starts it."""
    port = free_port()
    fake.webhook_url = f"http://127.0.0.1:{port}/whatsapp/webhook"
    table = {"phone_number_id": fake.phone_number_id, "access_token": fake.token,
             "app_secret": fake.app_secret, "verify_token": fake.verify_token,
             "api_base": fake.base_url, "rate_limit_wait": 0.05, "pair_rate_limit_wait": 0.05}
    app, _, log = await make_app(provider, http_port=port, http_host="127.0.0.1",
                                 plugins={"plugins.whatsapp": table}, **settings)
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
