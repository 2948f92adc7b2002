"""The Telegram channel's state and its one way of calling the Bot API.

:class:`ChannelBase` holds what the intake, the sending and the media parts of
:class:`~channels.telegram.TelegramChannel` share: the settings, the aiogram
``Bot``, the rate limiter, and :meth:`ChannelBase._api`, through which every
call goes (rate limited, errors translated, migrated groups followed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
from aiogram.types import Update, User

from bot.contracts.channel import Channel, ChannelHealth, InboundHandler, WebRoutes, marked_send
from bot.resilience.listener import Listener
from channels.delivery import DeliveryPolicy, RateLimited, deliver
from channels.ratelimit import BOT, TELEGRAM_LIMITS, Limits, RateLimiter
from channels.telegram.errors import ChatMigrated, _translated
from channels.telegram.parsing import SEEN_UPDATES

if TYPE_CHECKING:
    from bot.config.settings import Settings

log = logging.getLogger("roost.channels.telegram")

ALLOWED_UPDATES = ["message"]
"""The only update type Roost acts on; Telegram then sends no others."""
UNHANDLED_KINDS = 256
"""Kinds of unhandled updates remembered, so each is logged once (bounded: the names
of unknown kinds come from the server)."""
SERVICE_USER = 777000
"""The account "Telegram": the ``from`` of automatic forwards and service notices."""
COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")
"""What Telegram accepts as a command name in ``setMyCommands``."""
_COMMAND = re.compile(r"^/([A-Za-z0-9_]{1,64})(?:@([A-Za-z0-9_]{1,64}))?(?=\s|$)")
_DRAFT_POLICY = DeliveryPolicy(attempts=1)
"""Drafts are not retried: the next edit or the final reply supersedes them."""
STOP_GRACE = 10.0
"""Seconds ``stop()`` waits for replies still being sent."""
GET_UPDATES = "getUpdates"
"""The rate-limit scope of ``getUpdates``: a 429 on it holds polling only."""
CONNECTING = ChannelHealth(False, "connecting")
"""The health of a channel that has not received yet (before ``getMe`` or the first poll)."""
_COUNTED = (SendMessage, EditMessageText, EditMessageCaption, DeleteMessage, SendPhoto,
            SendDocument)
"""The methods Telegram's message limits count."""
KNOWN_IDS = 32
"""Message ids remembered per chat (a probe for a lost send's message skips them)."""
CHATS = 4096
"""Chats whose message ids are remembered (least recently used ones forgotten)."""


@dataclass(slots=True)
class ChatIds:
    """What is known of one chat's message ids, and its one creating call at a time."""

    top: int | None = None
    known: OrderedDict[int, None] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    unresolved: bool = False
    """A probe here could not finish: a message of ours may be unknown above the top."""


@dataclass(frozen=True, slots=True)
class _Target:
    """Where a reply goes: the chat, its forum topic, and the message it answers."""

    chat_id: int | str
    thread_id: int | None = None
    reply_to: int | None = None

    @classmethod
    def of(cls, chat_id: str, thread_id: str | None, reply_to: str | None) -> _Target:
        return cls(_chat_id(chat_id), _int_or_none(thread_id), _int_or_none(reply_to))


async def _call(bot: Bot, method: TelegramMethod[TelegramType],
                request_timeout: int | None) -> TelegramType:
    return await _translated(bot(method, request_timeout=request_timeout))


def certainly_refused(error: BaseException) -> bool:
    """Whether a failed call certainly showed nothing: a 429, a migrated chat or any other
    4xx answer. 5xx answers and network errors may come after the call took effect."""
    cause = error.__cause__ if isinstance(error, (RateLimited, ChatMigrated)) else error
    if isinstance(cause, TelegramEntityTooLarge):  # a TelegramNetworkError, yet a 413
        return True
    return isinstance(cause, TelegramAPIError) and not isinstance(
        cause, (TelegramServerError, TelegramNetworkError))


