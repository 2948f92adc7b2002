"""The Telegram channel: Bot API updates in, HTML replies out, through aiogram.

The adapter only translates. A ``message`` update becomes an
:class:`InboundMessage` (private chats are ``direct``; groups and supergroups
``group``; a forum topic is its own ``thread_id``) and goes to the core, which
applies the DM and group policies; the adapter's part is to say whether the
bot was addressed (``mentioned``). Replies are rendered from the model's
Markdown to Telegram HTML, cut at 4,096 characters, and sent with retries
that honour ``retry_after``.

Updates arrive by long polling (aiogram's ``Dispatcher.start_polling``) or,
when ``telegram_webhook_url`` is set, on an aiohttp server that Telegram
POSTs to, checked with the secret-token header.
"""

from __future__ import annotations

# Before any aiogram import: it makes aiogram's types build on first use
# (importing aiogram otherwise costs about 2.4 s and 150 MB).
from channels.telegram_lazy import LAZY  # isort: split

import asyncio
import contextlib
import logging
import re
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit

import aiohttp
from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    TelegramAPIError,
    TelegramBadRequest,
    TelegramNetworkError,
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
    Message,
    ReplyParameters,
    TelegramObject,
    Update,
    User,
)
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web
from pydantic import ValidationError

from bot.app import SetupError
from bot.channel import Channel, InboundHandler, ReplyStream
from bot.messages import Attachment, ChatType, InboundMessage, OutboundMessage
from channels.delivery import DeliveryPolicy, EditStream, RateLimited, Transient, deliver
from channels.telegram_format import MAX_TEXT, fit, split_for_telegram, to_html

if TYPE_CHECKING:
    from bot.commands import Command
    from bot.config import Settings

log = logging.getLogger("roost.channels.telegram")

T = TypeVar("T")

ALLOWED_UPDATES = ["message"]
"""The only update type Roost acts on; Telegram then sends no others."""
SEEN_UPDATES = 4096
"""Recent update ids remembered to drop redeliveries."""
COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")
"""What Telegram accepts as a command name in ``setMyCommands``."""
_COMMAND = re.compile(r"^/([A-Za-z0-9_]{1,64})(?:@([A-Za-z0-9_]{1,64}))?(?=\s|$)")
_DRAFT_POLICY = DeliveryPolicy(attempts=1)
"""Drafts are not retried: the next edit or the final reply supersedes them."""
STOP_GRACE = 10.0
"""Seconds ``stop()`` waits for replies still being sent."""


@dataclass(frozen=True, slots=True)
class _Target:
    """Where a reply goes: the chat, its forum topic, and the message it answers."""

    chat_id: int | str
    thread_id: int | None = None
    reply_to: int | None = None

    @classmethod
    def of(cls, chat_id: str, thread_id: str | None, reply_to: str | None) -> _Target:
        return cls(_chat_id(chat_id), _int_or_none(thread_id), _int_or_none(reply_to))


