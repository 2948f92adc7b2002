"""The Telegram channel: Bot API updates in, HTML replies out, through aiogram.

The adapter only translates. A ``message`` update becomes an
:class:`InboundMessage` (private chats are ``direct``; groups and supergroups
``group``; a forum topic is its own ``thread_id``) and goes to the core, which
applies the DM and group policies; the adapter's part is to say whether the
bot was addressed (``mentioned``). What comes with a message besides text
(photos, files, voice, a location, a contact, a sticker, a poll...) becomes
described attachments; files are not downloaded. A message sent on behalf of
a chat (a linked channel's automatic forward, an anonymous admin) comes from
that chat. Other update kinds are confirmed and ignored. Replies are rendered
from the model's Markdown to Telegram HTML, cut at 4,096 characters, and sent
with retries.

Receiving is durable. Updates arrive by Roost's own long-polling loop
(``getUpdates``) or, when ``telegram_webhook_url`` is set, on an aiohttp
server that Telegram POSTs to, checked with the secret-token header. Either
way an update is acknowledged to Telegram (the next ``getUpdates`` offset, a
webhook's 200) only after the core's handler returned for it, that is once the
message is in the core's inbox; if the handler raises, Telegram delivers the
update again. A malformed update is skipped with one warning and acknowledged,
so it cannot wedge the updates behind it; one whose id Telegram cannot have
given is skipped without moving the offset (the server would read it as
"forget the queue"). ``stop_intake`` stops receiving at once (the webhook
answers 503 from then on) while replies can still be sent until ``stop``.

Sending honours Telegram's limits (``channels.ratelimit``): after a 429 nothing
goes to that chat until ``retry_after`` has passed, a proactive budget keeps
the documented rates, and streaming drafts and typing indicators give way to
final replies. Every aiogram error is mapped in :func:`_translated`.
"""

from __future__ import annotations

# Before any aiogram import: it makes aiogram's types build on first use
# (importing aiogram otherwise costs about 2.4 s and 150 MB).
from channels.telegram_lazy import LAZY  # isort: split

import asyncio
import contextlib
import json
import logging
import random
import re
import secrets
import time
import traceback
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit

import aiohttp
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
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
    DeleteWebhook,
    EditMessageText,
    GetMe,
    GetUpdates,
    SendChatAction,
    SendMessage,
    SetMyCommands,
    SetWebhook,
    TelegramMethod,
)
from aiogram.methods.base import Response, TelegramType
from aiogram.types import (
    BotCommand,
    BotCommandScopeChat,
    Chat,
    Message,
    MessageOriginChannel,
    ReplyParameters,
    Update,
    User,
)
from aiohttp import web
from pydantic import ValidationError

from bot.app.roost import SetupError
from bot.contracts.channel import Channel, InboundHandler, ReplyStream
from bot.contracts.messages import Attachment, ChatType, InboundMessage, OutboundMessage, clean_text
from channels.delivery import DeliveryPolicy, RateLimited, Transient, deliver
from channels.ratelimit import BOT, TELEGRAM_LIMITS, Limits, RateLimiter
from channels.telegram_format import fit, split_for_telegram, to_html

if TYPE_CHECKING:
    from bot.config.settings import Settings
    from bot.contracts.commands import Command

log = logging.getLogger("roost.channels.telegram")

T = TypeVar("T")

ALLOWED_UPDATES = ["message"]
"""The only update type Roost acts on; Telegram then sends no others."""
SEEN_UPDATES = 4096
"""Recent update ids remembered to drop redeliveries early (the inbox dedupes for real)."""
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
POLL_BACKOFF_CAP = 30.0
"""The longest pause between failed ``getUpdates`` calls, in seconds."""
_UPDATE_ID = re.compile(r'"update_id"\s*:\s*(\d+)')
_COUNTED = (SendMessage, EditMessageText, DeleteMessage)
"""The methods Telegram's message limits count."""


@dataclass(frozen=True, slots=True)
class _Target:
    """Where a reply goes: the chat, its forum topic, and the message it answers."""

    chat_id: int | str
    thread_id: int | None = None
    reply_to: int | None = None

    @classmethod
    def of(cls, chat_id: str, thread_id: str | None, reply_to: str | None) -> _Target:
        return cls(_chat_id(chat_id), _int_or_none(thread_id), _int_or_none(reply_to))


class ChatMigrated(Exception):
    """A group became a supergroup; calls must go to ``chat_id`` from now on."""

    def __init__(self, chat_id: int) -> None:
        super().__init__(f"the chat moved to {chat_id}")
        self.chat_id = chat_id


