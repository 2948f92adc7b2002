"""Telegram delivery: every aiogram error mapped, rate limits honoured, no draft left frozen.

The real aiogram talks to the fake Bot API, which fails calls the ways real
Telegram does (see ``FakeTelegram.fail``).
"""

from __future__ import annotations

from typing import Any

import pytest
from aiogram.exceptions import (
    ClientDecodeError,
    RestartingTelegram,
    TelegramBadRequest,
    TelegramConflictError,
    TelegramEntityTooLarge,
    TelegramForbiddenError,
    TelegramMigrateToChat,
    TelegramNetworkError,
    TelegramNotFound,
    TelegramRetryAfter,
    TelegramServerError,
    TelegramUnauthorizedError,
)
from aiogram.methods import SendMessage

from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.testing.telegram import FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import TELEGRAM_LIMITS, DeliveryPolicy, Limits, RateLimited, Transient
from channels.telegram import ChatMigrated, translated
from tests.test_telegram_intake import Inbox, StartTg
from tests.test_telegram_intake import start_tg as _start_tg  # noqa: F401  (the fixture)

GROUP = -1001234567890


def reply(text: str, chat: int = 42, **kwargs: Any) -> OutboundMessage:
    return OutboundMessage(channel="telegram", chat_id=str(chat), text=text, **kwargs)


def inbound(chat: int = 42) -> InboundMessage:
    return InboundMessage(channel="telegram", chat_id=str(chat),
                          chat_type="direct" if chat > 0 else "group", sender_id="42",
                          text="hi", message_id="7")


# -- the mapping, one aiogram class at a time ----------------------------------------------

MAPPING: list[tuple[str, dict[str, Any], type[Exception], type[BaseException] | None]] = [
    ("retry-after", {"status": 429, "retry_after": 3}, RateLimited, TelegramRetryAfter),
    ("server-error", {"status": 500}, Transient, TelegramServerError),
    ("restarting", {"status": 500, "description": "Internal Server Error: restart"},
     Transient, RestartingTelegram),
    ("html-502-page", {"status": 502, "kind": "html"}, Transient, ClientDecodeError),
    ("html-504-page", {"status": 504, "kind": "html"}, Transient, ClientDecodeError),
    ("reset-before-the-call", {"kind": "reset_before"}, Transient, TelegramNetworkError),
    ("reset-after-the-call", {"kind": "reset_after"}, Transient, TelegramNetworkError),
    ("timeout", {"kind": "stall", "seconds": 3}, Transient, TelegramNetworkError),
    ("migrate-to-chat", {"status": 400, "migrate_to_chat_id": -100777}, ChatMigrated,
     TelegramMigrateToChat),
    ("bad-request", {"status": 400}, TelegramBadRequest, None),
    ("forbidden", {"status": 403}, TelegramForbiddenError, None),
    ("not-found", {"status": 404}, TelegramNotFound, None),
    ("unauthorized", {"status": 401}, TelegramUnauthorizedError, None),
    ("entity-too-large", {"status": 413}, TelegramEntityTooLarge, None),
    ("conflict", {"status": 409}, TelegramConflictError, None),
]


@pytest.mark.parametrize(("fault", "mapped", "cause"), [m[1:] for m in MAPPING],
                         ids=[m[0] for m in MAPPING])
async def test_each_aiogram_error_maps_to_retry_wait_follow_or_permanent(
        start_tg: StartTg, fake_telegram: FakeTelegram, fault: dict[str, Any],
        mapped: type[Exception], cause: type[BaseException] | None) -> None:
    tg = await start_tg(Inbox())
    assert tg.bot is not None
    fake_telegram.fail("sendMessage", **fault)
    with pytest.raises(mapped) as raised:
        await translated(tg.bot(SendMessage(chat_id=42, text="x"), request_timeout=1))
    if cause is None:
        # Permanent: aiogram's own exception, which nothing retries.
        assert not isinstance(raised.value, (Transient, RateLimited))
    else:
        assert type(raised.value.__cause__) is cause
    if isinstance(raised.value, RateLimited):
        assert raised.value.retry_after == 3