class TelegramChannel(Channel):
    """Roost on Telegram (``TELEGRAM_BOT_TOKEN``).

    Keyword arguments exist for tests and benchmarks: ``polling_timeout`` is
    the long-poll wait in seconds, ``edit_interval`` the minimum time between
    streaming edits, ``typing_interval`` how often the typing status is
    refreshed, ``policy`` the retry policy for replies.
    """

    name = "telegram"

    def __init__(self, settings: Settings, *, polling_timeout: int = 30,
                 edit_interval: float = 1.0, typing_interval: float = 4.0,
                 policy: DeliveryPolicy | None = None) -> None:
        if settings.telegram_bot_token is None:
            raise ValueError("the Telegram channel needs TELEGRAM_BOT_TOKEN")
        self.settings = settings
        self.polling_timeout = polling_timeout
        self.edit_interval = edit_interval
        self.typing_interval = typing_interval
        self.policy = policy or DeliveryPolicy()
        self.bot: Bot | None = None
        self.me: User | None = None
        self.dispatcher: Dispatcher | None = None
        self._handler: InboundHandler | None = None
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._polling: asyncio.Task[None] | None = None
        self._webhook: web.AppRunner | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False
        self._commands: set[str] = set()

    # -- lifecycle -------------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Check the token (``getMe``), then receive by long polling or webhook."""
        assert self.settings.telegram_bot_token is not None
        self._handler = handler
        _quiet_aiogram()
        _keep_response_models()
        base = self.settings.telegram_api_base
        session = _Session(api=TelegramAPIServer.from_base(base)) if base else _Session()
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
            self.me = await deliver(lambda: _translated(bot.me()), what="telegram getMe",
                                    policy=self.policy)
        except TelegramUnauthorizedError as exc:
            raise SetupError(f"Telegram refused the bot token ({exc.message}): check "
                             "TELEGRAM_BOT_TOKEN") from exc
        if not self.me.username:
            log.warning("telegram: the bot has no username: @mentions cannot be recognised")
        # FSM storage would cost a lookup per update and Roost keeps no FSM state.
        self.dispatcher = dp = Dispatcher(disable_fsm=True)
        dp.update.outer_middleware(self._gate)
        dp.message.register(self._on_message)
        if self.settings.telegram_webhook_url:
            await self._start_webhook(bot, dp, self.settings.telegram_webhook_url)
            return
        # getUpdates is refused while a webhook is set (from an earlier webhook
        # deployment); pending updates are kept.
        await deliver(lambda: _translated(bot.delete_webhook(drop_pending_updates=False)),
                      what="telegram deleteWebhook", policy=self.policy)
        self._polling = asyncio.create_task(dp.start_polling(
            bot, polling_timeout=self.polling_timeout, handle_as_tasks=False,
            handle_signals=False, close_bot_session=False, allowed_updates=ALLOWED_UPDATES))

    async def _start_webhook(self, bot: Bot, dp: Dispatcher, url: str) -> None:
        secret_setting = self.settings.telegram_webhook_secret
        # Without a secret anyone who learns the URL could inject updates, so
        # one is made up when none is configured: Telegram echoes it back.
        secret = secret_setting.get_secret_value() if secret_setting else \
            secrets.token_urlsafe(32)
        app = web.Application()
        _WebhookHandler(self, dispatcher=dp, bot=bot, secret_token=secret).register(
            app, path=urlsplit(url).path or "/")
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, port=self.settings.telegram_webhook_port).start()
        self._webhook = runner
        try:
            await deliver(lambda: _translated(bot.set_webhook(
                url, secret_token=secret, allowed_updates=ALLOWED_UPDATES)),
                what="telegram setWebhook", policy=self.policy)
        except BaseException:
            await runner.cleanup()
            self._webhook = None
            raise

    async def stop(self) -> None:
        """Stop receiving, let replies being sent finish, close the HTTP session."""
        if self._stopped:
            return
        self._stopped = True
        dp, polling = self.dispatcher, self._polling
        if polling is not None and dp is not None:
            with contextlib.suppress(RuntimeError):  # not started yet: cancel the task
                await dp.stop_polling()
            polling.cancel()
            await asyncio.gather(polling, return_exceptions=True)
        if self._webhook is not None:
            await self._webhook.cleanup()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE):
                await self._idle.wait()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.bot is not None:
            await self.bot.session.close()

    # -- inbound ------------------------------------------------------------------

    async def _gate(self, handler: Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]],
                    event: TelegramObject, data: dict[str, Any]) -> Any:
        """Drop redelivered updates and ones Roost cannot use, before aiogram routes them."""
        if not isinstance(event, Update):
            return None
        if event.update_id in self._seen:
            log.info("telegram: update %d was delivered again; ignored", event.update_id)
            return None
        self._seen[event.update_id] = None
        if len(self._seen) > SEEN_UPDATES:
            self._seen.popitem(last=False)
        if event.message is None:
            log.debug("telegram: update %d has no message; ignored", event.update_id)
            return None
        return await handler(event, data)

    async def _on_message(self, message: Message) -> None:
        try:
            inbound = self.translate(message)
            if inbound is not None and self._handler is not None:
                await self._handler(inbound)
        except Exception:
            # One bad message must not stop the updates behind it.
            log.exception("telegram: message %s in chat %s could not be handled",
                          message.message_id, message.chat.id)

    async def feed_raw(self, raw: Any) -> None:
        """Handle one update as received (webhook body, tests); malformed ones are skipped."""
        assert self.bot is not None and self.dispatcher is not None
        update = parse_update(raw, self.bot)
        if update is not None:
            await self.dispatcher.feed_update(self.bot, update)

    def translate(self, message: Message) -> InboundMessage | None:
        """The core's view of ``message``, or ``None`` if it is not for Roost.

        Not for Roost: messages from bots (itself included), channel posts,
        and commands addressed to another bot (``/help@other_bot``).
        """
        sender = message.from_user
        if sender is None or sender.is_bot or self.me is None:
            return None
        chat_type: ChatType
        if message.chat.type == "private":
            chat_type = "direct"
        elif message.chat.type in ("group", "supergroup"):
            chat_type = "group"
        else:
            return None
        if message.text is not None:
            text, entities = message.text, message.entities or []
        else:
            text, entities = message.caption or "", message.caption_entities or []
        me = self.me
        handle = f"@{me.username}".lower() if me.username else None
        mentioned = False
        drop: list[tuple[int, int]] = []
        for entity in entities:
            if entity.type == "mention" and handle is not None \
                    and entity.extract_from(text).lower() == handle:
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
            sender_id=str(sender.id),
            sender_name=sender.full_name,
            text=text,
            message_id=str(message.message_id),
            reply_to=str(replied.message_id) if replied is not None else None,
            thread_id=str(thread) if thread is not None else None,
            mentioned=mentioned,
            attachments=_attachments(message),
            raw=message,
        )

    # -- outbound -------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> None:
        """Deliver a reply: rendered to HTML, cut to 4,096, the first piece threaded."""
        target = _Target.of(message.chat_id, message.thread_id, message.reply_to)
        async with self._sending_reply() as live:
            if not live:
                log.warning("telegram: reply to %s dropped: the channel is stopped",
                            message.chat_id)
                return
            for index, piece in enumerate(split_for_telegram(message.text)):
                await self._send_piece(target if index == 0 else _unthreaded(target), piece,
                                       self.policy)

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """A draft edited at most once per ``edit_interval``, unless streaming is off."""
        if not self.settings.streams(self.name):
            return None
        target = _Target.of(message.chat_id, message.thread_id,
                            message.message_id if message.chat_type == "group" else None)
        return EditStream(
            send=lambda text: self._draft(target, text),
            edit=lambda mid, text: self._edit_draft(target, mid, text),
            finalize=lambda mid, text: self._finalize(target, mid, text),
            limit=MAX_TEXT, interval=self.edit_interval)

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
        bot = self._bot()
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
        await deliver(lambda: _translated(bot.set_my_commands(public[:100])),
                      what="telegram setMyCommands", policy=self.policy)
        if not admin:
            return
        for admin_entry in self.settings.admins:
            channel, _, user_id = admin_entry.partition(":")
            if channel != self.name or not user_id.lstrip("-").isdigit():
                continue
            # An admin's private chat has the admin's user id.
            scope = BotCommandScopeChat(chat_id=int(user_id))
            try:
                await deliver(_set_commands(bot, (public + admin)[:100], scope),
                              what="telegram setMyCommands (admin)", policy=self.policy)
            except Exception as exc:
                # Usually "chat not found": the admin has not started the bot yet.
                log.warning("telegram: admin commands for %s not registered: %s", user_id, exc)

    # -- sending helpers ---------------------------------------------------------------

    def _bot(self) -> Bot:
        if self.bot is None:
            raise RuntimeError("the Telegram channel is not started")
        return self.bot

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

    async def _send_piece(self, target: _Target, source: str,
                          policy: DeliveryPolicy) -> Message:
        """Send one piece as HTML; if Telegram cannot parse it, as the plain text."""
        bot = self._bot()
        reply = ReplyParameters(message_id=target.reply_to, allow_sending_without_reply=True) \
            if target.reply_to is not None else None

        def call(text: str, mode: str | None) -> Callable[[], Awaitable[Message]]:
            return lambda: _translated(bot.send_message(
                chat_id=target.chat_id, text=text, parse_mode=mode,
                message_thread_id=target.thread_id, reply_parameters=reply),
                idempotent=False)

        try:
            return await deliver(call(to_html(source), "HTML"), what="telegram sendMessage",
                                 policy=policy)
        except TelegramBadRequest as exc:
            if not _entity_error(exc):
                raise
            log.warning("telegram: HTML refused (%s); sending the piece as plain text",
                        exc.message)
            return await deliver(call(source, None), what="telegram sendMessage",
                                 policy=policy)

    async def _edit(self, target: _Target, message_id: int, source: str,
                    policy: DeliveryPolicy) -> None:
        bot = self._bot()

        def call(text: str, mode: str | None) -> Callable[[], Awaitable[Any]]:
            return lambda: _translated(bot.edit_message_text(
                chat_id=target.chat_id, message_id=message_id, text=text, parse_mode=mode))

        try:
            await deliver(call(to_html(source), "HTML"), what="telegram editMessageText",
                          policy=policy)
        except TelegramBadRequest as exc:
            if _not_modified(exc):
                return
            if not _entity_error(exc):
                raise
            try:
                await deliver(call(source, None), what="telegram editMessageText",
                              policy=policy)
            except TelegramBadRequest as again:
                if not _not_modified(again):
                    raise

    async def _draft(self, target: _Target, text: str) -> str:
        """Post the first draft; ``""`` when that failed (the reply is then sent whole)."""
        async with self._sending_reply() as live:
            if not live:
                return ""
            try:
                sent = await self._send_piece(target, fit(text), _DRAFT_POLICY)
            except Exception as exc:
                log.warning("telegram: streaming draft not shown (%s)", exc)
                return ""
            return str(sent.message_id)

    async def _edit_draft(self, target: _Target, message_id: str, text: str) -> None:
        if not message_id:
            return
        async with self._sending_reply() as live:
            if live:
                await self._edit(target, int(message_id), fit(text), _DRAFT_POLICY)

    async def _finalize(self, target: _Target, message_id: str | None,
                        text: str | None) -> None:
        """The final reply replaces the draft; later pieces follow as new messages."""
        async with self._sending_reply() as live:
            if not live:
                return
            pieces = split_for_telegram(text) if text is not None else []
            replaced = False
            if message_id:
                bot = self._bot()
                if not pieces:
                    try:
                        await deliver(lambda: _translated(bot.delete_message(
                            chat_id=target.chat_id, message_id=int(message_id))),
                            what="telegram deleteMessage", policy=self.policy)
                    except TelegramBadRequest as exc:
                        log.info("telegram: draft not deleted (%s)", exc.message)
                    return
                try:
                    await self._edit(target, int(message_id), pieces[0], self.policy)
                    pieces, replaced = pieces[1:], True
                except TelegramBadRequest as exc:
                    # The draft is gone (deleted by someone): send the reply afresh.
                    log.warning("telegram: could not replace the draft (%s); sending anew",
                                exc.message)
            for index, piece in enumerate(pieces):
                first = index == 0 and not replaced
                await self._send_piece(target if first else _unthreaded(target), piece,
                                       self.policy)

    async def _keep_typing(self, chat_id: int | str, thread_id: int | None) -> None:
        bot = self._bot()
        while not self._stopped:
            wait = self.typing_interval
            try:
                await bot.send_chat_action(chat_id=chat_id, action="typing",
                                           message_thread_id=thread_id)
            except TelegramRetryAfter as exc:
                wait = max(wait, float(exc.retry_after))
            except (TelegramAPIError, aiohttp.ClientError, OSError) as exc:
                log.debug("telegram: typing status not sent: %s", exc)
            await asyncio.sleep(wait)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