class TelegramChannel(Channel):
    """Roost on Telegram (``TELEGRAM_BOT_TOKEN``).

    Keyword arguments exist for tests and benchmarks: ``polling_timeout`` is
    the long-poll wait in seconds, ``edit_interval`` the minimum time between
    streaming edits, ``typing_interval`` how often the typing status is
    refreshed, ``policy`` the retry policy for replies, ``limits`` the
    proactive rate limits, ``request_timeout`` how long one Bot API call may
    take (the long poll gets its own wait on top), ``poll_backoff`` the first
    pause after a failed ``getUpdates`` (doubling up to 30 s).
    """

    name = "telegram"

    def __init__(self, settings: Settings, *, polling_timeout: int = 30,
                 edit_interval: float = 1.0, typing_interval: float = 4.0,
                 policy: DeliveryPolicy | None = None, limits: Limits = TELEGRAM_LIMITS,
                 request_timeout: float = 60.0, poll_backoff: float = 0.5) -> None:
        if settings.telegram_bot_token is None:
            raise ValueError("the Telegram channel needs TELEGRAM_BOT_TOKEN")
        self.settings = settings
        self.polling_timeout = polling_timeout
        self.edit_interval = edit_interval
        self.typing_interval = typing_interval
        self.policy = policy or DeliveryPolicy()
        self.limiter = RateLimiter(limits)
        self.request_timeout = request_timeout
        self.poll_backoff = poll_backoff
        self.bot: Bot | None = None
        self.me: User | None = None
        self._handler: InboundHandler | None = None
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._polling: asyncio.Task[None] | None = None
        self._fetching: asyncio.Task[list[Update]] | None = None
        self._webhook: web.AppRunner | None = None
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False
        self._intake_stopped = False
        self._closing = False
        self._stopping = asyncio.Event()
        """Set once intake stops: wakes the polling loop out of its pauses."""
        self._unhandled: set[str] = set()
        self._commands: set[str] = set()
        self._migrated: dict[int | str, int] = {}
        # What each message Roost sent currently shows, as (text, parse_mode):
        # a final edit identical to the draft would be refused as "not modified".
        self._shown: OrderedDict[tuple[int | str, int], tuple[str, str | None]] = \
            OrderedDict()

    # -- lifecycle -------------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Check the token (``getMe``), then receive by long polling or webhook."""
        assert self.settings.telegram_bot_token is not None
        self._handler = handler
        _keep_response_models()
        base = self.settings.telegram_api_base
        api = TelegramAPIServer.from_base(base) if base else None
        session = _Session(api=api, timeout=self.request_timeout) if api else \
            _Session(timeout=self.request_timeout)
        self.bot = bot = Bot(self.settings.telegram_bot_token.get_secret_value(),
                             session=session)
        try:
            await self._connect(bot)
        except BaseException:
            await session.close()
            raise
        assert self.me is not None
        log.info("telegram: receiving as @%s by %s%s", self.me.username,
                 "webhook" if self._webhook else "long polling",
                 "" if LAZY else " (aiogram types built eagerly)")

    async def _connect(self, bot: Bot) -> None:
        try:
            self.me = await self._deliver(GetMe(), "getMe")
        except TelegramUnauthorizedError as exc:
            raise SetupError(f"Telegram refused the bot token ({exc.message}): check "
                             "TELEGRAM_BOT_TOKEN") from exc
        if not self.me.username:
            log.warning("telegram: the bot has no username: @mentions cannot be recognised")
        if self.settings.telegram_webhook_url:
            await self._start_webhook(self.settings.telegram_webhook_url)
            return
        # getUpdates is refused while a webhook is set (from an earlier webhook
        # deployment); pending updates are kept.
        await self._deliver(DeleteWebhook(drop_pending_updates=False), "deleteWebhook")
        self._polling = asyncio.create_task(self._poll(bot))

    async def _start_webhook(self, url: str) -> None:
        secret_setting = self.settings.telegram_webhook_secret
        # Without a secret anyone who learns the URL could inject updates, so
        # one is made up when none is configured: Telegram echoes it back.
        secret = secret_setting.get_secret_value() if secret_setting else \
            secrets.token_urlsafe(32)
        app = web.Application()
        app.router.add_post(urlsplit(url).path or "/", self._webhook_handler(secret))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, port=self.settings.telegram_webhook_port).start()
        self._webhook = runner
        try:
            await self._deliver(SetWebhook(url=url, secret_token=secret,
                                           allowed_updates=ALLOWED_UPDATES), "setWebhook")
        except BaseException:
            await runner.cleanup()
            self._webhook = None
            raise

    async def stop_intake(self) -> None:
        """Stop receiving at once; replies can still be sent until :meth:`stop`.

        A long poll in flight is cut (its connection closed), not waited for;
        an update whose handler is running is let finish, so it is either in
        the inbox or will be delivered again. The webhook endpoint answers 503
        from now on: Telegram keeps such updates and delivers them again later.
        """
        if self._intake_stopped:
            return
        self._intake_stopped = True
        self._stopping.set()
        if self._fetching is not None:
            self._fetching.cancel()
        if self._polling is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._polling), STOP_GRACE)
            except (TimeoutError, asyncio.CancelledError):
                self._polling.cancel()
            await asyncio.gather(self._polling, return_exceptions=True)

    async def stop(self) -> None:
        """Stop receiving (if not yet), let replies being sent finish, close the session."""
        if self._closing:
            return
        self._closing = True
        await self.stop_intake()
        self._stopped = True
        if self._webhook is not None:
            await self._webhook.cleanup()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE):
                await self._idle.wait()
        if self.bot is not None:
            await self.bot.session.close()

    @property
    def polling(self) -> asyncio.Task[None] | None:
        """The polling loop's task (``None`` in webhook mode or before ``start``)."""
        return self._polling

    # -- inbound: long polling ------------------------------------------------------

    async def _poll(self, bot: Bot) -> None:
        """Fetch updates and hand them to the core, one at a time, in order.

        The offset (Telegram's acknowledgement) moves past an update only once
        the handler returned for it. If the handler raises, the rest of the
        batch waits: after a pause the same offset is fetched again, and
        Telegram serves that update again.
        """
        offset: int | None = None
        fetch_failures = 0
        handler_failures = 0
        while not self._intake_stopped:
            self._fetching = asyncio.ensure_future(self._fetch(bot, offset))
            try:
                updates = await self._fetching
            except asyncio.CancelledError:
                if self._intake_stopped:
                    return
                raise
            except RateLimited as exc:
                # The limiter holds the next getUpdates until the window passed.
                log.warning("telegram: getUpdates rate limited; waiting %.0fs", exc.retry_after)
                continue
            except TelegramUnauthorizedError as exc:
                log.error("telegram: the bot token was refused (%s); polling stopped",
                          exc.message)
                return
            except Exception as exc:
                fetch_failures += 1
                delay = _backoff(self.poll_backoff, fetch_failures)
                log.warning("telegram: getUpdates failed (%s); retrying in %.1fs",
                            _describe(exc), delay)
                await self._pause(delay)
                continue
            finally:
                self._fetching = None
            fetch_failures = 0
            if not updates and isinstance(bot.session, _Session) and bot.session.unusable:
                # Only updates that cannot be confirmed (a broken or hostile server
                # serves them again at once): not a hot loop.
                await self._pause(self.poll_backoff)
            for update in updates:
                if self._intake_stopped:
                    return
                try:
                    await self._process(update)
                except Exception as exc:
                    handler_failures += 1
                    delay = _backoff(self.poll_backoff, handler_failures)
                    log.warning("telegram: update %d was not taken (%s); fetching it again "
                                "in %.1fs", update.update_id, _describe(exc), delay)
                    await self._pause(delay)
                    break
                handler_failures = 0
                offset = update.update_id + 1

    async def _fetch(self, bot: Bot, offset: int | None) -> list[Update]:
        method = GetUpdates(offset=offset, timeout=self.polling_timeout,
                            allowed_updates=ALLOWED_UPDATES)
        async with self.limiter.slot(GET_UPDATES):
            # The long poll may take its whole timeout; a dead connection is
            # noticed after a margin on top of it.
            return await _translated(bot(method, request_timeout=int(
                self.polling_timeout + self.request_timeout)))

    async def _pause(self, seconds: float) -> None:
        """Sleep, unless intake stops first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _process(self, update: Update) -> None:
        """Hand one update to the core; raises if the core did not take it."""
        if update.update_id in self._seen:
            log.info("telegram: update %d was delivered again; ignored", update.update_id)
            return
        inbound: InboundMessage | None = None
        if update.message is not None:
            try:
                inbound = self.translate(update.message, event_id=str(update.update_id))
            except Exception as exc:
                # A translation bug would fail the same way on every redelivery
                # and wedge the updates behind it: this one is skipped instead,
                # with one line saying where (a traceback per bad update would
                # let anyone who can message the bot flood the log).
                log.warning("telegram: update %d could not be translated (%s); skipped",
                            update.update_id, _where(exc))
        else:
            self._ignore(_update_kind(update), update.update_id)
        if inbound is not None and self._handler is not None:
            await self._handler(inbound)
        # Remembered only now: a redelivery after a failed handler must go through.
        self._seen[update.update_id] = None
        if len(self._seen) > SEEN_UPDATES:
            self._seen.popitem(last=False)

    async def feed_raw(self, raw: Any) -> None:
        """Handle one update as received (tests); malformed ones are skipped.

        Raises if the core's handler raised, as the webhook then answers 500.
        """
        update = parse_update(raw, self._bot())
        if update is not None:
            await self._process(update)

    # -- inbound: webhook -----------------------------------------------------------

    def _webhook_handler(self, secret: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            given = request.headers.get("X-Telegram-Bot-Api-Secret-Token", "")
            if not secrets.compare_digest(given.encode(), secret.encode()):
                return web.Response(status=HTTPStatus.UNAUTHORIZED, text="Unauthorized")
            if self._intake_stopped:
                # Shutting down: not taken, so Telegram keeps the update and
                # delivers it again to the next instance.
                return web.Response(status=HTTPStatus.SERVICE_UNAVAILABLE,
                                    text="Shutting down")
            body = await request.text()
            try:
                raw = json.loads(body)
            except (ValueError, RecursionError) as exc:
                # Telegram would retry a non-2xx answer for ever: acknowledged.
                found = _UPDATE_ID.search(body)
                log.warning("telegram: webhook update %s is not decodable JSON (%s); "
                            "acknowledged and skipped", found.group(1)[:24] if found else "?",
                            type(exc).__name__)
                return web.json_response({})
            update = parse_update(raw, self._bot())
            if update is None:
                return web.json_response({})
            try:
                await self._process(update)
            except Exception as exc:
                log.warning("telegram: update %d was not taken (%s); answering 500 so "
                            "Telegram delivers it again", update.update_id, _describe(exc))
                return web.json_response({}, status=HTTPStatus.INTERNAL_SERVER_ERROR)
            return web.json_response({})

        return handle

    def translate(self, message: Message, *, event_id: str = "") -> InboundMessage | None:
        """The core's view of ``message``, or ``None`` if it is not for Roost.

        ``event_id`` is the ``update_id`` that carried it (the inbox dedupes on it).

        Not for Roost: messages from bots (itself included), channel posts,
        commands addressed to another bot (``/help@other_bot``), service
        messages (members joining, pins...) and automatic forwards when
        ``telegram_automatic_forwards`` is ``"ignore"``. A message sent on
        behalf of a chat (a linked channel's automatic forward, an anonymous
        admin, a user posting as their channel) comes from that chat: the
        ``from`` of such messages is a placeholder account (Telegram, 777000;
        GroupAnonymousBot; Channel_Bot) that says nothing about who spoke.
        """
        chat_type: ChatType
        if message.chat.type == "private":
            chat_type = "direct"
        elif message.chat.type in ("group", "supergroup"):
            chat_type = "group"
        else:
            return None
        if self.me is None:
            return None
        speaker = self._speaker(message, event_id)
        if speaker is None:
            return None
        sender_id, sender_name = speaker
        attachments = _attachments(message)
        if message.text is not None:
            text, entities = message.text, message.entities or []
        else:
            text, entities = message.caption or "", message.caption_entities or []
        if not text and not attachments:
            kind = message.content_type
            self._ignore(f"{getattr(kind, 'value', kind)} message", event_id)
            return None
        me = self.me
        handle = f"@{me.username}".lower() if me.username else None
        mentioned = False
        drop: list[tuple[int, int]] = []
        units: bytes | None = None
        for entity in entities:
            if entity.type == "mention" and handle is not None \
                    and entity.length == len(handle) and entity.offset >= 0:
                # Offsets count UTF-16 units; the handle is ASCII, one unit a character.
                if units is None:
                    units = _utf16(text)
                start = entity.offset * 2
                found = units[start:start + entity.length * 2]
                if found.decode("utf-16-le", "surrogatepass").lower() == handle:
                    mentioned = True
                    drop.append((entity.offset, entity.length))
            elif entity.type == "text_mention" and entity.user is not None \
                    and entity.user.id == me.id:
                mentioned = True
        if drop:
            text = _without(text, drop)
        command = _COMMAND.match(text.lstrip())
        if command is not None:
            target = command.group(2)
            if target is not None:
                if me.username is None or target.lower() != me.username.lower():
                    return None
                # The core parses "/cmd args": drop our own @suffix.
                stripped = text.lstrip()
                text = f"/{command.group(1)}{stripped[command.end():]}"
            # Telegram's Start button sends /start (with a deep-link payload at
            # most); without a command of that name the core would answer
            # "I don't know /start", so it is shown the help instead.
            if command.group(1).lower() == "start" and "start" not in self._commands:
                text = "/help"
            mentioned = True
        replied = message.reply_to_message
        # In a forum topic every message "replies" to the topic's creation
        # message; that is not a reply to anyone.
        if replied is not None and replied.forum_topic_created is not None:
            replied = None
        if replied is not None and replied.from_user is not None \
                and replied.from_user.id == me.id:
            mentioned = True
        thread = message.message_thread_id if message.is_topic_message else None
        return InboundMessage(
            channel=self.name,
            chat_id=str(message.chat.id),
            chat_type=chat_type,
            sender_id=sender_id,
            sender_name=sender_name,
            text=text,
            message_id=str(message.message_id),
            reply_to=str(replied.message_id) if replied is not None else None,
            thread_id=str(thread) if thread is not None else None,
            mentioned=mentioned,
            attachments=attachments,
            raw=message,
            event_id=event_id,
        )

    def _speaker(self, message: Message, event_id: str) -> tuple[str, str] | None:
        """``(sender_id, sender_name)`` of ``message``, or ``None`` if Roost ignores its sender."""
        if message.is_automatic_forward:
            if self.settings.telegram_automatic_forwards == "ignore":
                log.debug("telegram: update %s is a channel post forwarded automatically "
                          "into %s; ignored (telegram_automatic_forwards)", event_id,
                          message.chat.id)
                return None
            origin = message.sender_chat
            if origin is None and isinstance(message.forward_origin, MessageOriginChannel):
                origin = message.forward_origin.chat
            if origin is None:
                # Without the channel only the placeholder account is left.
                log.debug("telegram: update %s is an automatic forward without its channel; "
                          "ignored", event_id)
                return None
            return str(origin.id), _short(_chat_name(origin))
        if message.sender_chat is not None:
            return str(message.sender_chat.id), _short(_chat_name(message.sender_chat))
        sender = message.from_user
        if sender is None or sender.is_bot or sender.id == SERVICE_USER:
            return None
        # Short: the name goes into every prompt line of the sender's, and Telegram's
        # own limits (64 characters a name, 128 a title) do not bind a forged update.
        return str(sender.id), _short(sender.full_name)

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

    # -- outbound -------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver a reply: rendered to HTML, cut to 4,096, the first piece threaded.

        With ``message.replace`` the draft of that id becomes the first piece.
        Returns the id of the last message sent; raises if the reply was not
        delivered (the core keeps it and tries again).
        """
        target = _Target.of(message.chat_id, message.thread_id, message.reply_to)
        async with self._sending_reply() as live:
            if not live:
                raise RuntimeError("the Telegram channel is stopped")
            return await self._deliver_reply(target, message.replace, message.text)

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete a message Roost sent (a stale draft); one already gone is fine."""
        async with self._sending_reply() as live:
            if not live:
                raise RuntimeError("the Telegram channel is stopped")
            await self._delete(_chat_id(chat_id), int(message_id))

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """A draft edited at most once per ``edit_interval``, unless streaming is off."""
        if not self.settings.streams(self.name):
            return None
        target = _Target.of(message.chat_id, message.thread_id,
                            message.message_id if message.chat_type == "group" else None)
        return _DraftStream(self, target, self.edit_interval)

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Keep "typing…" showing (Telegram clears it after 5 s) while the block runs."""
        task = asyncio.create_task(self._keep_typing(
            _chat_id(message.chat_id), _int_or_none(message.thread_id)))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """``setMyCommands``: everyone sees the public commands, admins' chats all of them."""
        self._commands = {name for c in commands for name in (c.name, *c.aliases)}
        public: list[BotCommand] = []
        admin: list[BotCommand] = []
        for command in commands:
            if not COMMAND_NAME.match(command.name):
                log.info("telegram: /%s is not a valid Telegram command name; not listed",
                         command.name)
                continue
            entry = BotCommand(command=command.name,
                               description=(command.description or command.name)[:256])
            (admin if command.admin_only else public).append(entry)
        await self._deliver(SetMyCommands(commands=public[:100]), "setMyCommands")
        if not admin:
            return
        for admin_entry in self.settings.admins:
            channel, _, user_id = admin_entry.partition(":")
            if channel != self.name or not user_id.lstrip("-").isdigit():
                continue
            # An admin's private chat has the admin's user id.
            scope = BotCommandScopeChat(chat_id=int(user_id))
            try:
                await self._deliver(SetMyCommands(commands=(public + admin)[:100], scope=scope),
                                    "setMyCommands (admin)")
            except Exception as exc:
                # Usually "chat not found": the admin has not started the bot yet.
                log.warning("telegram: admin commands for %s not registered: %s", user_id, exc)

    # -- calling the Bot API -------------------------------------------------------------

    def _bot(self) -> Bot:
        if self.bot is None:
            raise RuntimeError("the Telegram channel is not started")
        return self.bot

    async def _api(self, method: TelegramMethod[TelegramType], *,
                   urgent: bool = True) -> TelegramType | None:
        """One Bot API call through the rate limiter, errors translated.

        Returns ``None`` only for a call that is not ``urgent`` and had to give
        way (a 429 window, the budget, another call to the chat in flight).
        A group upgraded to a supergroup is followed: the call goes again to
        the new chat, and so does every later one.
        """
        bot = self._bot()
        for _ in range(3):
            chat = getattr(method, "chat_id", None)
            if chat in self._migrated:
                chat = self._migrated[chat]
                method = method.model_copy(update={"chat_id": chat})
            scope = BOT if chat is None else f"chat:{chat}"
            group = isinstance(chat, str) or (isinstance(chat, int) and chat < 0)
            try:
                async with self.limiter.slot(scope, group=group, urgent=urgent,
                                             counted=isinstance(method, _COUNTED)) as go:
                    if not go:
                        return None
                    return await _translated(bot(method))
            except ChatMigrated as moved:
                if chat is None:
                    raise
                log.info("telegram: chat %s became supergroup %d; following it", chat,
                         moved.chat_id)
                self._migrated[chat] = moved.chat_id
        raise RuntimeError(f"telegram: {method.__api_method__} kept being redirected")

    async def _deliver(self, method: TelegramMethod[TelegramType], what: str, *,
                       policy: DeliveryPolicy | None = None) -> TelegramType:
        """An urgent call, retried on transient errors and after 429s."""
        async def call() -> TelegramType:
            result = await self._api(method)
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

    def _remember_shown(self, chat: int | str, message_id: int, text: str,
                        mode: str | None) -> None:
        key = (self._migrated.get(chat, chat), message_id)
        self._shown[key] = (text, mode)
        self._shown.move_to_end(key)
        if len(self._shown) > SEEN_UPDATES:
            self._shown.popitem(last=False)

    def _shows(self, chat: int | str, message_id: int, text: str, mode: str | None) -> bool:
        return self._shown.get((self._migrated.get(chat, chat), message_id)) == (text, mode)

    # -- sending -------------------------------------------------------------------------

    async def _send_piece(self, target: _Target, source: str, *, urgent: bool = True,
                          policy: DeliveryPolicy | None = None) -> Message | None:
        """Send one piece as HTML; if Telegram cannot parse it, as the plain text.

        A final reply is retried after a reset or a timeout although it may
        have arrived: the Bot API has no idempotency key, and Roost prefers a
        rare duplicate to a lost answer (at-least-once). Drafts (``urgent``
        false) are tried once and give way to rate limits: ``None`` then.
        """
        reply = ReplyParameters(message_id=target.reply_to, allow_sending_without_reply=True) \
            if target.reply_to is not None else None
        for text, mode in ((to_html(source), "HTML"), (source, None)):
            method = SendMessage(chat_id=target.chat_id, text=text, parse_mode=mode,
                                 message_thread_id=target.thread_id, reply_parameters=reply)
            try:
                if urgent:
                    sent: Message | None = await self._deliver(method, "sendMessage",
                                                               policy=policy)
                else:
                    sent = await self._api(method, urgent=False)
            except TelegramBadRequest as exc:
                if mode is None or not _entity_error(exc):
                    raise
                log.warning("telegram: HTML refused (%s); sending the piece as plain text",
                            exc.message)
                continue
            if sent is not None:
                self._remember_shown(sent.chat.id, sent.message_id, text, mode)
            return sent
        raise AssertionError("unreachable")

    async def _edit(self, target: _Target, message_id: int, source: str, *,
                    urgent: bool = True) -> bool:
        """Show ``source`` in message ``message_id``; ``False`` if a draft edit gave way.

        An edit to what the message already shows is not made (Telegram would
        refuse it as "message is not modified"); that answer, should it come
        anyway (a retry after the first attempt took effect), means success.
        """
        for text, mode in ((to_html(source), "HTML"), (source, None)):
            if self._shows(target.chat_id, message_id, text, mode):
                return True
            method = EditMessageText(chat_id=target.chat_id, message_id=message_id, text=text,
                                     parse_mode=mode)
            try:
                if urgent:
                    await self._deliver(method, "editMessageText")
                elif await self._api(method, urgent=False) is None:
                    return False
            except TelegramBadRequest as exc:
                if _not_modified(exc):
                    self._remember_shown(target.chat_id, message_id, text, mode)
                    return True
                if mode is None or not _entity_error(exc):
                    raise
                continue
            self._remember_shown(target.chat_id, message_id, text, mode)
            return True
        raise AssertionError("unreachable")

    async def _delete(self, chat_id: int | str, message_id: int) -> None:
        try:
            await self._deliver(DeleteMessage(chat_id=chat_id, message_id=message_id),
                                "deleteMessage")
        except TelegramBadRequest as exc:
            # Gone already (deleted by someone, or our own earlier attempt took
            # effect before its answer was lost).
            if "message to delete not found" not in exc.message.lower():
                raise
            log.info("telegram: message %d in %s was already gone", message_id, chat_id)
        self._shown.pop((self._migrated.get(chat_id, chat_id), message_id), None)

    async def _deliver_reply(self, target: _Target, draft_id: str | None,
                             text: str | None) -> str | None:
        """The final reply: the draft (if any) becomes its first piece, the rest follow.

        A draft whose final edit fails for good is not left showing a partial
        reply: the reply is sent anew and the draft deleted. ``text=None``
        removes the draft. Returns the id of the last message sent.
        """
        pieces = split_for_telegram(text) if text is not None else []
        draft = int(draft_id) if draft_id and draft_id.lstrip("-").isdigit() else None
        last: str | None = None
        stale = False
        if draft is not None:
            if not pieces:
                await self._delete(target.chat_id, draft)
                return None
            try:
                await self._edit(target, draft, pieces[0])
                pieces, last = pieces[1:], str(draft)
            except Exception as exc:
                log.warning("telegram: could not put the reply into draft %d (%s); sending "
                            "it anew", draft, _describe(exc))
                stale = True
        for index, piece in enumerate(pieces):
            first = index == 0 and last is None
            sent = await self._send_piece(target if first else _unthreaded(target), piece)
            assert sent is not None
            last = str(sent.message_id)
        if stale and draft is not None:
            try:
                await self._delete(target.chat_id, draft)
            except Exception as exc:
                # The reply is out; only the stale draft stays. The core journals
                # its id and withdraws it later.
                log.warning("telegram: stale draft %d not deleted (%s)", draft, _describe(exc))
        return last

    async def _keep_typing(self, chat_id: int | str, thread_id: int | None) -> None:
        """Refresh "typing…"; it gives way to every other call to the chat."""
        while not self._stopped:
            try:
                await self._api(SendChatAction(chat_id=chat_id, action="typing",
                                               message_thread_id=thread_id), urgent=False)
            except Exception as exc:
                log.debug("telegram: typing status not sent: %s", _describe(exc))
            await asyncio.sleep(self.typing_interval)


