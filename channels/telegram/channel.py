"""The Telegram channel itself: lifecycle and the core-facing methods."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from aiogram import Bot
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramUnauthorizedError
from aiogram.methods import DeleteWebhook, GetMe, SetMyCommands
from aiogram.types import BotCommand, BotCommandScopeChat
from aiogram.utils.token import TokenValidationError, validate_token

from bot.config.settings import SetupError
from bot.contracts.channel import InboundHandler, ReplyStream
from bot.contracts.messages import InboundMessage, OutboundMessage
from channels.telegram.base import COMMAND_NAME, STOP_GRACE, _chat_id, _int_or_none, _Target
from channels.telegram.intake import Intake
from channels.telegram.media import Downloads
from channels.telegram.outcomes import as_reply
from channels.telegram.parsing import _keep_response_models, _Session, build_validators
from channels.telegram.sending import _DraftStream
from channels.telegram.uploads import Uploads
from channels.telegram_lazy import LAZY

if TYPE_CHECKING:
    from bot.contracts.commands import Command

log = logging.getLogger("roost.channels.telegram")


class TelegramChannel(Intake, Uploads, Downloads):
    """Roost on Telegram (``TELEGRAM_BOT_TOKEN``).

    Keyword arguments exist for tests and benchmarks: ``polling_timeout`` is
    the long-poll wait in seconds, ``edit_interval`` the minimum time between
    streaming edits, ``draft_after`` and ``draft_chars`` when a streamed reply's
    first draft is shown (see :class:`~channels.telegram.sending._DraftStream`),
    ``typing_interval`` how often the typing status is
    refreshed, ``policy`` the retry policy for replies, ``limits`` the
    proactive rate limits, ``request_timeout`` how long one Bot API call may
    take (the long poll gets its own wait on top), ``poll_backoff`` the first
    pause after a failed ``getUpdates`` (doubling up to 30 s).
    """

    name = "telegram"

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
        self._handler = handler
        _keep_response_models()
        base = self.settings.telegram_api_base
        api = TelegramAPIServer.from_base(base) if base else None
        session = _Session(api=api, timeout=self.request_timeout) if api else \
            _Session(timeout=self.request_timeout)
        self.bot = bot = Bot(token, session=session)
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
                 "webhook" if self._webhook or self._shared else "long polling",
                 "" if LAZY else " (aiogram types built eagerly)")

    async def _connect(self, bot: Bot) -> None:
        # getUpdates is refused while a webhook is set (from an earlier webhook
        # deployment; pending updates are kept): it is removed alongside getMe, so
        # the first poll waits for one round trip to Telegram, not two.
        unhook = None if self.settings.telegram_webhook_url else asyncio.ensure_future(
            self._deliver(DeleteWebhook(drop_pending_updates=False), "deleteWebhook",
                          scope="deleteWebhook"))  # not behind getMe (the bot's scope)
        try:
            self.me = await self._deliver(GetMe(), "getMe")
        except BaseException as exc:
            if unhook is not None:
                unhook.cancel()
                await asyncio.gather(unhook, return_exceptions=True)
            if isinstance(exc, TelegramUnauthorizedError):
                raise SetupError(f"Telegram refused the bot token ({exc.message}): check "
                                 "TELEGRAM_BOT_TOKEN") from exc
            raise
        if not self.me.username:
            log.warning("telegram: the bot has no username: @mentions cannot be recognised")
        if unhook is None:
            await self._start_webhook(self.settings.telegram_webhook_url or "")
            return
        await unhook
        self._polling = asyncio.create_task(self._poll(bot))

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
            await self._webhook.close()
        if self._shared is not None and self.settings.telegram_webhook_url:
            shared, self._shared = self._shared, None
            shared.remove_post(urlsplit(self.settings.telegram_webhook_url).path or "/")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE):
                await self._idle.wait()
        if self.bot is not None:
            await self.bot.session.close()

    @property
    def polling(self) -> asyncio.Task[None] | None:
        """The polling loop's task (``None`` in webhook mode or before ``start``)."""
        return self._polling

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
        target = _Target.of(message.chat_id, message.thread_id, message.reply_to)
        # A redelivery looks for each message above what an earlier attempt noted
        # before posting it (channels.telegram.outcomes).
        floor = _int_or_none(message.attempt_note) if message.redelivery else None
        async with self._sending_reply() as live:
            if not live:
                raise RuntimeError("the Telegram channel is stopped")
            if message.files:
                return await as_reply(floor, lambda: self._deliver_with_files(target, message))
            return await as_reply(floor, lambda: self._deliver_reply(
                target, message.replace, message.text))

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
        return _DraftStream(self, target, self.edit_interval, draft_after=self.draft_after,
                            draft_chars=self.draft_chars)

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
