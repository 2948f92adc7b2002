"""Roost's own long-polling loop (``getUpdates``), led by one replica at a time."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aiogram import Bot
from aiogram.exceptions import TelegramUnauthorizedError
from aiogram.methods import GetUpdates
from aiogram.types import Update

from bot.contracts.channel import READY, ChannelHealth, Leadership
from channels.delivery import RateLimited, RateLimiter, Transient
from channels.telegram.errors import backoff, describe_error, translated
from channels.telegram.intake import ALLOWED_UPDATES, CONNECTING, Updates
from channels.telegram.parsing import TolerantSession

if TYPE_CHECKING:
    from bot.config.settings import Settings

log = logging.getLogger("roost.channels.telegram")

STANDBY = ChannelHealth(True, "standby: another replica long-polls")
"""A follower's health: ready to send; the leader receives."""
GET_UPDATES = "getUpdates"
"""The rate-limit scope of ``getUpdates``: a 429 on it holds polling only."""
STOP_GRACE = 10.0
"""Seconds :meth:`LongPolling.stop` lets an update being handed over finish."""


class LongPolling:
    """Fetches updates with ``getUpdates`` while this replica leads and hands them to
    :class:`Updates` in order, moving the offset past each only once it was taken."""

    def __init__(self, settings: Settings, limiter: RateLimiter, updates: Updates, *,
                 polling_timeout: int, request_timeout: float, poll_backoff: float) -> None:
        self.settings = settings
        self.limiter = limiter
        self.updates = updates
        self.polling_timeout = polling_timeout
        self.request_timeout = request_timeout
        self.poll_backoff = poll_backoff
        self.task: asyncio.Task[None] | None = None
        """The polling loop (``None`` before :meth:`start`)."""
        self._fetching: asyncio.Task[list[Update]] | None = None

    def start(self, bot: Bot, leadership: Leadership | None) -> None:
        """Begin polling through ``bot`` (in turns with other replicas under ``leadership``)."""
        self.task = asyncio.create_task(self._poll(bot, leadership))

    async def stop(self) -> None:
        """Cut a long poll in flight; let an update being handed over finish (bounded)."""
        if self._fetching is not None:
            self._fetching.cancel()
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), STOP_GRACE)
            except (TimeoutError, asyncio.CancelledError):
                self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _poll(self, bot: Bot, lead: Leadership | None) -> None:
        """Long-poll while this replica leads (always when there is no ``lead``).

        A follower waits, ready (it sends replies; the leader receives). A leader
        that loses its lock cuts its long poll at once: the update being handed
        over either reached the inbox or is served again to the next leader,
        and the inbox records each update_id once.
        """
        if lead is None:
            await self._poll_updates(bot)
            return
        while not self.updates.stopped:
            if not lead.is_leader:
                self.updates.report(STANDBY)
                log.info("telegram: another replica polls; this one takes over if it stops")
                if not await self.updates.until(lead.wait_leading()):
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

    async def _poll_updates(self, bot: Bot) -> None:
        """Fetch updates and hand them to the core, one at a time, in order.

        The offset (Telegram's acknowledgement) moves past an update only once
        the handler returned for it. If the handler raises, the rest of the
        batch waits: after a pause the same offset is fetched again, and
        Telegram serves that update again.
        """
        updates = self.updates
        offset: int | None = None
        fetch_failures = 0
        handler_failures = 0
        while not updates.stopped:
            if updates.health is CONNECTING:
                updates.report(READY)  # getMe passed; the first getUpdates goes out now
            self._fetching = asyncio.ensure_future(self._fetch(bot, offset))
            try:
                batch = await self._fetching
            except asyncio.CancelledError:
                if updates.stopped:
                    return
                raise
            except RateLimited as exc:
                # The limiter holds the next getUpdates until the window passed.
                log.warning("telegram: getUpdates rate limited; waiting %.0fs", exc.retry_after)
                continue
            except TelegramUnauthorizedError as exc:
                log.error("telegram: the bot token was refused (%s); polling stopped",
                          exc.message)
                updates.report(ChannelHealth(False, "the bot token was refused; polling "
                                                    "stopped"))
                return
            except Exception as exc:
                updates.report(ChannelHealth(False, f"getUpdates failing ({self._why(exc)})"))
                fetch_failures += 1
                delay = backoff(self.poll_backoff, fetch_failures)
                log.warning("telegram: getUpdates failed (%s); retrying in %.1fs",
                            describe_error(exc), delay)
                await updates.pause(delay)
                continue
            finally:
                self._fetching = None
            updates.report(READY)
            fetch_failures = 0
            if not batch and isinstance(bot.session, TolerantSession) and bot.session.unusable:
                # Only updates that cannot be confirmed (a broken or hostile server
                # serves them again at once): not a hot loop.
                await updates.pause(self.poll_backoff)
            for update in batch:
                if updates.stopped:
                    return
                try:
                    await updates.process(update)
                except Exception as exc:
                    handler_failures += 1
                    delay = backoff(self.poll_backoff, handler_failures)
                    log.warning("telegram: update %d was not taken (%s); fetching it again "
                                "in %.1fs", update.update_id, describe_error(exc), delay)
                    await updates.pause(delay)
                    break
                handler_failures = 0
                offset = update.update_id + 1

    def _why(self, exc: BaseException) -> str:
        """Why a ``getUpdates`` failed, briefly (``server error: Bad Gateway``), token-free."""
        # Transient carries the reason already worded; others say their type.
        text = str(exc) if isinstance(exc, Transient) else describe_error(exc)
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
            return await translated(bot(method, request_timeout=int(
                self.polling_timeout + self.request_timeout)))