class ChannelBase(Channel):
    """The state of a Telegram channel and the Bot API calls every part of it makes."""

    name = "telegram"
    marks_sending = True  # after the rate limiter's waits: see _api

    def __init__(self, settings: Settings, *, polling_timeout: int = 30,
                 edit_interval: float = 1.0, typing_interval: float = 4.0,
                 policy: DeliveryPolicy | None = None, limits: Limits = TELEGRAM_LIMITS,
                 request_timeout: float = 60.0, poll_backoff: float = 0.5,
                 draft_after: float = 1.0, draft_chars: int = 400) -> None:
        if settings.telegram_bot_token is None:
            raise ValueError("the Telegram channel needs TELEGRAM_BOT_TOKEN")
        self.settings = settings
        self.polling_timeout = polling_timeout
        self.edit_interval = edit_interval
        self.typing_interval = typing_interval
        self.draft_after = draft_after
        self.draft_chars = draft_chars
        self.policy = policy or DeliveryPolicy()
        self.limiter = RateLimiter(limits if settings.telegram_rate_limits else Limits(),
                                   shared_by=self._live_replicas)
        self.request_timeout = request_timeout
        self.poll_backoff = poll_backoff
        self.bot: Bot | None = None
        self.me: User | None = None
        self._handler: InboundHandler | None = None
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._polling: asyncio.Task[None] | None = None
        self._fetching: asyncio.Task[list[Update]] | None = None
        self._webhook: Listener | None = None
        self._shared: WebRoutes | None = None
        """Roost's HTTP server, when the webhook is mounted there (same port)."""
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False
        self._intake_stopped = False
        self._closing = False
        self._stopping = asyncio.Event()
        """Set once intake stops: wakes the polling loop out of its pauses."""
        self._health = CONNECTING
        """What ``/readyz`` shows: ready once ``getMe`` passed and polling (or the
        webhook) began; not ready from a failed ``getUpdates`` until the next success."""
        self._unhandled: set[str] = set()
        self._commands: set[str] = set()
        self._migrated: dict[int | str, int] = {}
        # What each message Roost sent currently shows, as (text, parse_mode):
        # a final edit identical to the draft would be refused as "not modified".
        self._shown: OrderedDict[tuple[int | str, int], tuple[str, str | None]] = \
            OrderedDict()
        self._ids: OrderedDict[int | str, ChatIds] = OrderedDict()
        """Per chat, the message ids known (see :mod:`channels.telegram.outcomes`)."""

    def _live_replicas(self) -> int:
        # Telegram's ~30 messages/s is the bot's, whichever replica sends: each paces at
        # its share. Per-chat limits stay per replica (a chat's session has one holder).
        return 1 if self.replicas is None else self.replicas.live

    def health(self) -> ChannelHealth:
        """Ready once receiving; not from a failed ``getUpdates`` until one succeeds."""
        return self._health

    # -- calling the Bot API -------------------------------------------------------------

    def _bot(self) -> Bot:
        if self.bot is None:
            raise RuntimeError("the Telegram channel is not started")
        return self.bot

    async def _api(self, method: TelegramMethod[TelegramType], *, urgent: bool = True,
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
        bot = self._bot()
        for _ in range(3):
            chat = getattr(method, "chat_id", None)
            if chat in self._migrated:
                chat = self._migrated[chat]
                method = method.model_copy(update={"chat_id": chat})
            where = (scope or BOT) if chat is None else f"chat:{chat}"
            group = isinstance(chat, str) or (isinstance(chat, int) and chat < 0)
            try:
                async with self.limiter.slot(where, group=group, urgent=urgent,
                                             counted=isinstance(method, _COUNTED)) as go:
                    if not go:
                        return None
                    call = functools.partial(_call, bot, method, request_timeout)
                    if not marked:
                        return await call()
                    note = None if chat is None else functools.partial(self._floor_note, chat)
                    return await marked_send(call, refused=certainly_refused, note=note)
            except ChatMigrated as moved:
                if chat is None:
                    raise
                log.info("telegram: chat %s became supergroup %d; following it", chat,
                         moved.chat_id)
                self._migrated[chat] = moved.chat_id
        raise RuntimeError(f"telegram: {method.__api_method__} kept being redirected")

    async def _deliver(self, method: TelegramMethod[TelegramType], what: str, *,
                       policy: DeliveryPolicy | None = None,
                       request_timeout: int | None = None,
                       scope: str | None = None) -> TelegramType:
        """An urgent call, retried on transient errors and after 429s."""
        async def call() -> TelegramType:
            result = await self._api(method, request_timeout=request_timeout, scope=scope)
            assert result is not None  # urgent calls never give way
            return result

        return await deliver(call, what=f"telegram {what}", policy=policy or self.policy)

    @contextlib.asynccontextmanager
    async def _sending_reply(self) -> AsyncIterator[bool]:
        """Count replies in flight so ``stop()`` can let them finish."""
        if self._stopped or self.bot is None:
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

    def _chat_ids(self, chat: int | str) -> ChatIds:
        key = self._migrated.get(chat, chat)
        ids = self._ids.get(key)
        if ids is None:
            ids = self._ids[key] = ChatIds()
            oldest = next(iter(self._ids))
            if len(self._ids) > CHATS and not self._ids[oldest].lock.locked():
                del self._ids[oldest]
        else:
            self._ids.move_to_end(key)
        return ids

    def _saw(self, chat: int | str, message_id: int) -> None:
        """Message ``message_id`` exists in ``chat`` (received, or posted by Roost)."""
        ids = self._chat_ids(chat)
        if ids.top is None or message_id > ids.top:
            ids.top = message_id
        ids.known[message_id] = None
        if len(ids.known) > KNOWN_IDS:
            ids.known.popitem(last=False)

    def _floor_note(self, chat: int | str) -> str | None:
        """What a reply's first platform call notes for a later redelivery: the chat's
        highest known message id (``None``: none known)."""
        top = self._chat_ids(chat).top
        return None if top is None else str(top)

    def _remember_shown(self, chat: int | str, message_id: int, text: str,
                        mode: str | None) -> None:
        key = (self._migrated.get(chat, chat), message_id)
        self._shown[key] = (text, mode)
        self._shown.move_to_end(key)
        if len(self._shown) > SEEN_UPDATES:
            self._shown.popitem(last=False)

    def _shows(self, chat: int | str, message_id: int, text: str, mode: str | None) -> bool:
        return self._shown.get((self._migrated.get(chat, chat), message_id)) == (text, mode)

    async def _pause(self, seconds: float) -> None:
        """Sleep, unless intake stops first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _ignore(self, kind: str, event_id: str | int) -> None:
        """Note an update Roost does not handle: at debug, the first of each kind only.

        Such updates are confirmed like any other; a stream of them (reactions,
        members joining) would otherwise fill the debug log.
        """
        kind = kind[:64]
        if kind in self._unhandled:
            return
        if len(self._unhandled) < UNHANDLED_KINDS:
            self._unhandled.add(kind)
        log.debug("telegram: update %s (%s) is of a kind Roost does not handle; ignored, as "
                  "are later ones of this kind (not logged)", event_id, kind)


def _unthreaded(target: _Target) -> _Target:
    """The same chat and topic, not replying: for the pieces after the first."""
    return _Target(target.chat_id, target.thread_id)


def _chat_id(chat_id: str) -> int | str:
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None