class _DraftStream:
    """A reply streamed into one Telegram message, edited at most once per ``interval``.

    Drafts give way to rate limits: a first draft that could not be shown is
    tried again on the next push, an edit that could not be made is dropped
    (the next one or the final reply supersedes it). ``message_id`` is the
    draft's id once one is shown, and after ``finish`` the id of the reply's
    last message (``None`` if nothing is shown).
    """

    def __init__(self, channel: TelegramChannel, target: _Target, interval: float) -> None:
        self.channel = channel
        self.target = target
        self.interval = interval
        self.message_id: str | None = None
        self._last = 0.0
        self._pending: str | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._editing = False

    async def push(self, text_so_far: str) -> None:
        """Show the reply so far (the whole text each time)."""
        draft = fit(text_so_far)
        if self.message_id is None:
            sent = await self._first(draft)
            if sent is not None:
                self.message_id = str(sent.message_id)
                self._last = time.monotonic()
            return
        self._pending = draft
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _first(self, draft: str) -> Message | None:
        async with self.channel._sending_reply() as live:
            if not live:
                return None
            try:
                return await self.channel._send_piece(self.target, draft, urgent=False,
                                                      policy=_DRAFT_POLICY)
            except Exception as exc:
                log.warning("telegram: streaming draft not shown (%s)", _describe(exc))
                return None

    async def _flush_later(self) -> None:
        await asyncio.sleep(max(0.0, self._last + self.interval - time.monotonic()))
        draft, self._pending = self._pending, None
        if draft is None or self.message_id is None:
            return
        self._editing = True
        try:
            async with self.channel._sending_reply() as live:
                if live:
                    await self.channel._edit(self.target, int(self.message_id), fit(draft),
                                             urgent=False)
        except Exception as exc:
            log.warning("telegram: a streaming edit failed (%s); the final reply will "
                        "still be sent", _describe(exc))
        finally:
            self._editing = False
            self._last = time.monotonic()

    async def finish(self, final_text: str | None) -> None:
        """Deliver the final reply into the draft (``None``: remove the draft)."""
        flusher = self._flusher
        if flusher is not None and not flusher.done():
            if self._editing:
                # An edit in flight is let finish: cut off, its 429 would go
                # unseen and the final reply would land inside the window.
                await asyncio.gather(flusher, return_exceptions=True)
            else:
                flusher.cancel()
                await asyncio.gather(flusher, return_exceptions=True)
        async with self.channel._sending_reply() as live:
            if not live:
                raise RuntimeError("the Telegram channel is stopped")
            # Once delivered, the id is that of the reply's last message (the core
            # records it); if this raises, it stays the draft's, to be replaced.
            self.message_id = await self.channel._deliver_reply(self.target, self.message_id,
                                                                final_text)