# -- receiving: tolerant parsing ------------------------------------------------------


def parse_update(raw: Any, bot: Bot) -> Update | None:
    """``raw`` as an :class:`Update`; a malformed one is logged and becomes an empty one.

    The empty update keeps its ``update_id``, so polling still confirms it
    (otherwise the server would send it again forever); one without a usable
    id cannot be confirmed and is dropped.
    """
    try:
        return Update.model_validate(raw, context={"bot": bot})
    except ValidationError as exc:
        update_id = raw.get("update_id") if isinstance(raw, dict) else None
        errors = exc.errors()
        where = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
        why = errors[0]["msg"] if errors else str(exc)
        if isinstance(update_id, int) and not isinstance(update_id, bool):
            log.warning("telegram: update %d is malformed (%s: %s); skipped", update_id,
                        where, why)
            return Update(update_id=update_id)
        log.warning("telegram: an update without a valid update_id was skipped (%s: %s)",
                    where, why)
        return None


class _Session(AiohttpSession):
    """aiogram's session, except that one bad update no longer poisons a getUpdates batch.

    aiogram validates the whole ``getUpdates`` answer at once: a single
    update it cannot parse fails the call, the offset never moves past it,
    and polling retries the same batch forever. Here each update is parsed
    on its own and a malformed one becomes an empty update that is confirmed
    and skipped.
    """

    def check_response(self, bot: Bot, method: TelegramMethod[TelegramType],
                       status_code: int, content: str) -> Response[TelegramType]:
        if isinstance(method, GetUpdates) and HTTPStatus.OK <= status_code <= HTTPStatus.IM_USED:
            try:
                data = self.json_loads(content)
            except ValueError:
                data = None
            if isinstance(data, dict) and data.get("ok") is True \
                    and isinstance(data.get("result"), list):
                updates = [u for raw in data["result"]
                           if (u := parse_update(raw, bot)) is not None]
                return cast("Response[TelegramType]",
                            Response[list[Update]](ok=True, result=updates))
        return super().check_response(bot, method, status_code, content)