async def test_permanent_errors_are_not_retried(start_tg: StartTg,
                                                fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    fake_telegram.fail("sendMessage", 403)
    with pytest.raises(TelegramForbiddenError):
        await tg.send(reply("blocked"))
    assert len(fake_telegram.calls_of("sendMessage")) == 1


async def test_transient_errors_of_every_kind_are_retried_until_delivered_once(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox(), policy=DeliveryPolicy(attempts=5, base_delay=0.01,
                                                       max_delay=0.05))
    fake_telegram.fail("sendMessage", 502, kind="html")
    fake_telegram.fail("sendMessage", 500)
    fake_telegram.fail("sendMessage", kind="reset_before")
    fake_telegram.fail("sendMessage", 500, description="Internal Server Error: restart")
    sent = await tg.send(reply("made it"))
    assert fake_telegram.visible(42) == ["made it"]
    assert sent == str(fake_telegram.sent()[-1].result["message_id"])


async def test_a_final_reply_whose_answer_was_lost_is_sent_again_at_least_once(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    # With no message id known in the chat there is nothing to probe from: a duplicate
    # rather than a lost reply (test_telegram_outcomes: where an id is known).
    tg = await start_tg(Inbox())
    fake_telegram.fail("sendMessage", kind="reset_after")
    await tg.send(reply("twice rather than never"))
    assert fake_telegram.visible(42) == ["twice rather than never"] * 2


async def test_a_group_upgraded_to_a_supergroup_is_followed(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    fake_telegram.fail("sendMessage", 400, migrate_to_chat_id=-100777)
    await tg.send(reply("moved", chat=-4242))
    await tg.send(reply("and again", chat=-4242))
    assert fake_telegram.visible(-100777) == ["moved", "and again"]
    assert [c.params["chat_id"] for c in fake_telegram.calls_of("sendMessage")] == \
        [-4242, -100777, -100777]


# -- drafts and the final reply -----------------------------------------------------------------


async def test_a_final_reply_identical_to_the_draft_is_not_edited_again(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    stream = tg.open_stream(inbound())
    assert stream is not None
    await stream.push("All **done**")
    await stream.finish("All **done**")
    assert fake_telegram.calls_of("editMessageText") == []
    assert fake_telegram.visible(42) == ["All done"]
    assert stream.message_id == str(fake_telegram.sent()[0].result["message_id"])


async def test_message_not_modified_after_a_lost_answer_counts_as_success(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    draft = await tg.send(reply("Working"))
    assert draft is not None
    fake_telegram.fail("editMessageText", kind="reset_after")
    assert await tg.send(reply("Done", replace=draft)) == draft
    first, second = fake_telegram.calls_of("editMessageText")
    assert first.fault == "reset_after" and "not modified" in second.error
    assert fake_telegram.visible(42) == ["Done"]


async def test_a_draft_whose_final_edit_fails_for_good_is_replaced_and_deleted(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    draft = await tg.send(reply("Half an ans"))
    assert draft is not None
    fake_telegram.fail("editMessageText", 400,
                       description="Bad Request: message can't be edited")
    sent = await tg.send(reply("The whole answer", replace=draft))
    assert sent is not None and sent != draft
    assert fake_telegram.visible(42) == ["The whole answer"]
    assert (42, int(draft)) in fake_telegram.deleted


async def test_a_draft_edit_that_keeps_failing_transiently_is_not_left_frozen(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    draft = await tg.send(reply("Partial"))
    assert draft is not None
    fake_telegram.fail("editMessageText", 502, kind="html", times=3)  # every attempt
    await tg.send(reply("Complete", replace=draft))
    assert fake_telegram.visible(42) == ["Complete"]


async def test_a_withdrawn_draft_is_deleted_and_one_already_gone_is_fine(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    draft = await tg.send(reply("stale"))
    assert draft is not None
    await tg.withdraw("42", draft)
    await tg.withdraw("42", draft)  # "message to delete not found": nothing to do
    assert fake_telegram.visible(42) == []


async def test_a_long_reply_replacing_a_draft_returns_the_last_piece(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    draft = await tg.send(reply("Start"))
    assert draft is not None
    text = "\n\n".join(f"paragraph {i} " + "x" * 1500 for i in range(6))
    last = await tg.send(reply(text, replace=draft))
    shown = fake_telegram.visible(42)
    assert len(shown) == 3 and shown[0].startswith("paragraph 0")
    assert last == str(max(mid for (chat, mid) in fake_telegram.messages if chat == 42))


async def test_after_a_streamed_reply_the_stream_names_its_last_message(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox())
    stream = tg.open_stream(inbound())
    assert stream is not None
    await stream.push("Thinking")
    draft = stream.message_id
    await stream.finish("\n\n".join(f"part {i} " + "y" * 2500 for i in range(2)))
    assert draft is not None and stream.message_id != draft
    assert stream.message_id == str(max(mid for (chat, mid) in fake_telegram.messages
                                        if chat == 42))
    assert len(fake_telegram.visible(42)) == 2


# -- rate limits -----------------------------------------------------------------------------------


async def test_after_a_429_on_a_draft_the_final_reply_waits_the_window_out(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox(), edit_interval=0.01)
    stream = tg.open_stream(inbound())
    assert stream is not None
    await stream.push("Working")
    fake_telegram.fail("editMessageText", 429, retry_after=1)
    await stream.push("Working on it")
    await fake_telegram.wait_for("editMessageText", ok=False)
    await stream.push("Working on it, nearly")  # inside the window: coalesced, not sent
    await stream.finish("Done")
    assert fake_telegram.violations == []
    assert fake_telegram.visible(42) == ["Done"]
    statuses = [c.status for c in fake_telegram.calls_of("editMessageText")]
    assert statuses == [429, 200]


async def test_no_call_of_any_method_goes_to_a_chat_inside_its_429_window(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox(), typing_interval=0.01)
    fake_telegram.fail("sendMessage", 429, retry_after=1)
    async with tg.typing(inbound()):
        await tg.send(reply("after the wait"))
        await tg.send(reply("and another"))
    assert fake_telegram.violations == []
    assert fake_telegram.visible(42) == ["after the wait", "and another"]
    assert fake_telegram.calls_of("sendMessage")[0].status == 429


async def test_a_429_in_one_chat_does_not_hold_another(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox(), policy=DeliveryPolicy(attempts=1))
    fake_telegram.fail("sendMessage", 429, retry_after=30)
    with pytest.raises(RateLimited):
        await tg.send(reply("held", chat=43))
    await tg.send(reply("free", chat=42))
    assert fake_telegram.visible(42) == ["free"]
    assert fake_telegram.violations == []


async def test_the_proactive_budget_can_be_turned_off_while_429_windows_still_hold(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox(), settings={"telegram_rate_limits": False},
                        limits=TELEGRAM_LIMITS)
    assert tg.limiter.limits == Limits()
    for n in range(5):  # over the 3-per-3-seconds budget of one chat: none held back
        await tg.send(reply(f"reply {n}"))
    fake_telegram.fail("sendMessage", 429, retry_after=1)
    await tg.send(reply("after the window"))
    assert fake_telegram.violations == []
    assert fake_telegram.visible(42)[-1] == "after the window"


# -- when a streamed reply's first draft is shown ----------------------------------------------


async def test_a_short_reply_streamed_at_once_is_one_send_message_with_no_draft(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox(), draft_after=60.0)
    stream = tg.open_stream(inbound())
    assert stream is not None
    for text in ("Sure", "Sure, **do", "Sure, **done**."):
        await stream.push(text)
    assert stream.message_id is None and fake_telegram.sent() == []
    await stream.finish("Sure, **done**.")
    [sent] = fake_telegram.sent()
    assert sent.params["text"] == "Sure, <b>done</b>."
    assert fake_telegram.calls_of("editMessageText") == []
    assert stream.message_id == str(sent.result["message_id"])


async def test_the_first_draft_is_shown_once_the_text_is_long_enough(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox(), draft_after=60.0, draft_chars=40)
    stream = tg.open_stream(inbound())
    assert stream is not None
    await stream.push("A long answer")
    assert fake_telegram.sent() == []
    await stream.push("A long answer, long enough for a draft now")
    [draft] = fake_telegram.sent()
    assert stream.message_id == str(draft.result["message_id"])
    await stream.finish("A long answer, long enough for a draft now")
    assert fake_telegram.calls_of("editMessageText") == []  # the final text is shown already


async def test_the_first_draft_is_shown_by_a_push_after_the_wait(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("channels.telegram.drafts._now", lambda: clock[0])
    tg = await start_tg(Inbox(), draft_after=1.0)
    stream = tg.open_stream(inbound())
    assert stream is not None
    await stream.push("Let me")
    clock[0] += 0.5
    await stream.push("Let me look")
    assert fake_telegram.sent() == []
    clock[0] += 0.5
    await stream.push("Let me look that up")
    [draft] = fake_telegram.sent()
    assert draft.params["text"] == "Let me look that up"
    await stream.finish("Let me look that up: found it.")
    [edit] = fake_telegram.calls_of("editMessageText")
    assert edit.params["text"] == "Let me look that up: found it."
    assert fake_telegram.visible(42) == ["Let me look that up: found it."]