# -- receiving: tolerant parsing ------------------------------------------------------


class _Reported:
    """Update ids already warned about: a batch fetched again (after the handler
    refused an earlier update) must not repeat the warning for a bad one."""

    def __init__(self) -> None:
        self._ids: OrderedDict[int, None] = OrderedDict()

    def first(self, update_id: int) -> bool:
        if update_id in self._ids:
            return False
        self._ids[update_id] = None
        if len(self._ids) > SEEN_UPDATES:
            self._ids.popitem(last=False)
        return True


def parse_update(raw: Any, bot: Bot, reported: _Reported | None = None) -> Update | None:
    """``raw`` as an :class:`Update`; a malformed one is logged and becomes an empty one.

    The empty update keeps its ``update_id``, so polling still confirms it
    (otherwise the server would send it again forever); one without a usable
    id cannot be confirmed and is dropped. With ``reported``, an update is
    warned about only the first time.
    """
    try:
        update = Update.model_validate(raw, context={"bot": bot})
    except (ValidationError, RecursionError) as exc:
        update_id = raw.get("update_id") if isinstance(raw, dict) else None
        if isinstance(exc, ValidationError) and exc.errors():
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "the update"
            why = f"{where}: {error['msg']}"
        else:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        if isinstance(update_id, int) and not isinstance(update_id, bool):
            if not _possible(update_id):
                _impossible(update_id, reported)
                return None
            if reported is None or reported.first(update_id):
                log.warning("telegram: update %d is malformed (%s); skipped", update_id, why)
            return Update(update_id=update_id)
        log.warning("telegram: an update without a valid update_id was skipped (%s)", why)
        return None
    if not _possible(update.update_id):
        _impossible(update.update_id, reported)
        return None
    return update