class _WebhookHandler(SimpleRequestHandler):
    """aiogram's webhook handler (secret-token check included), tolerant of bad bodies.

    Telegram retries a webhook call that does not get a 2xx, so a body Roost
    cannot use is acknowledged and logged rather than failed.
    """

    def __init__(self, channel: TelegramChannel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.channel = channel

    async def _handle_request_background(self, bot: Bot, request: web.Request) -> web.Response:
        try:
            raw = await request.json(loads=bot.session.json_loads)
        except ValueError:
            log.warning("telegram: a webhook body was not JSON; ignored")
            return web.json_response({})
        self.channel._spawn(self.channel.feed_raw(raw))
        return web.json_response({})

    async def close(self) -> None:
        # The channel closes the bot session itself, after replies in flight.
        return None


# -- helpers ----------------------------------------------------------------------------


async def _translated(call: Awaitable[T], *, idempotent: bool = True) -> T:
    """Await a Bot API call, turning aiogram's errors into the delivery layer's.

    A network error after a ``sendMessage`` left may have delivered it, and
    retrying would post the reply twice; only a failure to connect is retried
    for calls that are not ``idempotent``.
    """
    try:
        return await call
    except TelegramRetryAfter as exc:
        raise RateLimited(float(exc.retry_after)) from exc
    except TelegramServerError as exc:
        raise Transient(str(exc)) from exc
    except TelegramNetworkError as exc:
        if idempotent or isinstance(exc.__cause__, aiohttp.ClientConnectorError):
            raise Transient(str(exc)) from exc
        raise


def _set_commands(bot: Bot, commands: list[BotCommand],
                  scope: BotCommandScopeChat) -> Callable[[], Awaitable[bool]]:
    return lambda: _translated(bot.set_my_commands(commands, scope=scope))


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


def _without(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` minus the entity spans (UTF-16 offsets), tidied where a span was cut."""
    data = text.encode("utf-16-le")
    for offset, length in sorted(spans, reverse=True):
        data = data[:offset * 2] + data[(offset + length) * 2:]
    result = data.decode("utf-16-le", errors="replace")
    if any(offset == 0 for offset, _ in spans):
        # "@bot, do this" → "do this"
        result = re.sub(r"^[\s,:;]+", "", result)
    return re.sub(r"[ \t]{2,}", " ", result).strip()


def _attachments(message: Message) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    if message.photo:
        biggest = message.photo[-1]
        found.append(Attachment("image", size=biggest.file_size or 0))
    for kind, media in (("file", message.document), ("audio", message.audio),
                        ("audio", message.voice), ("video", message.video)):
        if media is not None:
            found.append(Attachment(kind, name=getattr(media, "file_name", None) or "",
                                    mime_type=getattr(media, "mime_type", None) or "",
                                    size=getattr(media, "file_size", None) or 0))
    return tuple(found)


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


def _quiet_aiogram() -> None:
    # aiogram logs one INFO line per update; Roost logs each run itself. An
    # explicitly configured level is left alone.
    event_log = logging.getLogger("aiogram.event")
    if event_log.level == logging.NOTSET:
        event_log.setLevel(logging.WARNING)
