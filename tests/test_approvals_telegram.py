"""Approvals on Telegram, through the real aiogram against the fake Bot API: the prompt is
an inline keyboard, presses are callback queries answered with ``answerCallbackQuery``,
and the prompt is edited (keyboard removed) to show the outcome."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.testing.app import closing_apps, create_app, scripted, settle, without_summary
from bot.testing.telegram import BOB, FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from bot.testing.telegram.wire import ALICE
from channels.delivery import DeliveryPolicy, Limits
from channels.telegram import TelegramChannel
from tests.test_approvals import APPROVE_TOUCH, Touch, touching

GROUP = -1001234567890
MakeApp = Callable[..., Awaitable[Roost]]


@pytest.fixture(name="make_app")
async def make_app(tmp_path: Path, fake_telegram: FakeTelegram) -> AsyncIterator[MakeApp]:
    async with closing_apps() as apps:

        async def factory(turns: list[dict[str, Any]], touch: Touch, **settings: Any) -> Roost:
            app, _ = await create_app(
                scripted(*turns), touch, data_dir=tmp_path / "data", agents=APPROVE_TOUCH,
                stream_replies=False, telegram_bot_token=fake_telegram.token,
                telegram_api_base=fake_telegram.base_url, **settings)
            apps.append(app)
            await app.add_channel(TelegramChannel(
                app.settings, polling_timeout=1, limits=Limits(), draft_after=0,
                policy=DeliveryPolicy(attempts=3, base_delay=0.05, max_delay=0.1)))
            return app

        yield factory


async def prompt_of(fake: FakeTelegram) -> tuple[int, dict[str, str]]:
    """The approval prompt's message id and its buttons' data by label, once sent."""
    while True:
        for call in fake.sent("sendMessage"):
            if "reply_markup" in call.params:
                keyboard = call.params["reply_markup"]["inline_keyboard"]
                data = {b["text"]: b["callback_data"] for row in keyboard for b in row}
                [(key, _)] = [(k, m) for k, m in fake.messages.items()
                              if m.get("reply_markup") == call.params["reply_markup"]]
                return key[1], data
        await fake.wait_for("sendMessage", len(fake.sent("sendMessage")) + 1)


async def answer_of(fake: FakeTelegram, update: dict[str, Any]) -> str | None:
    """The text the press of ``update`` was answered with."""
    qid = update["callback_query"]["id"]
    await fake.wait_confirmed(update["update_id"])
    while not fake.interactions.queries[qid].answered:
        await fake.wait_for("answerCallbackQuery",
                            len(fake.calls_of("answerCallbackQuery")) + 1, ok=False)
    return fake.interactions.queries[qid].text


async def test_a_press_from_the_requester_approves_and_the_prompt_shows_it(
        make_app: MakeApp, fake_telegram: FakeTelegram) -> None:
    touch = Touch()
    app = await make_app([touching("/srv/x", "done")], touch)
    fake_telegram.private_message("touch it")
    mid, data = await prompt_of(fake_telegram)
    assert "/srv/x" in fake_telegram.messages[(ALICE["id"], mid)]["text"]
    assert list(data) == ["Approve", "Deny", "Approve for this session"]
    assert touch.ran == []
    press = fake_telegram.interactions.press(mid, data["Approve"])
    assert await answer_of(fake_telegram, press) == "Approved."
    await settle(app)
    assert touch.ran == ["/srv/x"]
    edited = fake_telegram.messages[(ALICE["id"], mid)]
    assert edited["text"].startswith("Approved by Alice") and "reply_markup" not in edited
    assert fake_telegram.sent("sendMessage")[-1].params["text"] == "done"


async def test_in_a_group_someone_else_is_refused_and_a_second_press_only_answered(
        make_app: MakeApp, fake_telegram: FakeTelegram) -> None:
    touch = Touch()
    app = await make_app([touching()], touch)
    fake_telegram.mention("touch it")
    mid, data = await prompt_of(fake_telegram)
    bob = fake_telegram.interactions.press(mid, data["Approve"], chat_id=GROUP, sender=BOB)
    assert await answer_of(fake_telegram, bob) == "Not yours to approve."
    assert touch.ran == [] and "reply_markup" in fake_telegram.messages[(GROUP, mid)]
    deny = fake_telegram.interactions.press(mid, data["Deny"], chat_id=GROUP)
    assert await answer_of(fake_telegram, deny) == "Denied."
    again = fake_telegram.interactions.press(mid, data["Approve"], chat_id=GROUP)
    assert await answer_of(fake_telegram, again) == "Already decided: Denied by Alice."
    await settle(app)
    assert touch.ran == []
    assert fake_telegram.messages[(GROUP, mid)]["text"].startswith("Denied by Alice")


async def test_no_answer_in_time_gives_the_model_approval_denied(
        make_app: MakeApp, fake_telegram: FakeTelegram) -> None:
    touch = Touch()
    provider_turns = [touching(reply="nobody answered")]
    app = await make_app(provider_turns, touch, approval_timeout=0.3)
    fake_telegram.private_message("touch it")
    mid, _ = await prompt_of(fake_telegram)
    await settle(app)
    assert touch.ran == []
    request = app.provider.requests[-1]  # type: ignore[attr-defined]
    tool = next(m for m in request.messages if m.role == "tool")
    error = json.loads(without_summary(tool.content))
    assert (error["error_code"], error["outcome"]) == ("APPROVAL_DENIED", "timeout")
    assert fake_telegram.messages[(ALICE["id"], mid)]["text"].startswith(
        "Denied (no answer in time)")
    assert fake_telegram.sent("sendMessage")[-1].params["text"] == "nobody answered"


async def test_a_press_answered_after_the_query_expired_still_decides(
        make_app: MakeApp, fake_telegram: FakeTelegram) -> None:
    from bot.testing.telegram.interactions import QUERY_TOO_OLD

    touch = Touch()
    app = await make_app([touching("/srv/late", "done")], touch)
    fake_telegram.private_message("touch it")
    mid, data = await prompt_of(fake_telegram)
    fake_telegram.interactions.answer_within = 0.0  # the answer comes too late
    press = fake_telegram.interactions.press(mid, data["Approve"])
    await fake_telegram.wait_confirmed(press["update_id"])
    await settle(app)
    [answer] = fake_telegram.calls_of("answerCallbackQuery")
    assert (answer.status, answer.error) == (400, QUERY_TOO_OLD)
    assert touch.ran == ["/srv/late"]  # the decision stands: the query only timed out
    assert fake_telegram.messages[(ALICE["id"], mid)]["text"].startswith("Approved by Alice")
    assert fake_telegram.sent("sendMessage")[-1].params["text"] == "done"