MAX_UPDATE_ID = 2_000_000_000
"""The highest update id the Bot API server gives (its queue's ``MAX_ID``). The server
reads ``offset`` as a 32-bit integer, so the offset after any real id still fits."""


def _possible(update_id: int) -> bool:
    return 0 < update_id <= MAX_UPDATE_ID


def _impossible(update_id: int, reported: _Reported | None) -> None:
    """Skip an update whose id Telegram cannot have given (from a broken or hostile server).

    It is not confirmed: the offset after it would be out of range, and the
    server reads an offset that is negative (or wraps to negative) as "forget
    every queued update". Polling pauses when such updates are all it gets.
    """
    if reported is None or reported.first(update_id):
        shown = str(update_id) if len(str(update_id)) <= 24 else f"{str(update_id)[:20]}..."
        log.warning("telegram: an update with the impossible id %s was skipped", shown)


def _undecodable(text: str, reported: _Reported, exc: Exception) -> Update | None:
    """An update whose JSON cannot be decoded (nested beyond the decoder's depth, a
    number longer than Python converts).

    Its ``update_id`` is read with a pattern so it can still be confirmed.
    """
    why = "nested too deeply" if isinstance(exc, RecursionError) else \
        str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    found = _UPDATE_ID.search(text)
    if found is None:
        log.warning("telegram: an undecodable update without an update_id was skipped (%s)",
                    why)
        return None
    # A prefix: int() refuses thousands of digits, and any such id is impossible anyway.
    update_id = int(found.group(1)[:40])
    if not _possible(update_id):
        _impossible(update_id, reported)
        return None
    if reported.first(update_id):
        log.warning("telegram: update %d is not decodable (%s); skipped", update_id, why)
    return Update(update_id=update_id)


