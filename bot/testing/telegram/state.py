"""The fake's state, and what tests inspect and wait on."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bot.testing.telegram.wire import (
    MB,
    Call,
    StoredFile,
    Upload,
    Webhook,
    user,
)


class State:
    """Everything the fake holds, shared by its parts (updates, faults, messages, files)."""

    def __init__(self, *, token: str = "123456:TEST-TOKEN", username: str = "test_bot",
                 first_name: str = "TestBot") -> None:
        digits, sep, _ = token.partition(":")
        if not sep or not digits.isdigit():
            raise ValueError("a bot token looks like '<digits>:<text>'")
        self.token = token
        self.bot_id = int(digits)
        self.username = username
        self.bot_user = user(self.bot_id, first_name, username, is_bot=True)
        self.calls: list[Call] = []
        """Every call received, in order (failed ones included)."""
        self.messages: dict[tuple[int | str, int], dict[str, Any]] = {}
        """Messages the bot sent and did not delete, by ``(chat_id, message_id)``, as
        currently shown (``text`` is the visible text; keys starting with ``_`` are
        the fake's own: ``_source`` and ``_parse_mode`` of the latest version)."""
        self.deleted: list[tuple[int | str, int]] = []
        self.commands: dict[str, list[dict[str, Any]]] = {}
        """``setMyCommands`` lists by scope (``"default"``, ``"chat:<id>"``, ...)."""
        self.webhook: Webhook | None = None
        self.on_call: Callable[[Call], None] | None = None
        """Called synchronously for each call as it arrives (benchmarks timestamp here)."""
        self._record = True
        self._message_ids: dict[int | str, itertools.count[int]] = {}
        """Each chat's own sequence of message ids, shared by everyone who posts there
        (the bot and the people), as on Telegram."""
        self.foreign: set[tuple[int | str, int]] = set()
        """Messages people posted (pushed ones): the bot cannot edit them."""
        self.chats: dict[int | str, dict[str, Any]] = {}
        self.violations: list[Call] = []
        """Calls that arrived while a 429 window of their scope (their chat, or the
        whole bot) was open: a well-behaved client makes none."""
        self.webhook_max_attempts = 3
        """Webhook deliveries of one update before the fake gives up on it."""
        self.call_cond = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.closing = False
        self._port = 0
        self.files: dict[str, StoredFile] = {}
        """Files the fake holds, by ``file_id`` (pushed ones and the bot's uploads)."""
        self.uploads: list[Upload] = []
        """Every file the bot uploaded successfully, in order."""
        self.downloads: list[str] = []
        """The ``file_path`` of each download request that reached the file URL."""
        self.upload_limit = 50 * MB
        """Bytes an uploaded file may have; over it: 413 (lower it to test cheaply)."""
        self.download_limit = 20 * MB
        """Bytes of the largest file ``getFile`` describes; over it: "file is too big"."""
        self.photo_limit = 10 * MB

    @property
    def base_url(self) -> str:
        """The server's root, for ``TELEGRAM_API_BASE`` / ``TelegramAPIServer.from_base``."""
        if not self._port:
            raise RuntimeError("FakeTelegram is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def record(self) -> bool:
        """Whether calls are kept in :attr:`calls` (benchmarks turn it off)."""
        return self._record

    @record.setter
    def record(self, value: bool) -> None:
        self._record = value

    def visible(self, chat_id: int | str) -> list[str]:
        """The texts a user sees in ``chat_id`` now: sent, not deleted, as last edited
        (a photo's or document's caption, ``""`` without one)."""
        shown = sorted(self.messages.items(), key=lambda kv: kv[0][1])
        return [m.get("text", m.get("caption", "")) for (cid, _), m in shown if cid == chat_id]

    # -- inspecting ------------------------------------------------------------

    def calls_of(self, method: str) -> list[Call]:
        """Recorded calls of ``method`` (case-insensitive), successful or not."""
        name = method.lower()
        return [c for c in self.calls if c.method.lower() == name]

    def sent(self, method: str = "sendMessage") -> list[Call]:
        """Successful calls of ``method``."""
        return [c for c in self.calls_of(method) if c.status == 200]

    def sent_texts(self, chat_id: int | str | None = None) -> list[str]:
        """Texts of the successful ``sendMessage`` calls (to ``chat_id`` if given)."""
        return [c.params.get("text", "") for c in self.sent()
                if chat_id is None or c.params.get("chat_id") == chat_id]

    async def wait_confirmed(self, update_id: int, *, limit: float = 5.0) -> None:
        """Wait until the bot confirmed ``update_id`` (a later ``getUpdates`` offset).

        aiogram handles an update before it asks for the next batch, so after
        this the bot has handed the message to its handler.
        """
        def confirmed() -> bool:
            return any(int(c.params.get("offset") or 0) > update_id
                       for c in self.calls_of("getUpdates"))

        try:
            async with asyncio.timeout(limit), self.call_cond:
                await self.call_cond.wait_for(confirmed)
        except TimeoutError:
            raise AssertionError(f"update {update_id} was not confirmed within {limit}s") \
                from None

    async def wait_until(self, check: Callable[[], bool], *, limit: float = 5.0) -> None:
        """Wait until ``check()`` holds; it is tried again as each call arrives or ends."""
        try:
            async with asyncio.timeout(limit), self.call_cond:
                await self.call_cond.wait_for(check)
        except TimeoutError:
            raise AssertionError(f"the condition did not hold within {limit}s") from None

    async def wait_for(self, method: str, count: int = 1, *, limit: float = 5.0,
                       ok: bool = True) -> list[Call]:
        """Wait until ``count`` calls of ``method`` arrived (successful ones if ``ok``)."""
        def matching() -> list[Call]:
            return self.sent(method) if ok else self.calls_of(method)

        try:
            async with asyncio.timeout(limit), self.call_cond:
                await self.call_cond.wait_for(lambda: len(matching()) >= count)
        except TimeoutError:
            raise AssertionError(
                f"expected {count} {method} call(s) within {limit}s, got "
                f"{len(matching())}; calls: {[c.method for c in self.calls]}") from None
        return matching()

    async def record_call(self, call: Call, *, arrived: bool = False) -> None:
        """Keep ``call`` (on arrival) and wake waiters (on arrival and on completion)."""
        if not self._record:
            return
        if arrived:
            self.calls.append(call)
        async with self.call_cond:
            self.call_cond.notify_all()

    def next_id(self, chat_id: int | str) -> int:
        """The next message id in ``chat_id`` (each chat counts from 1000)."""
        counter = self._message_ids.get(chat_id)
        if counter is None:
            counter = self._message_ids[chat_id] = itertools.count(1000)
        return next(counter)

    def chat(self, chat_id: int | str) -> dict[str, Any]:
        known = self.chats.get(chat_id)
        if known is not None:
            return known
        if isinstance(chat_id, int) and chat_id > 0:
            return {"id": chat_id, "type": "private", "first_name": "User"}
        return {"id": chat_id, "type": "supergroup", "title": "Group"}
