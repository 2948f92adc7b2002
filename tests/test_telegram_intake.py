"""Telegram intake: an update is acknowledged only once the core's handler took it.

The channel runs against the fake Bot API with a handler of the test's own
(standing in for the core's inbox), so a handler that fails can be scripted.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiogram.client.session.aiohttp import AiohttpSession

from bot.config.settings import Settings, SetupError
from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.testing.telegram import Call, FakeTelegram, RawJson
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy, Limits
from channels.telegram import TelegramChannel

FAST = DeliveryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
NESTING = 100_000
"""Deep enough that json.loads raises RecursionError on the whole getUpdates answer."""


class Inbox:
    """The handler: records messages; fails the next ``failures`` calls, as an inbox
    whose database is briefly unavailable would."""

    def __init__(self, failures: int = 0) -> None:
        self.messages: list[InboundMessage] = []
        self.failures = failures
        self.refused = 0

    async def __call__(self, message: InboundMessage) -> None:
        if self.failures:
            self.failures -= 1
            self.refused += 1
            raise RuntimeError("the inbox is not available")
        self.messages.append(message)

    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


StartTg = Callable[..., Awaitable[TelegramChannel]]


@pytest.fixture(name="start_tg")
async def start_tg(tmp_path: Path, fake_telegram: FakeTelegram) -> AsyncIterator[StartTg]:
    """``start_tg(handler, settings..., **channel_options)``: a started channel."""
    started: list[TelegramChannel] = []

    async def factory(handler: Callable[[InboundMessage], Awaitable[None]], *,
                      settings: dict[str, Any] | None = None,
                      **options: Any) -> TelegramChannel:
        config = Settings(data_dir=tmp_path, telegram_bot_token=fake_telegram.token,
                          telegram_api_base=fake_telegram.base_url, **(settings or {}))
        # No proactive budget unless a test asks for one (limits=TELEGRAM_LIMITS): most
        # are not about it and would wait it out; 429 windows still hold.
        # Drafts at the first push: the tests of drafts need one (test_telegram_delivery
        # tests when the first one is shown by default).
        options = {"polling_timeout": 1, "policy": FAST, "poll_backoff": 0.01,
                   "limits": Limits(), "draft_after": 0, **options}
        channel = TelegramChannel(config, **options)
        await channel.start(handler)
        started.append(channel)
        return channel

    yield factory
    for channel in started:
        await channel.stop()


def telegram_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "roost.channels.telegram" and r.levelno >= logging.WARNING]


# -- polling -----------------------------------------------------------------------------


async def test_messages_reach_the_handler_in_order_with_their_update_id(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = Inbox()
    first = fake_telegram.private_message("one")
    second = fake_telegram.private_message("two")
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(second["update_id"])
    assert inbox.texts() == ["one", "two"]
    assert [m.event_id for m in inbox.messages] == [str(first["update_id"]),
                                                    str(second["update_id"])]


async def test_an_update_the_handler_refused_is_not_confirmed_and_comes_again_in_order(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    inbox = Inbox(failures=1)
    first = fake_telegram.private_message("one")
    second = fake_telegram.private_message("two")
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(second["update_id"])
    assert inbox.refused == 1
    assert inbox.texts() == ["one", "two"]  # "two" waited for "one"
    offsets = [int(c.params.get("offset") or 0) for c in fake_telegram.calls_of("getUpdates")]
    # The poll after the refusal asked from the same place: nothing was confirmed.
    assert offsets[0] == offsets[1] == 0
    assert offsets[2] == second["update_id"] + 1
    [warning] = telegram_warnings(caplog)
    assert f"update {first['update_id']} was not taken" in warning.getMessage()


async def test_malformed_and_absurdly_nested_updates_are_skipped_with_one_warning_each(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    inbox = Inbox()
    first = fake_telegram.private_message("before")
    broken = fake_telegram.push_raw({"update_id": first["update_id"] + 1,
                                     "message": {"text": "no chat, no id, no date"}})
    nested = broken + 1
    fake_telegram.push_json(
        f'{{"update_id": {nested}, "message": {{"text": "deep", "x": '
        f'{"[" * NESTING}{"]" * NESTING}}}}}', nested)
    last = fake_telegram.private_message("after")
    tg = await start_tg(inbox)
    await fake_telegram.wait_confirmed(last["update_id"])
    assert inbox.texts() == ["before", "after"]
    warnings = telegram_warnings(caplog)
    assert len(warnings) == 2
    assert f"update {broken} is malformed" in warnings[0].getMessage()
    assert f"update {nested} is not decodable" in warnings[1].getMessage()
    assert all(w.exc_info is None for w in warnings)  # one line each, no traceback
    # Polling goes on, and the bad updates are not served again.
    later = fake_telegram.private_message("still listening")
    await fake_telegram.wait_confirmed(later["update_id"])
    assert inbox.texts()[-1] == "still listening"
    assert fake_telegram.pending_updates == 0
    assert tg.polling is not None and not tg.polling.done()


async def test_a_bad_update_served_again_after_a_refusal_is_warned_about_once(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    inbox = Inbox(failures=1)
    first = fake_telegram.private_message("refused once")
    broken = fake_telegram.push_raw({"update_id": first["update_id"] + 1, "message": 5})
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(broken)
    assert inbox.texts() == ["refused once"]
    assert len(fake_telegram.calls_of("getUpdates")) >= 3  # the batch was served twice
    malformed = [w for w in telegram_warnings(caplog) if "malformed" in w.getMessage()]
    assert len(malformed) == 1


async def test_a_429_on_get_updates_holds_polling_for_retry_after(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = Inbox()
    fake_telegram.fail("getUpdates", 429, retry_after=1)
    update = fake_telegram.private_message("patient")
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(update["update_id"])
    assert inbox.texts() == ["patient"]
    assert fake_telegram.violations == []


@pytest.mark.parametrize("fault", [
    {"status": 500},
    {"status": 502, "kind": "html"},
    {"kind": "reset_before"},
    {"kind": "reset_after"},
    {"status": 409},
], ids=["500", "html-502", "reset-before", "reset-after", "conflict"])
async def test_polling_backs_off_and_goes_on_after_a_failed_get_updates(
        start_tg: StartTg, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture,
        fault: dict[str, Any]) -> None:
    inbox = Inbox()
    fake_telegram.fail("getUpdates", times=2, **fault)
    update = fake_telegram.private_message("hello")
    await start_tg(inbox)
    await fake_telegram.wait_confirmed(update["update_id"])
    assert inbox.texts() == ["hello"]
    warnings = telegram_warnings(caplog)
    assert len(warnings) == 2 and all("getUpdates failed" in w.getMessage() for w in warnings)
    assert all(w.exc_info is None and "\n" not in w.getMessage() for w in warnings)


async def test_a_refused_token_stops_polling_with_an_error(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    fake_telegram.fail("getUpdates", 401)
    tg = await start_tg(Inbox())
    assert tg.polling is not None
    await tg.polling
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "polling stopped" in error.getMessage()
    assert len(fake_telegram.calls_of("getUpdates")) == 1


async def test_stop_cuts_the_long_poll_in_flight(start_tg: StartTg,
                                                 fake_telegram: FakeTelegram) -> None:
    tg = await start_tg(Inbox(), polling_timeout=30)
    [poll] = await fake_telegram.wait_for("getUpdates", ok=False)
    await tg.stop()
    assert tg.polling is not None and tg.polling.done()
    # Had stop() waited for the 30 s poll, the fake would have answered it.
    assert poll.status == 0
    assert len(fake_telegram.calls_of("getUpdates")) == 1


async def test_a_redelivered_update_is_handed_over_once_within_the_process(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = Inbox()
    update = fake_telegram.private_message("once")
    tg = await start_tg(inbox)
    await fake_telegram.wait_confirmed(update["update_id"])
    await tg.feed_raw(update)
    assert inbox.texts() == ["once"]


# -- webhook --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def webhook_channel(start_tg: StartTg, inbox: Inbox) -> tuple[TelegramChannel, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    tg = await start_tg(inbox, settings={"telegram_webhook_url": url,
                                         "telegram_webhook_port": port,
                                         "telegram_webhook_secret": "s3cret"})
    return tg, url


async def test_a_webhook_update_the_handler_refused_gets_500_and_its_redelivery_is_taken(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = Inbox(failures=1)
    await webhook_channel(start_tg, inbox)
    update = fake_telegram.private_message("via webhook")
    uid = update["update_id"]
    await fake_telegram.wait_until(lambda: (uid, 200) in fake_telegram.webhook_attempts)
    assert fake_telegram.webhook_attempts == [(uid, 500), (uid, 200)]
    assert inbox.texts() == ["via webhook"]
    assert inbox.messages[0].event_id == str(uid)


async def test_webhook_bodies_that_are_not_updates_are_acknowledged_with_a_warning(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    inbox = Inbox()
    _, url = await webhook_channel(start_tg, inbox)
    secret = {"X-Telegram-Bot-Api-Secret-Token": "s3cret"}
    deep = f'{{"update_id": 77, "message": {"[" * NESTING}{"]" * NESTING}}}'
    async with aiohttp.ClientSession() as client:
        for body in ("{not json", '{"update_id": 76, "message": {"text": "no chat"}}', deep):
            async with client.post(url, data=body.encode(), headers=secret) as resp:
                assert resp.status == 200
        async with client.post(url, data=b"{}", headers={}) as resp:
            assert resp.status == 401  # without the secret: refused, not acknowledged
    warnings = [w.getMessage() for w in telegram_warnings(caplog)]
    assert len(warnings) == 3
    assert "update 76 is malformed" in warnings[1] and "update 77" in warnings[2]
    assert inbox.messages == []


# -- shutdown: intake stops first -------------------------------------------------------------


async def test_stop_intake_cuts_the_long_poll_and_sending_still_works_until_stop(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = Inbox()
    tg = await start_tg(inbox, polling_timeout=30)
    [poll] = await fake_telegram.wait_for("getUpdates", ok=False)
    await tg.stop_intake()
    assert tg.polling is not None and tg.polling.done()
    assert poll.status == 0  # cut, not answered after its 30 s
    fake_telegram.private_message("arrives during the shutdown")
    # A run still in flight delivers its reply.
    sent = await tg.send(OutboundMessage(channel="telegram", chat_id="42", text="last words"))
    assert sent is not None and fake_telegram.sent_texts() == ["last words"]
    await tg.stop()
    assert len(fake_telegram.calls_of("getUpdates")) == 1
    assert inbox.messages == [] and fake_telegram.pending_updates == 1  # kept for next time
    with pytest.raises(RuntimeError, match="stopped"):
        await tg.send(OutboundMessage(channel="telegram", chat_id="42", text="too late"))


async def test_the_webhook_answers_503_once_intake_stopped(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    inbox = Inbox()
    tg, url = await webhook_channel(start_tg, inbox)
    await tg.stop_intake()
    update = fake_telegram.private_message("arrives during the shutdown")
    uid = update["update_id"]
    await fake_telegram.wait_until(lambda: (uid, 503) in fake_telegram.webhook_attempts)
    async with aiohttp.ClientSession() as client, client.post(url, json=update, headers={
            "X-Telegram-Bot-Api-Secret-Token": "s3cret"}) as resp:
        assert resp.status == 503
    assert inbox.messages == []
    await tg.send(OutboundMessage(channel="telegram", chat_id="42", text="still sending"))
    assert fake_telegram.sent_texts() == ["still sending"]


# -- updates a broken or hostile server could send ---------------------------------------------


def impossible(fake: FakeTelegram, update_id: int) -> str:
    """Queue a message update with ``update_id``; returns its JSON text.

    The fake orders it by an ordinary id of its own (later ids stay ordinary),
    so the offset after a later update confirms it, as a real server would.
    """
    text = json.dumps({"update_id": update_id, "message": {
        "message_id": 1, "date": 1, "chat": {"id": 42, "type": "private"},
        "from": {"id": 42, "is_bot": False, "first_name": "Mallory"}, "text": "offset me"}})
    fake.push_json(text, 1)
    return text


def served(fake: FakeTelegram, text: str) -> bool:
    return any(isinstance(c.result, list) and any(
        isinstance(u, RawJson) and u.text == text for u in c.result)
        for c in fake.calls_of("getUpdates"))


@pytest.mark.parametrize("update_id", [-7, 2**32 - 11], ids=["negative", "wraps-negative"])
async def test_an_impossible_update_id_never_makes_telegram_forget_queued_updates(
        start_tg: StartTg, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture,
        update_id: int) -> None:
    inbox = Inbox()
    await start_tg(inbox, poll_backoff=0.05)
    bad = impossible(fake_telegram, update_id)
    await fake_telegram.wait_until(lambda: served(fake_telegram, bad))
    # An offset taken from that id would be read by the server as negative:
    # "forget all queued updates but the last few".
    texts = [f"message {i}" for i in range(20)]
    for text in texts:
        fake_telegram.private_message(text)
    await fake_telegram.wait_until(lambda: len(inbox.messages) == len(texts))
    assert inbox.texts() == texts
    assert all(int(c.params.get("offset") or 0) >= 0
               for c in fake_telegram.calls_of("getUpdates"))
    [warning] = telegram_warnings(caplog)
    assert "impossible id" in warning.getMessage()


async def test_polling_pauses_when_all_it_gets_is_an_update_it_cannot_confirm(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    impossible(fake_telegram, 2**40)
    await start_tg(Inbox(), poll_backoff=0.2)
    polls = await fake_telegram.wait_for("getUpdates", 4)
    gaps = [b.at - a.at for a, b in itertools.pairwise(polls)]
    assert all(gap >= 0.15 for gap in gaps), gaps  # not a hot loop against the server
    later = fake_telegram.private_message("still listening")
    await fake_telegram.wait_confirmed(later["update_id"])


async def test_a_number_too_long_to_convert_skips_its_update_only(
        start_tg: StartTg, fake_telegram: FakeTelegram,
        caplog: pytest.LogCaptureFixture) -> None:
    inbox = Inbox()
    first = fake_telegram.private_message("before")
    broken = first["update_id"] + 1
    # Valid JSON that Python refuses to decode (int() stops at 4,300 digits): the
    # whole getUpdates answer fails to decode, not just this update.
    fake_telegram.push_json(f'{{"update_id": {broken}, "message": {{"message_id": '
                            f'{"9" * 5000}, "text": "long"}}}}', broken)
    last = fake_telegram.private_message("after")
    tg = await start_tg(inbox)
    await fake_telegram.wait_confirmed(last["update_id"])
    assert inbox.texts() == ["before", "after"]
    [warning] = telegram_warnings(caplog)
    assert f"update {broken} is not decodable" in warning.getMessage()
    assert len(warning.getMessage()) < 300
    assert tg.polling is not None and not tg.polling.done()


def test_the_validators_a_reply_needs_are_built_ahead_in_one_call() -> None:
    # A fresh interpreter: other tests have long built these models in this one.
    script = (
        "from channels.telegram.warmup import _RESPONSE_MODELS, build_validators\n"
        "from aiogram.types import Update\n"
        "assert not Update.__pydantic_complete__\n"
        "build_validators()\n"
        "assert Update.__pydantic_complete__\n"
        "assert _RESPONSE_MODELS and all(m.__pydantic_complete__ for m in _RESPONSE_MODELS)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


async def test_stopping_closes_the_http_session_without_aiograms_pause(
        start_tg: StartTg, monkeypatch: pytest.MonkeyPatch) -> None:
    tg = await start_tg(Inbox())
    assert tg.bot is not None
    pauses: list[float] = []

    async def sleep(delay: float) -> None:
        pauses.append(delay)

    # aiogram's AiohttpSession.close sleeps 250 ms after closing (for SSL transports).
    monkeypatch.setattr("aiogram.client.session.aiohttp.asyncio.sleep", sleep)
    session = tg.bot.session
    await tg.stop()
    assert isinstance(session, AiohttpSession) and session._session is not None
    assert session._session.closed
    assert pauses == []


async def test_the_webhook_is_removed_while_get_me_is_answered(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    # getMe is held for 3 s: deleteWebhook goes out meanwhile, not after its answer,
    # so the first getUpdates waits for one round trip, not two.
    fake_telegram.fail("getMe", kind="stall", seconds=3)
    pending_get_me: list[int] = []

    def seen(call: Call) -> None:
        if call.method == "deleteWebhook":
            pending_get_me.extend(c.status for c in fake_telegram.calls_of("getMe"))

    fake_telegram.on_call = seen
    tg = await start_tg(Inbox())
    assert pending_get_me == [0]  # still being answered when deleteWebhook arrived
    assert tg.me is not None and tg.polling is not None


async def test_a_refused_token_is_a_setup_error_and_leaves_nothing_running(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    fake_telegram.fail("getMe", 401, description="Unauthorized")
    with pytest.raises(SetupError, match="refused the bot token"):
        await start_tg(Inbox())
