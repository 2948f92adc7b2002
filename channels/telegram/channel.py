"""The :class:`TelegramChannel`: the channel contract, delegated to the parts it builds.

Its parts: :class:`Chats` (what is known of each chat), :class:`BotApi` (every Bot
API call, through the rate limiter), :class:`ReplyGate` (replies in flight),
:class:`Outcomes` (message-creating calls, unknown outcomes probed),
:class:`Sender` (replies, edits, deletions, typing), :class:`Uploader` (replies
with files), :class:`Downloader` (files people sent), :class:`Translator` (a
message as the core sees it), :class:`Updates` (updates into the core) fed by
:class:`LongPolling` or :class:`Webhook`, and a :class:`DraftStream` per
streamed reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import threading
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from aiogram import Bot
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramBadRequest, TelegramUnauthorizedError
from aiogram.methods import DeleteWebhook, GetMe, SetMyCommands
from aiogram.types import BotCommand, BotCommandScopeChat, Message, User
from aiogram.utils.token import TokenValidationError, validate_token

from bot.config.settings import SetupError
from bot.contracts.channel import (
    Capabilities,
    Channel,
    ChannelHealth,
    InboundHandler,
    ReplyStream,
)
from bot.contracts.messages import (
    Attachment,
    ButtonPress,
    ButtonRows,
    InboundMessage,
    OutboundMessage,
)
from channels.delivery import TELEGRAM_LIMITS, DeliveryPolicy, Limits, RateLimiter
from channels.telegram.client import BotApi, Chats, ReplyGate
from channels.telegram.drafts import DraftStream
from channels.telegram.inbound import CHANNEL_NAME, Translator, Unhandled
from channels.telegram.interactions import REACTION_EMOJI, Interactions, markup_of
from channels.telegram.media import Downloader
from channels.telegram.outcomes import Outcomes, as_reply
from channels.telegram.receiving import LongPolling, TolerantSession, Updates
from channels.telegram.sender import Sender, Target, chat_id_of, int_or_none
from channels.telegram.uploads import Uploader
from channels.telegram.warmup import build_validators, keep_response_models
from channels.telegram.webhook import Webhook
from channels.telegram_lazy import LAZY

if TYPE_CHECKING:
    from bot.config.settings import Settings
    from bot.contracts.commands import Command

log = logging.getLogger("roost.channels.telegram")

COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")
"""What Telegram accepts as a command name in ``setMyCommands``."""
STOP_GRACE = 10.0
"""Seconds ``stop()`` waits for replies still being sent."""


class TelegramChannel(Channel):
    """Roost on Telegram (``TELEGRAM_BOT_TOKEN``); see the package docstring."""

    name = CHANNEL_NAME
    marks_sending = True  # after the rate limiter's waits: see BotApi.call
    capabilities = Capabilities(buttons=True, edit=True, react=True,
                                reaction_emoji=REACTION_EMOJI, edits_in=True,
                                reactions_in=True)

    def __init__(self, settings: Settings, *, polling_timeout: int = 30,
                 edit_interval: float = 1.0, typing_interval: float = 4.0,
                 policy: DeliveryPolicy | None = None, limits: Limits = TELEGRAM_LIMITS,
                 request_timeout: float = 60.0, poll_backoff: float = 0.5,
                 draft_after: float = 1.0, draft_chars: int = 400) -> None:
        """Read the token from ``settings`` and build the parts; nothing connects yet.

        Keyword arguments exist for tests and benchmarks: ``polling_timeout`` is
        the long-poll wait in seconds, ``edit_interval`` the minimum time between
        streaming edits, ``draft_after`` and ``draft_chars`` when a streamed reply's
        first draft is shown (see :class:`~channels.telegram.drafts.DraftStream`),
        ``typing_interval`` how often the typing status is refreshed, ``policy`` the
        retry policy for replies, ``limits`` the proactive rate limits,
        ``request_timeout`` how long one Bot API call may take (the long poll gets
        its own wait on top), ``poll_backoff`` the first pause after a failed
        ``getUpdates`` (doubling up to 30 s).
        """
        if settings.telegram_bot_token is None:
            raise ValueError("the Telegram channel needs TELEGRAM_BOT_TOKEN")
        self.settings = settings
        self.streams = settings.streams(self.name)
        """Whether replies are streamed by editing a draft (the settings, read once)."""
        self.edit_interval = edit_interval
        self.draft_after = draft_after
        self.draft_chars = draft_chars
        self.request_timeout = request_timeout
        policy = policy or DeliveryPolicy()
        # Telegram's ~30 messages/s is the bot's, whichever replica sends: each paces at
        # its share of the live replicas (self.replicas, from begin()). Per-chat limits
        # stay per replica (a chat's session has one holder).
        self.limiter = RateLimiter(limits if settings.telegram_rate_limits else Limits(),
                                   shared_by=self)
        self.chats = Chats()
        self.api = BotApi(self.chats, self.limiter, policy=policy)
        self.gate = ReplyGate(self.api)
        self.outcomes = Outcomes(self.api, self.chats, policy=policy)
        self.sender = Sender(self.api, self.outcomes, self.chats, self.gate, policy=policy,
                             typing_interval=typing_interval)
        self.uploader = Uploader(self.sender, self.outcomes, request_timeout=request_timeout)
        self.downloader = Downloader(settings, self.api, self.gate, policy=policy,
                                     request_timeout=request_timeout)
        unhandled = Unhandled()
        self.translator = Translator(settings, unhandled)
        self.updates = Updates(self.api, self.chats, self.translator, unhandled)
        self.long_polling = LongPolling(settings, self.limiter, self.updates,
                                        polling_timeout=polling_timeout,
                                        request_timeout=request_timeout,
                                        poll_backoff=poll_backoff)
        self.webhook = Webhook(settings, self.api, self.updates)
        self.interactions = Interactions(self.api)
        self._closing = False

    @property
    def bot(self) -> Bot | None:
        """The aiogram ``Bot`` (``None`` before :meth:`start`)."""
        return self.api.bot

    @property
    def me(self) -> User | None:
        """The bot's own account (``None`` before :meth:`start`)."""
        return self.translator.me

    @property
    def polling(self) -> asyncio.Task[None] | None:
        """The polling loop's task (``None`` in webhook mode or before ``start``)."""
        return self.long_polling.task

    def health(self) -> ChannelHealth:
        """Ready once receiving; not from a failed ``getUpdates`` until one succeeds."""
        return self.updates.health

    # -- lifecycle -------------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Check the token (``getMe``), then receive by long polling or webhook."""
        assert self.settings.telegram_bot_token is not None
        token = self.settings.telegram_bot_token.get_secret_value()
        try:
            validate_token(token)
        except TokenValidationError:
            # A setting to change, not an outage: nothing to retry (exit code 2).
            raise SetupError("TELEGRAM_BOT_TOKEN is malformed: a bot token looks like "
                             "123456789:AAE... (as @BotFather gives it)") from None
        self.updates.start(handler)
        keep_response_models()
        base = self.settings.telegram_api_base
        api = TelegramAPIServer.from_base(base) if base else None
        session = TolerantSession(api=api, timeout=self.request_timeout) if api else \
            TolerantSession(timeout=self.request_timeout)
        bot = Bot(token, session=session)
        self.api.open(bot)
        try:
            await self._connect(bot)
        except BaseException:
            await session.close()
            raise
        # Off the event loop and without delaying the first getUpdates: the first
        # update's answer then finds the validators built.
        threading.Thread(target=build_validators, name="roost-telegram-validators",
                         daemon=True).start()
        assert self.me is not None
        log.info("telegram: receiving as @%s by %s%s", self.me.username,
                 "webhook" if self.webhook.receiving else "long polling",
                 "" if LAZY else " (aiogram types built eagerly)")

    async def _connect(self, bot: Bot) -> None:
        # getUpdates is refused while a webhook is set (from an earlier webhook
        # deployment; pending updates are kept): it is removed alongside getMe, so
        # the first poll waits for one round trip to Telegram, not two.
        unhook = None if self.settings.telegram_webhook_url else asyncio.ensure_future(
            self.api.deliver(DeleteWebhook(drop_pending_updates=False), "deleteWebhook",
                             scope="deleteWebhook"))  # not behind getMe (the bot's scope)
        try:
            policy = self.api.policy
            attempts = min(policy.attempts, self.settings.telegram_connect_attempts)
            me = await self.api.deliver(GetMe(), "getMe",
                                        policy=dataclasses.replace(policy, attempts=attempts))
        except BaseException as exc:
            if unhook is not None:
                unhook.cancel()
                await asyncio.gather(unhook, return_exceptions=True)
            if isinstance(exc, TelegramUnauthorizedError):
                raise SetupError(f"Telegram refused the bot token ({exc.message}): check "
                                 "TELEGRAM_BOT_TOKEN") from exc
            raise
        self.translator.identify(me)
        if not me.username:
            log.warning("telegram: the bot has no username: @mentions cannot be recognised")
        if unhook is None:
            await self.webhook.start(self.settings.telegram_webhook_url or "", self.http_routes)
            return
        await unhook
        self.long_polling.start(bot, self.leadership)

    async def stop_intake(self) -> None:
        """Stop receiving at once; replies can still be sent until :meth:`stop`.

        A long poll in flight is cut (its connection closed), not waited for;
        an update whose handler is running is let finish, so it is either in
        the inbox or will be delivered again. The webhook endpoint answers 503
        from now on: Telegram keeps such updates and delivers them again later.
        """
        if self.updates.stop():
            await self.long_polling.stop()

    async def stop(self) -> None:
        """Stop receiving (if not yet), let replies being sent finish, close the session."""
        if self._closing:
            return
        self._closing = True
        await self.stop_intake()
        self.gate.shut_down()
        await self.webhook.close()
        await self.gate.drained(STOP_GRACE)
        if self.api.bot is not None:
            await self.api.bot.session.close()

    # -- inbound --------------------------------------------------------------------

    def translate(self, message: Message, *, event_id: str = "") -> InboundMessage | None:
        """The core's view of ``message``, or ``None`` if it is not for Roost
        (see :meth:`Translator.translate`)."""
        return self.translator.translate(message, event_id=event_id)

    async def feed_raw(self, raw: object) -> None:
        """Handle one update as received (tests); malformed ones are skipped.

        Raises if the core's handler raised, as the webhook then answers 500.
        """
        await self.updates.feed_raw(raw)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of ``attachment``, at most ``limit`` (see :class:`Downloader`)."""
        return await self.downloader.download(attachment, limit)

    # -- outbound -------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver a reply: rendered to HTML, cut to 4,096, the first piece threaded.

        With ``message.replace`` the draft of that id becomes the first piece.
        ``message.files`` follow the text as photos or documents (see
        :mod:`channels.telegram.uploads`); one over 50 MB raises
        :class:`~bot.contracts.media.MediaTooLarge` before anything is sent.
        A redelivery posts only what an earlier attempt did not (see
        :mod:`channels.telegram.outcomes`). Returns the id of the last message sent;
        raises if the reply was not delivered (the core keeps it and tries again).
        """
        target = Target.of(message.chat_id, message.thread_id, message.reply_to)
        # A redelivery looks for each message above what an earlier attempt noted
        # before posting it (channels.telegram.outcomes).
        floor = int_or_none(message.attempt_note) if message.redelivery else None
        async with self.gate.entered() as live:
            if not live:
                raise RuntimeError("the Telegram channel is stopped")
            async with as_reply(floor):
                if message.files:
                    return await self.uploader.deliver_with_files(target, message)
                return await self.sender.deliver_reply(
                    target, message.replace, message.text,
                    markup_of(message.buttons) if message.buttons else None)

    async def answer_press(self, press: ButtonPress, note: str | None = None, *,
                           alert: bool = False) -> None:
        """``answerCallbackQuery`` with ``note`` as a toast (``alert``: a dialog)."""
        await self.interactions.answer(press, note, alert)

    async def edit(self, chat_id: str, message_id: str, text: str,
                   buttons: ButtonRows = (), *, thread_id: str | None = None) -> bool:
        """``editMessageText`` with ``buttons`` as the keyboard (none: removed); ``False``
        if the message is gone."""
        async with self.gate.entered() as live:
            if not live:
                raise RuntimeError("the Telegram channel is stopped")
            try:
                return await self.sender.edit(Target.of(chat_id, None, None), int(message_id),
                                              text, markup=markup_of(buttons))
            except TelegramBadRequest as exc:
                if "message to edit not found" not in exc.message:
                    raise
                log.info("telegram: message %s in %s to edit is gone", message_id, chat_id)
                return False

    async def react(self, chat_id: str, message_id: str, emoji: str | None, *,
                    thread_id: str | None = None, replacing: str | None = None) -> bool:
        """``setMessageReaction`` (Telegram's list only; it replaces the bot's earlier
        reaction by itself), dropped rather than waiting."""
        return await self.interactions.react(chat_id_of(chat_id), int(message_id), emoji)

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete a message Roost sent (a stale draft); one already gone is fine."""
        async with self.gate.entered() as live:
            if not live:
                raise RuntimeError("the Telegram channel is stopped")
            await self.sender.delete(chat_id_of(chat_id), int(message_id))

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """A draft edited at most once per ``edit_interval``, unless streaming is off."""
        if not self.streams:
            return None
        target = Target.of(message.chat_id, message.thread_id,
                           message.message_id if message.chat_type == "group" else None)
        return DraftStream(self.sender, target, self.edit_interval,
                           draft_after=self.draft_after, draft_chars=self.draft_chars)

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Keep "typing…" showing (Telegram clears it after 5 s) while the block runs."""
        task = asyncio.create_task(self.sender.keep_typing(
            chat_id_of(message.chat_id), int_or_none(message.thread_id)))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """``setMyCommands``: everyone sees the public commands, admins' chats all of them."""
        self.translator.know_commands(name for c in commands for name in (c.name, *c.aliases))
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
        await self.api.deliver(SetMyCommands(commands=public[:100]), "setMyCommands")
        if not admin:
            return
        for admin_entry in self.settings.admins:
            channel, _, user_id = admin_entry.partition(":")
            if channel != self.name or not user_id.lstrip("-").isdigit():
                continue
            # An admin's private chat has the admin's user id.
            scope = BotCommandScopeChat(chat_id=int(user_id))
            try:
                await self.api.deliver(SetMyCommands(commands=(public + admin)[:100],
                                                     scope=scope), "setMyCommands (admin)")
            except Exception as exc:
                # Usually "chat not found": the admin has not started the bot yet.
                log.warning("telegram: admin commands for %s not registered: %s", user_id, exc)