def _string_end(text: str, start: int) -> int:
    """The index after the JSON string opening at ``start`` (-1: never closed)."""
    at = start + 1
    while True:
        quote = text.find('"', at)
        if quote < 0:
            return -1
        slashes = 0
        while text[quote - 1 - slashes] == "\\":
            slashes += 1
        if slashes % 2 == 0:
            return quote + 1
        at = quote + 1


def result_elements(text: str) -> list[str] | None:
    """The raw text of each element of the top-level ``"result"`` array of ``text``.

    An iterative scan (strings, escapes, bracket depth) that needs no
    recursion, so it splits a response that ``json.loads`` cannot decode
    because one element nests too deeply; each element is then decoded on
    its own. ``None`` when there is no such array or the text is cut short.
    """
    depth = 0
    key: str | None = None
    at, end = 0, len(text)
    array_start = -1
    while at < end:
        char = text[at]
        if char == '"':
            close = _string_end(text, at)
            if close < 0:
                return None
            if depth == 1:
                key = text[at:close]
            at = close
            continue
        if char in "[{":
            if depth == 1 and char == "[" and key == '"result"':
                array_start = at
                break
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 1:
            key = None
        at += 1
    if array_start < 0:
        return None
    elements: list[str] = []
    depth = 0
    begin = array_start + 1
    at = array_start
    while at < end:
        char = text[at]
        if char == '"':
            close = _string_end(text, at)
            if close < 0:
                return None
            at = close
            continue
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                last = text[begin:at].strip()
                if last:
                    elements.append(last)
                return elements
        elif char == "," and depth == 1:
            elements.append(text[begin:at].strip())
            begin = at + 1
        at += 1
    return None


