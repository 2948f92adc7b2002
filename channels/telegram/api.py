"""The one way the channel calls the Bot API, and the gate replies pass while it runs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator

from aiogram import Bot
from aiogram.exceptions import (
    TelegramAPIError,
    TelegramEntityTooLarge,
    TelegramNetworkError,
    TelegramServerError,
)
from aiogram.methods import (
    DeleteMessage,
    EditMessageCaption,
    EditMessageText,
    SendDocument,
    SendMessage,
    SendPhoto,
    TelegramMethod,
)
from aiogram.methods.base import TelegramType

from bot.contracts.channel import marked_send
from channels.delivery import BOT, DeliveryPolicy, RateLimited, RateLimiter, deliver
from channels.telegram.chats import Chats
from channels.telegram.errors import ChatMigrated, translated

log = logging.getLogger("roost.channels.telegram")

COUNTED = (SendMessage, EditMessageText, EditMessageCaption, DeleteMessage, SendPhoto,
           SendDocument)
"""The methods Telegram's message limits count."""


async def call_translated(bot: Bot, method: TelegramMethod[TelegramType],
                          request_timeout: int | None) -> TelegramType:
    """One Bot API call, its errors mapped (:func:`~channels.telegram.errors.translated`)."""
    return await translated(bot(method, request_timeout=request_timeout))


def certainly_refused(error: BaseException) -> bool:
    """Whether a failed call certainly showed nothing: a 429, a migrated chat or any other
    4xx answer. 5xx answers and network errors may come after the call took effect."""
    cause = error.__cause__ if isinstance(error, (RateLimited, ChatMigrated)) else error
    if isinstance(cause, TelegramEntityTooLarge):  # a TelegramNetworkError, yet a 413
        return True
    return isinstance(cause, TelegramAPIError) and not isinstance(
        cause, (TelegramServerError, TelegramNetworkError))


class BotApi:
    """Every Bot API call of the channel: rate limited, errors translated, migrated
    groups followed, a reply's calls marked for the outbox."""

    def __init__(self, chats: Chats, limiter: RateLimiter, *, policy: DeliveryPolicy) -> None:
        self.chats = chats
        self.limiter = limiter
        self.policy = policy
        self.bot: Bot | None = None
        """The aiogram ``Bot`` once :meth:`open` ran (``None`` before ``start``)."""

    def open(self, bot: Bot) -> None:
        """Call through ``bot`` from now on."""
        self.bot = bot

    def required(self) -> Bot:
        """The ``Bot``; raises if the channel is not started."""
        if self.bot is None:
            raise RuntimeError("the Telegram channel is not started")
        return self.bot

    async def call(self, method: TelegramMethod[TelegramType], *, urgent: bool = True,
                   request_timeout: int | None = None, scope: str | None = None,
                   marked: bool = True) -> TelegramType | None:
        """One Bot API call through the rate limiter, errors translated.

        Returns ``None`` only for a call that is not ``urgent`` and had to give
        way (a 429 window, the budget, another call to the chat in flight).
        A group upgraded to a supergroup is followed: the call goes again to
        the new chat, and so does every later one. ``marked``: a call of a reply being
        sent (:func:`marked_send`; probes are not). ``request_timeout`` replaces the
        request timeout (uploads get time for their size). ``scope`` replaces the
        rate-limit scope of a call to no chat (the whole bot's), so it need not wait
        for another such call in flight.
        """
        bot = self.required()
        for _ in range(3):
            chat = getattr(method, "chat_id", None)
            moved = self.chats.moved(chat)
            if moved is not None:
                chat = moved
                method = method.model_copy(update={"chat_id": chat})
            where = (scope or BOT) if chat is None else f"chat:{chat}"
            group = isinstance(chat, str) or (isinstance(chat, int) and chat < 0)
            try:
                async with self.limiter.slot(where, group=group, urgent=urgent,
                                             counted=isinstance(method, COUNTED)) as go:
                    if not go:
                        return None
                    call = functools.partial(call_translated, bot, method, request_timeout)
                    if not marked:
                        return await call()
                    note = None if chat is None else \
                        functools.partial(self.chats.floor_note, chat)
                    return await marked_send(call, refused=certainly_refused, note=note)
            except ChatMigrated as moved_to:
                if chat is None:
                    raise
                log.info("telegram: chat %s became supergroup %d; following it", chat,
                         moved_to.chat_id)
                self.chats.follow(chat, moved_to.chat_id)
        raise RuntimeError(f"telegram: {method.__api_method__} kept being redirected")

    async def deliver(self, method: TelegramMethod[TelegramType], what: str, *,
                      policy: DeliveryPolicy | None = None,
                      request_timeout: int | None = None,
                      scope: str | None = None) -> TelegramType:
        """An urgent call, retried on transient errors and after 429s (a call that posts
        a message goes through :class:`~channels.telegram.outcomes.Outcomes` instead)."""
        async def call() -> TelegramType:
            result = await self.call(method, request_timeout=request_timeout, scope=scope)
            assert result is not None  # urgent calls never give way
            return result

        return await deliver(call, what=f"telegram {what}", policy=policy or self.policy)


class ReplyGate:
    """Counts the replies (and downloads) in flight so that stopping lets them finish;
    shut before the channel started and once it stopped."""

    def __init__(self, api: BotApi) -> None:
        self._api = api
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._shut = False

    @property
    def shut(self) -> bool:
        """Whether the channel stopped: nothing new goes out."""
        return self._shut

    @contextlib.asynccontextmanager
    async def entered(self) -> AsyncIterator[bool]:
        """Count the block as in flight; yields ``False`` (not counted) when shut."""
        if self._shut or self._api.bot is None:
            yield False
            return
        self._sending += 1
        self._idle.clear()
        try:
            yield True
        finally:
            self._sending -= 1
            if not self._sending:
                self._idle.set()

    def shut_down(self) -> None:
        """Let nothing new in."""
        self._shut = True

    async def drained(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for what is in flight."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
