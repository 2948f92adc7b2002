"""The Bot API client: every call rate limited, its errors mapped, migrated groups
followed, and what is known of each chat.

:func:`translated` maps aiogram's errors to what the caller does next;
:class:`BotApi` is the one way the channel calls the Bot API; :class:`Chats` holds
what the calls learn of each chat (where a group moved, its message ids, what
Roost's messages there show); :class:`ReplyGate` counts replies in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
from aiogram import Bot
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramAPIError,
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
from channels.delivery import BOT, DeliveryPolicy, RateLimited, RateLimiter, Transient, deliver

log = logging.getLogger("roost.channels.telegram")

T = TypeVar("T")


class ChatMigrated(Exception):
    """A group became a supergroup; calls must go to ``chat_id`` from now on."""

    def __init__(self, chat_id: int) -> None:
        super().__init__(f"the chat moved to {chat_id}")
        self.chat_id = chat_id


async def translated(call: Awaitable[T]) -> T:
    """Await a Bot API call, mapping every aiogram error to what the caller does next.

    - ``TelegramRetryAfter`` (429) → :class:`RateLimited`: wait, then retry (the
      rate limiter holds the call's chat, or the whole bot, meanwhile);
    - ``TelegramMigrateToChat`` → :class:`ChatMigrated`: call the new chat;
    - ``TelegramServerError`` and ``RestartingTelegram`` (5xx),
      ``ClientDecodeError`` (an HTML 502/504 page from nginx, or a garbled
      body) and ``TelegramNetworkError`` (resets before or after the call,
      timeouts) → :class:`Transient`: back off and retry. A reset after a
      ``sendMessage`` took effect makes the retry a duplicate; that is the
      price of never losing a reply (the Bot API has no idempotency key).
    - ``TelegramBadRequest``, ``TelegramForbiddenError``, ``TelegramNotFound``,
      ``TelegramUnauthorizedError``, ``TelegramEntityTooLarge``,
      ``TelegramConflictError`` and any other API error are permanent: raised
      as they are (callers read the 400 descriptions) and never retried.
    """
    try:
        return await call
    except TelegramRetryAfter as exc:
        raise RateLimited(float(exc.retry_after)) from exc
    except TelegramMigrateToChat as exc:
        raise ChatMigrated(exc.migrate_to_chat_id) from exc
    except (TelegramBadRequest, TelegramForbiddenError, TelegramNotFound,
            TelegramUnauthorizedError, TelegramEntityTooLarge, TelegramConflictError):
        # TelegramEntityTooLarge derives from TelegramNetworkError: caught here first.
        raise
    except TelegramServerError as exc:  # RestartingTelegram included
        raise Transient(f"server error: {exc.message}") from exc
    except ClientDecodeError as exc:
        raise Transient(f"undecodable answer ({describe_error(exc)})") from exc
    except TelegramNetworkError as exc:
        raise Transient(f"network: {exc.message}") from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        # aiogram wraps these; kept in case an error escapes its wrapping.
        raise Transient(f"network: {type(exc).__name__}: {exc}") from exc


def describe_error(exc: BaseException) -> str:
    """One short line for a log: aiogram's ClientDecodeError would print a whole HTML page."""
    if isinstance(exc, ClientDecodeError):
        return f"{exc.message}: {type(exc.original).__name__}"
    if isinstance(exc, TelegramAPIError):
        return f"{type(exc).__name__}: {exc.message}"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def entity_error(exc: TelegramBadRequest) -> bool:
    """Whether Telegram could not parse the HTML (the text can still go as plain text)."""
    return "can't parse entities" in exc.message.lower()


def not_modified(exc: TelegramBadRequest) -> bool:
    """Whether an edit was refused because the message already shows exactly that."""
    return "message is not modified" in exc.message.lower()


KNOWN_IDS = 32
"""Message ids remembered per chat (a probe for a lost send's message skips them)."""
CHATS = 4096
"""Chats whose message ids are remembered (least recently used ones forgotten)."""
SHOWN = 4096
"""Messages whose shown text is remembered (least recently sent or edited forgotten)."""


@dataclass(slots=True)
class ChatIds:
    """What is known of one chat's message ids, and its one creating call at a time."""

    top: int | None = None
    known: OrderedDict[int, None] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    unresolved: bool = False
    """A probe here could not finish: a message of ours may be unknown above the top."""


class Chats:
    """Per chat: the supergroup a group became, its message ids (see
    :mod:`channels.telegram.outcomes`), and what each message Roost sent shows."""

    def __init__(self) -> None:
        self._migrated: dict[int | str, int] = {}
        self._ids: OrderedDict[int | str, ChatIds] = OrderedDict()
        # What each message Roost sent currently shows, as (text, parse_mode):
        # a final edit identical to the draft would be refused as "not modified".
        self._shown: OrderedDict[tuple[int | str, int], tuple[str, str | None]] = \
            OrderedDict()

    def moved(self, chat: object) -> int | None:
        """The supergroup ``chat`` became, ``None`` if it did not move."""
        return self._migrated.get(chat) if isinstance(chat, int | str) else None

    def follow(self, chat: int | str, to: int) -> None:
        """``chat`` became supergroup ``to``: calls go there from now on."""
        self._migrated[chat] = to

    def current(self, chat: int | str) -> int | str:
        """The chat ``chat`` is now (itself, or the supergroup it became)."""
        return self._migrated.get(chat, chat)

    def ids(self, chat: int | str) -> ChatIds:
        """The message ids known of ``chat`` (created on first use, least recent forgotten)."""
        key = self.current(chat)
        ids = self._ids.get(key)
        if ids is None:
            ids = self._ids[key] = ChatIds()
            oldest = next(iter(self._ids))
            if len(self._ids) > CHATS and not self._ids[oldest].lock.locked():
                del self._ids[oldest]
        else:
            self._ids.move_to_end(key)
        return ids

    def saw(self, chat: int | str, message_id: int) -> None:
        """Message ``message_id`` exists in ``chat`` (received, or posted by Roost)."""
        ids = self.ids(chat)
        if ids.top is None or message_id > ids.top:
            ids.top = message_id
        ids.known[message_id] = None
        if len(ids.known) > KNOWN_IDS:
            ids.known.popitem(last=False)

    def floor_note(self, chat: int | str) -> str | None:
        """What a reply's first platform call notes for a later redelivery: the chat's
        highest known message id (``None``: none known)."""
        top = self.ids(chat).top
        return None if top is None else str(top)

    def remember_shown(self, chat: int | str, message_id: int, text: str,
                       mode: str | None) -> None:
        """Message ``message_id`` of ``chat`` now shows ``text`` in parse mode ``mode``."""
        key = (self.current(chat), message_id)
        self._shown[key] = (text, mode)
        self._shown.move_to_end(key)
        if len(self._shown) > SHOWN:
            self._shown.popitem(last=False)

    def shows(self, chat: int | str, message_id: int, text: str, mode: str | None) -> bool:
        """Whether the message is known to show exactly ``text`` in ``mode``."""
        return self._shown.get((self.current(chat), message_id)) == (text, mode)

    def forget_shown(self, chat: int | str, message_id: int) -> None:
        """The message is gone."""
        self._shown.pop((self.current(chat), message_id), None)


COUNTED = (SendMessage, EditMessageText, EditMessageCaption, DeleteMessage, SendPhoto,
           SendDocument)
"""The methods Telegram's message limits count."""


async def call_translated(bot: Bot, method: TelegramMethod[TelegramType],
                          request_timeout: int | None) -> TelegramType:
    """One Bot API call, its errors mapped (:func:`translated`)."""
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