class _Session(AiohttpSession):
    """aiogram's session, except that one bad update no longer poisons a getUpdates batch.

    aiogram validates the whole ``getUpdates`` answer at once: a single
    update it cannot parse fails the call, the offset never moves past it,
    and polling retries the same batch forever. Here each update is decoded
    and validated on its own and a malformed one becomes an empty update
    that is confirmed and skipped. An update nested too deeply for the JSON
    decoder makes the whole answer undecodable; the ``result`` array is then
    split without decoding and each element decoded alone.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reported = _Reported()
        self.unusable = 0
        """Updates of the last ``getUpdates`` answer that could not even be confirmed."""

    def check_response(self, bot: Bot, method: TelegramMethod[TelegramType],
                       status_code: int, content: str) -> Response[TelegramType]:
        if isinstance(method, GetUpdates) and HTTPStatus.OK <= status_code <= HTTPStatus.IM_USED:
            updates = self._updates(bot, content)
            if updates is not None:
                return cast("Response[TelegramType]",
                            Response[list[Update]](ok=True, result=updates))
        return super().check_response(bot, method, status_code, content)

    def _updates(self, bot: Bot, content: str) -> list[Update] | None:
        self.unusable = 0
        try:
            data = self.json_loads(content)
        except (ValueError, RecursionError):
            # One update may be what the decoder refuses (nested too deeply, a
            # number of thousands of digits): the others are decoded alone. An
            # answer that is not JSON at all has no result array to split.
            elements = result_elements(content)
            if elements is None:
                return None
            updates: list[Update] = []
            for element in elements:
                try:
                    raw = self.json_loads(element)
                except (ValueError, RecursionError) as exc:
                    update = _undecodable(element, self.reported, exc)
                else:
                    update = parse_update(raw, bot, self.reported)
                if update is not None:
                    updates.append(update)
            self.unusable = len(elements) - len(updates)
            return updates
        if isinstance(data, dict) and data.get("ok") is True \
                and isinstance(data.get("result"), list):
            updates = [u for raw in data["result"]
                       if (u := parse_update(raw, bot, self.reported)) is not None]
            self.unusable = len(data["result"]) - len(updates)
            return updates
        return None


# -- helpers ----------------------------------------------------------------------------


async def _translated(call: Awaitable[T]) -> T:
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
        raise Transient(f"undecodable answer ({_describe(exc)})") from exc
    except TelegramNetworkError as exc:
        raise Transient(f"network: {exc.message}") from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        # aiogram wraps these; kept in case an error escapes its wrapping.
        raise Transient(f"network: {type(exc).__name__}: {exc}") from exc


def _describe(exc: BaseException) -> str:
    """One short line for a log: aiogram's ClientDecodeError would print a whole HTML page."""
    if isinstance(exc, ClientDecodeError):
        return f"{exc.message}: {type(exc.original).__name__}"
    if isinstance(exc, TelegramAPIError):
        return f"{type(exc).__name__}: {exc.message}"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def _backoff(base: float, failures: int) -> float:
    """Exponential pause with jitter, capped, after ``failures`` failures in a row."""
    delay = min(POLL_BACKOFF_CAP, base * 2 ** min(failures - 1, 16))
    return float(min(POLL_BACKOFF_CAP, delay * random.uniform(0.75, 1.25)))


def _entity_error(exc: TelegramBadRequest) -> bool:
    return "can't parse entities" in exc.message.lower()


def _not_modified(exc: TelegramBadRequest) -> bool:
    return "message is not modified" in exc.message.lower()


def _unthreaded(target: _Target) -> _Target:
    """The same chat and topic, not replying: for the pieces after the first."""
    return _Target(target.chat_id, target.thread_id)


def _chat_id(chat_id: str) -> int | str:
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def _utf16(text: str) -> bytes:
    """``text`` in UTF-16-LE, the unit of Telegram's entity offsets.

    Lone surrogates (valid in JSON: ``"\\ud83d"``) are kept as the code units
    they are, so every offset after them still points where Telegram meant;
    the core replaces them once the text is in its own hands.
    """
    return text.encode("utf-16-le", "surrogatepass")


