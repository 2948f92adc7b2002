"""Receiving updates: Roost's own long-polling loop, or a webhook Telegram POSTs to.

Either way an update is acknowledged (the next ``getUpdates`` offset, a
webhook's 200) only once the core's handler returned for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiogram import Bot
from aiogram.exceptions import TelegramUnauthorizedError
from aiogram.methods import GetUpdates, SetWebhook
from aiogram.types import Update

from bot.contracts.channel import READY, ChannelHealth
from bot.contracts.messages import InboundMessage
from bot.resilience.listener import Limits as ListenerLimits
from bot.resilience.listener import Listener
from channels.delivery import RateLimited, Transient
from channels.telegram.base import ALLOWED_UPDATES, CONNECTING, GET_UPDATES
from channels.telegram.errors import _backoff, _describe, _translated, _where
from channels.telegram.parsing import (
    _UPDATE_ID,
    SEEN_UPDATES,
    _Session,
    _update_kind,
    parse_update,
)
from channels.telegram.translate import Translating

if TYPE_CHECKING:
    from aiohttp import web

STANDBY = ChannelHealth(True, "standby: another replica long-polls")
"""A follower's health: ready to send; the leader receives."""

log = logging.getLogger("roost.channels.telegram")


class Intake(Translating):
    """Long polling and the webhook: updates in, to the core, acknowledged after."""

    async def _start_webhook(self, url: str) -> None:
        secret_setting = self.settings.telegram_webhook_secret
        # Without a secret anyone who learns the URL could inject updates, so
        # one is made up when none is configured: Telegram echoes it back.
        secret = secret_setting.get_secret_value() if secret_setting else \
            secrets.token_urlsafe(32)
        path = urlsplit(url).path or "/"
        shared = self.http_routes
        if shared is not None and shared.port == self.settings.telegram_webhook_port:
            # telegram_webhook_port is Roost's own HTTP port: mounted on that server.
            shared.add_post(path, self._webhook_handler(secret))
            self._shared = shared
            try:
                await self._deliver(SetWebhook(url=url, secret_token=secret,
                                               allowed_updates=ALLOWED_UPDATES), "setWebhook")
            except BaseException:
                shared.remove_post(path)
                self._shared = None
                raise
            self._health = READY
            return
        # Webhook mode only: long polling never loads the server.
        listener = Listener(None, self.settings.telegram_webhook_port,
                            ListenerLimits.from_settings(self.settings), name="Telegram webhook")
        listener.app.router.add_post(path, self._webhook_handler(secret))
        await listener.start()
        self._webhook = listener
        try:
            await self._deliver(SetWebhook(url=url, secret_token=secret,
                                           allowed_updates=ALLOWED_UPDATES), "setWebhook")
        except BaseException:
            await listener.close()
            self._webhook = None
            raise
        self._health = READY

    async def _poll(self, bot: Bot) -> None:
        """Long-poll while this replica leads (always when there is no :attr:`leadership`).

        A follower waits, ready (it sends replies; the leader receives). A leader
        that loses its lock cuts its long poll at once: the update being handed
        over either reached the inbox or is served again to the next leader,
        and the inbox records each update_id once.
        """
        lead = self.leadership
        if lead is None:
            await self._poll_updates(bot)
            return
        while not self._intake_stopped:
            if not lead.is_leader:
                self._health = STANDBY
                log.info("telegram: another replica polls; this one takes over if it stops")
                if not await self._until(lead.wait_leading()):
                    return
            log.info("telegram: this replica leads: long polling")
            polling = asyncio.ensure_future(self._poll_updates(bot))
            lost = asyncio.ensure_future(lead.wait_lost())
            try:
                await asyncio.wait({polling, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                if not polling.done():
                    polling.cancel()
                await asyncio.gather(lost, polling, return_exceptions=True)
            if polling.cancelled():
                continue  # leadership lost: wait to lead again
            await polling  # ended on its own (stopped, or the token was refused)
            return

    async def _until(self, event: Awaitable[None]) -> bool:
        """Wait for ``event``; False if intake stopped first."""
        waiting = asyncio.ensure_future(event)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopping):
                task.cancel()
            await asyncio.gather(waiting, stopping, return_exceptions=True)
        return not self._intake_stopped

    async def _poll_updates(self, bot: Bot) -> None:
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
            if self._health is CONNECTING:
                self._health = READY  # getMe passed; the first getUpdates goes out now
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
                self._health = ChannelHealth(False, "the bot token was refused; polling "
                                                    "stopped")
                return
            except Exception as exc:
                self._health = ChannelHealth(False, f"getUpdates failing ({self._why(exc)})")
                fetch_failures += 1
                delay = _backoff(self.poll_backoff, fetch_failures)
                log.warning("telegram: getUpdates failed (%s); retrying in %.1fs",
                            _describe(exc), delay)
                await self._pause(delay)
                continue
            finally:
                self._fetching = None
            self._health = READY
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

    def _why(self, exc: BaseException) -> str:
        """Why a ``getUpdates`` failed, briefly (``server error: Bad Gateway``), token-free."""
        # Transient carries the reason already worded; others say their type.
        text = str(exc) if isinstance(exc, Transient) else _describe(exc)
        text = text.splitlines()[0][:120] if text else type(exc).__name__
        token = self.settings.telegram_bot_token
        # An HTTP error's text may hold the request URL, which holds the token.
        return text.replace(token.get_secret_value(), "***") if token else text

    async def _fetch(self, bot: Bot, offset: int | None) -> list[Update]:
        method = GetUpdates(offset=offset, timeout=self.polling_timeout,
                            allowed_updates=ALLOWED_UPDATES)
        async with self.limiter.slot(GET_UPDATES):
            # The long poll may take its whole timeout; a dead connection is
            # noticed after a margin on top of it.
            return await _translated(bot(method, request_timeout=int(
                self.polling_timeout + self.request_timeout)))

    async def _process(self, update: Update) -> None:
        """Hand one update to the core; raises if the core did not take it."""
        if update.update_id in self._seen:
            log.info("telegram: update %d was delivered again; ignored", update.update_id)
            return
        inbound: InboundMessage | None = None
        if update.message is not None:
            try:
                # Its id takes a place in the chat's sequence (see .outcomes).
                self._saw(update.message.chat.id, update.message.message_id)
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

    def _webhook_handler(self, secret: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        from aiohttp import web

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
