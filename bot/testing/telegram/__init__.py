"""A local fake of the Telegram Bot API, for driving the real aiogram against it.

Point a bot at it with ``TELEGRAM_API_BASE=fake.base_url`` (Roost) or
``AiohttpSession(api=TelegramAPIServer.from_base(fake.base_url))`` (aiogram)
and the token ``fake.token``. It answers like the real server: form-encoded
calls to ``/bot{token}/{method}``, the ``{"ok": ..., "result": ...}`` envelope,
``getUpdates`` long polling with ``offset`` and ``timeout`` (woken by a push),
or webhook delivery after ``setWebhook``. ``sendMessage`` and
``editMessageText`` check ``parse_mode=HTML`` text the way Telegram does
(supported tags, balanced, ``<``/``>``/``&`` escaped) and the 4,096-character
limit, so a test sees the same 400s a real bot would::

    async with FakeTelegram() as fake:
        update = fake.private_message("hello")
        ...                                   # start the bot
        [call] = await fake.wait_for("sendMessage")
        assert call.params["chat_id"] == update["message"]["chat"]["id"]

Every call is recorded in :attr:`FakeTelegram.calls` (method, decoded
params, time, HTTP status, injected fault). :meth:`FakeTelegram.fail` makes
the next N calls of a method fail (429 with ``retry_after``, 5xx, 400 "can't
parse entities", nginx's HTML 502 page, a reset before or after the call took
effect, a stall...); :meth:`FakeTelegram.inject_faults` fails a share of all
calls at random, the ways real Telegram does. A 429 holds the call's chat
(or the bot) as on the real server: every call into that window is refused
again and kept in :attr:`FakeTelegram.violations`. Message ids run in sequence
per chat, shared by the bot and the people posting there; identical edits get
"message is not modified", edits of someone else's message "message can't be
edited", of an unused id "message to edit not found" (``editMessageText`` and
``editMessageCaption``), updates are served until a higher offset confirms
them (the offset read as the real server reads it: a 32-bit integer, and a
negative one forgets all queued updates but the last few), and webhook
deliveries are retried on non-2xx.
:meth:`FakeTelegram.visible` is what a user sees in a chat now.
The ``fake_telegram`` pytest fixture yields a started instance.

Files: :meth:`FakeTelegram.photo`, :meth:`FakeTelegram.document` and
:meth:`FakeTelegram.voice` push media messages whose files the fake holds;
``getFile`` and ``/file/bot<token>/<file_path>`` serve them (20 MB for bots,
:meth:`FakeTelegram.fail_download` for 5xx, HTML pages, resets, bodies cut
short); ``sendPhoto``/``sendDocument`` take multipart uploads, checked as the
Bot API checks them (413 over 50 MB, photo size and dimensions), kept in
:attr:`FakeTelegram.uploads`.

The package, by job: :mod:`.server` (the app, dispatch), :mod:`.state`
(what it holds, inspecting and waiting), :mod:`.updates` (pushing updates,
long polling, webhook), :mod:`.files` (held, served, uploaded),
:mod:`.faults`, :mod:`.messages` (sending, editing, deleting), :mod:`.html`
(Telegram's HTML parse mode), :mod:`.wire` (shapes and form decoding).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from bot.testing.telegram.html import HtmlError, parse_html
from bot.testing.telegram.server import FakeTelegram
from bot.testing.telegram.wire import (
    ALICE,
    BOB,
    FAULT_KINDS,
    Call,
    RawJson,
    StoredFile,
    Upload,
    user,
)

__all__ = [
    "ALICE",
    "BOB",
    "FAULT_KINDS",
    "Call",
    "FakeTelegram",
    "HtmlError",
    "RawJson",
    "StoredFile",
    "Upload",
    "fake_telegram",
    "parse_html",
    "user",
]


# -- pytest ---------------------------------------------------------------------------------

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the fake works without pytest installed
    pass
else:
    @pytest_asyncio.fixture(name="fake_telegram")
    async def fake_telegram() -> AsyncIterator[FakeTelegram]:
        """A started :class:`FakeTelegram`, stopped after the test.

        Named explicitly, so a test module can import it under another name
        (``from bot.testing.telegram import fake_telegram as _fixture``).
        """
        async with FakeTelegram() as fake:
            yield fake