def _without(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` minus the entity spans (UTF-16 offsets), tidied where a span was cut."""
    data = _utf16(text)
    pieces: list[bytes] = []
    at = 0
    # One pass, not one copy of the text per span: a hostile message may carry
    # thousands of mentions in a megabyte of text.
    for offset, length in sorted(spans):
        start, end = offset * 2, (offset + length) * 2
        if start > at:
            pieces.append(data[at:start])
        at = max(at, end)
    pieces.append(data[at:])
    result = b"".join(pieces).decode("utf-16-le", "surrogatepass")
    if any(offset == 0 for offset, _ in spans):
        # "@bot, do this" → "do this"
        result = re.sub(r"^[\s,:;]+", "", result)
    return re.sub(r"[ \t]{2,}", " ", result).strip()


def _where(exc: BaseException) -> str:
    """The exception and the innermost line it came from, on one line."""
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    place = f" at {Path(frame[0].filename).name}:{frame[0].lineno}" if frame else ""
    return f"{_describe(exc)}{place}"


def _update_kind(update: Update) -> str:
    """The name of what ``update`` carries (``callback_query``, ``my_chat_member``...)."""
    for name in type(update).model_fields:
        if name != "update_id" and getattr(update, name, None) is not None:
            return name
    extra = update.model_extra
    # A kind newer than this aiogram: the server's field name, kept as an extra.
    return next(iter(extra), "empty update") if extra else "empty update"


def _chat_name(chat: Chat) -> str:
    """What a chat speaking as a sender is called: its title, else its name."""
    names = " ".join(n for n in (chat.first_name, chat.last_name) if n)
    return chat.title or names or (f"@{chat.username}" if chat.username else "")


DESCRIPTION = 300
"""Characters kept of each piece of an attachment's description (a poll's question,
a venue's address...): enough for the model, and a hostile megabyte stays out."""


def _short(value: object) -> str:
    """``value`` as text for a description: clean, on one line, at most DESCRIPTION long."""
    text = clean_text(str(value)).replace("\x00", "")
    text = " ".join(text.split())
    return text if len(text) <= DESCRIPTION else f"{text[:DESCRIPTION - 1]}…"


def _media(kind: str, media: Any, *details: object) -> Attachment:
    """An attachment for a file Telegram holds (not downloaded), with its metadata."""
    name = getattr(media, "file_name", None)
    described = ", ".join(_short(d) for d in (name, *details) if d not in (None, ""))
    mime = getattr(media, "mime_type", None)
    size = getattr(media, "file_size", None)
    return Attachment(kind, name=described, mime_type=_short(mime) if mime else "",
                      size=size if isinstance(size, int) and size > 0 else 0)


def _duration(seconds: object) -> str:
    if not isinstance(seconds, int) or seconds < 0:
        return ""
    return f"{seconds // 60}:{seconds % 60:02d}"


def _size(width: object, height: object) -> str:
    return f"{width}x{height}" if isinstance(width, int) and isinstance(height, int) else ""


def _attachments(message: Message) -> tuple[Attachment, ...]:
    """What came with ``message`` besides its text, described for the model.

    Files stay on Telegram's servers; their metadata is kept. Everything else
    (a location, a contact, a poll...) is described in the attachment's name,
    so the core can tell the model what arrived.
    """
    found: list[Attachment] = []
    if message.photo:
        biggest = message.photo[-1]
        found.append(_media("image", biggest, _size(biggest.width, biggest.height)))
    if message.animation is not None:
        # A GIF comes with the same file as ``document`` too: one attachment.
        found.append(_media("animation", message.animation,
                            _size(message.animation.width, message.animation.height),
                            _duration(message.animation.duration)))
    elif message.document is not None:
        found.append(_media("file", message.document))
    if message.audio is not None:
        audio = message.audio
        title = " - ".join(_short(x) for x in (audio.performer, audio.title) if x)
        found.append(_media("audio", audio, title, _duration(audio.duration)))
    if message.voice is not None:
        found.append(_media("voice message", message.voice, _duration(message.voice.duration)))
    if message.video is not None:
        video = message.video
        found.append(_media("video", video, _size(video.width, video.height),
                            _duration(video.duration)))
    if message.video_note is not None:
        found.append(_media("video message", message.video_note,
                            _duration(message.video_note.duration)))
    if message.sticker is not None:
        sticker = message.sticker
        found.append(Attachment("sticker", name=", ".join(x for x in (
            _short(sticker.emoji or ""),
            f"from the set {_short(sticker.set_name)}" if sticker.set_name else "") if x)))
    if message.venue is not None:
        # A venue carries its location too: one attachment.
        venue = message.venue
        found.append(Attachment("venue", name=", ".join(x for x in (
            _short(venue.title), _short(venue.address),
            _coordinates(venue.location.latitude, venue.location.longitude)) if x)))
    elif message.location is not None:
        where = message.location
        live = " (live)" if where.live_period else ""
        found.append(Attachment("location", name=_coordinates(where.latitude,
                                                              where.longitude) + live))
    if message.contact is not None:
        contact = message.contact
        name = " ".join(x for x in (contact.first_name, contact.last_name) if x)
        found.append(Attachment("contact", name=", ".join(
            _short(x) for x in (name, contact.phone_number) if x)))
    if message.poll is not None:
        poll = message.poll
        options = " / ".join(_short(o.text) for o in poll.options[:12])
        found.append(Attachment("quiz" if poll.type == "quiz" else "poll",
                                name=f"{_short(poll.question)}: {options}"))
    if message.dice is not None:
        found.append(Attachment("dice", name=f"{_short(message.dice.emoji)} "
                                             f"showing {message.dice.value}"))
    for kind, value, detail in (
            ("game", message.game, lambda g: g.title),
            ("story", message.story, lambda s: _chat_name(s.chat)),
            ("invoice", message.invoice, lambda i: f"{i.title}, {i.total_amount} {i.currency}"),
            ("checklist", message.checklist, lambda c: c.title),
            ("giveaway", message.giveaway, lambda g: f"{g.winner_count} winners"),
            ("paid media", message.paid_media, lambda p: f"{len(p.paid_media)} items"),
            ("live photo", message.live_photo, lambda _: ""),
    ):
        if value is not None:
            found.append(Attachment(kind, name=_short(detail(value))))
    return tuple(found)


def _coordinates(latitude: float, longitude: float) -> str:
    return f"{latitude:.6g},{longitude:.6g}"


_RESPONSE_MODELS: list[Any] = []


def _keep_response_models() -> None:
    """Build the ``Response[...]`` model of each method Roost calls once, and keep it.

    aiogram parametrizes ``Response[method.__returning__]`` on every call, and
    pydantic caches parametrized models only weakly: each time the garbage
    collector takes one, the next call builds it again (about 6 ms for a
    ``Message``, once per reply). Holding them makes the cache hit.
    """
    if _RESPONSE_MODELS:
        return
    methods: tuple[Any, ...] = (GetMe, GetUpdates, SendMessage, EditMessageText,
                                DeleteMessage, SendChatAction, SetMyCommands, SetWebhook,
                                DeleteWebhook)
    generic: Any = Response
    _RESPONSE_MODELS.extend(generic[m.__returning__] for m in methods)
