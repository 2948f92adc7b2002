"""Reactions as receipts on Telegram, through the real aiogram against the fake Bot API:
the ack on a stored message, replaced by done or error when its run ends (Telegram's fixed
list: ✅ and ⚠️ fall back, an emoji with no fallback removes the ack), merged messages
each getting it, a stopped run's ack removed, a refused reaction never touching the reply,
and people's 👍/👎 on replies recorded as feedback that admins see in ``/status``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.testing.app import settle
from bot.testing.telegram import BOB, FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from bot.testing.telegram.wire import ALICE
from tests.test_approvals import Touch
from tests.test_approvals_telegram import MakeApp
from tests.test_approvals_telegram import make_app as _make_app  # noqa: F401  (the fixture)
from tests.test_receipts_platforms import HOLD, Gate


@pytest.fixture
def tg_app(make_app: MakeApp) -> MakeApp:
    """An app on the fake Telegram answering ``turns`` (the approvals tests' app)."""
    async def factory(*turns: dict[str, Any], **settings: Any) -> Roost:
        return await make_app(list(turns), Touch(), **settings)
    return factory


def reactions_on(fake: FakeTelegram, message_id: int, chat: int = ALICE["id"]) -> list[list[str]]:
    """The reactions the bot set on a message, call by call (``[]``: removed)."""
    return [[r["emoji"] for r in c.params.get("reaction") or []]
            for c in fake.sent("setMessageReaction")
            if c.params["chat_id"] == chat and int(c.params["message_id"]) == message_id]


def reply_id(fake: FakeTelegram, text: str, chat: int = ALICE["id"]) -> int:
    [mid] = [m for (c, m), sent in fake.messages.items() if c == chat and sent["text"] == text]
    return mid


async def said(fake: FakeTelegram, app: Roost, text: str,
               sender: dict[str, Any] = ALICE) -> int:
    """Send ``text`` privately as ``sender``, wait until it is answered; its message id."""
    update = fake.private_message(text, sender=sender)
    await fake.wait_confirmed(update["update_id"])
    await settle(app)
    return int(update["message"]["message_id"])


async def test_the_ack_is_replaced_by_done_and_votes_on_the_reply_reach_status(
        tg_app: MakeApp, fake_telegram: FakeTelegram) -> None:
    app = await tg_app({"reply": "the answer"}, ack_reaction="👀",
                         admins=[f"telegram:{ALICE['id']}"])
    mid = await said(fake_telegram, app, "hello")
    # ✅ is not on Telegram's list: its fallback replaces the ack.
    assert reactions_on(fake_telegram, mid) == [["👀"], ["👍"]]
    assert fake_telegram.interactions.reactions[(ALICE["id"], mid)] == ["👍"]
    reply = reply_id(fake_telegram, "the answer")
    # Someone's 👍 on the reply is a vote; one on their own message is not.
    for emoji, on in (("👍", reply), ("👎", mid)):
        update = fake_telegram.user_reaction(ALICE["id"], on, emoji)
        await fake_telegram.wait_confirmed(update["update_id"])
    bob = await said(fake_telegram, app, "/status", sender=BOB)
    assert bob and not any("Feedback" in t for t in fake_telegram.sent_texts(BOB["id"]))
    await said(fake_telegram, app, "/status")
    status = fake_telegram.sent_texts(ALICE["id"])[-1]
    assert "Feedback on replies: here 👍 1 👎 0; all chats 👍 1 👎 0" in status
    assert f"👍 Alice on run {await _run_of(app)}" in status
    # Taken back: the vote is withdrawn.
    update = fake_telegram.user_reaction(ALICE["id"], reply, None, old="👍")
    await fake_telegram.wait_confirmed(update["update_id"])
    await said(fake_telegram, app, "/status")
    assert "here 👍 0 👎 0" in fake_telegram.sent_texts(ALICE["id"])[-1]


async def _run_of(app: Roost) -> str:
    """The run that answered the first message."""
    async with app.store.lock, app.store.db.execute(
            "SELECT run_id FROM inbox WHERE kind = 'message' ORDER BY id LIMIT 1") as cur:
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def test_a_failed_run_gets_the_error_reaction_and_a_refused_ack_spares_the_reply(
        tg_app: MakeApp, fake_telegram: FakeTelegram) -> None:
    app = await tg_app({"error": "the model is down"}, ack_reaction="👀")
    fake_telegram.fail("setMessageReaction", 400, description="Bad Request: REACTION_INVALID")
    mid = await said(fake_telegram, app, "hello")
    [apology] = fake_telegram.sent_texts()
    assert apology == "Sorry, I couldn't answer that: the model is down"
    # The ack was refused; the error reaction (⚠️'s fallback) still replaced it.
    [refused, _] = [c for c in fake_telegram.calls_of("setMessageReaction")]
    assert (refused.status, refused.error) == (400, "Bad Request: REACTION_INVALID")
    assert fake_telegram.interactions.reactions[(ALICE["id"], mid)] == ["🤷"]


async def test_an_end_reaction_telegram_lacks_removes_the_ack(
        tg_app: MakeApp, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    app = await tg_app({"reply": "the answer"}, ack_reaction="👀", done_reaction="🦀")
    with caplog.at_level("DEBUG", logger="roost.dispatch.receipts"):
        mid = await said(fake_telegram, app, "hello")
    assert reactions_on(fake_telegram, mid) == [["👀"], []]
    assert (ALICE["id"], mid) not in fake_telegram.interactions.reactions
    assert [r.getMessage() for r in caplog.records] == [
        "telegram takes no '🦀' reaction; the ack is removed"]
    # Nothing Telegram would refuse was sent.
    assert all(c.status == 200 for c in fake_telegram.calls_of("setMessageReaction"))


async def test_merged_messages_each_get_the_end_reaction_and_a_stopped_run_loses_its_ack(
        make_app: MakeApp, fake_telegram: FakeTelegram) -> None:
    gate = Gate()
    app = await make_app([{"match": "^(first|again)$", **HOLD}, {"reply": "both"}], gate,
                         ack_reaction="👀", merge_window_ms=60_000)
    first = fake_telegram.private_message("first")
    await asyncio.wait_for(gate.entered.wait(), 5)
    # A follow-up while the run has shown nothing: the run restarts with both messages.
    second = fake_telegram.private_message("second")
    await fake_telegram.wait_confirmed(second["update_id"])
    gate.opened.set()
    await settle(app)
    for update in (first, second):
        assert reactions_on(fake_telegram, update["message"]["message_id"]) == [["👀"], ["👍"]]
    # Stopped: nothing answered it, so its ack goes.
    gate.entered.clear()
    gate.opened.clear()
    third = fake_telegram.private_message("again")
    await asyncio.wait_for(gate.entered.wait(), 5)
    await said(fake_telegram, app, "/stop")
    assert fake_telegram.sent_texts()[-1] == "Stopped."
    assert reactions_on(fake_telegram, third["message"]["message_id"]) == [["👀"], []]
