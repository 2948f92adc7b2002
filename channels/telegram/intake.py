"""Updates into the core: each handed over once, acknowledged only after the core took it.

Either way updates arrive (:mod:`.polling`, :mod:`.webhook`), an update is
acknowledged (the next ``getUpdates`` offset, a webhook's 200) only once the
core's handler returned for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

from aiogram.types import Update

from bot.contracts.channel import ChannelHealth, InboundHandler
from bot.contracts.messages import InboundMessage
from channels.telegram.api import BotApi
from channels.telegram.chats import Chats
from channels.telegram.errors import where
from channels.telegram.parsing import SEEN_UPDATES, parse_update, update_kind
from channels.telegram.translate import Translator, Unhandled

log = logging.getLogger("roost.channels.telegram")

ALLOWED_UPDATES = ["message"]
"""The only update type Roost acts on; Telegram then sends no others."""
CONNECTING = ChannelHealth(False, "connecting")
"""The health of a channel that has not received yet (before ``getMe`` or the first poll)."""


class Updates:
    """Hands each update to the core once (translated, its message id noted), remembers
    it only after the core's handler returned, and says whether intake is healthy or
    stopped."""

    def __init__(self, api: BotApi, chats: Chats, translator: Translator,
                 unhandled: Unhandled) -> None:
        self.api = api
        self.chats = chats
        self.translator = translator
        self.unhandled = unhandled
        self._handler: InboundHandler | None = None
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._stopped = False
        self._stopping = asyncio.Event()
        """Set once intake stops: wakes the polling loop out of its pauses."""
        self._health = CONNECTING
        """What ``/readyz`` shows: ready once ``getMe`` passed and polling (or the
        webhook) began; not ready from a failed ``getUpdates`` until the next success."""

    def start(self, handler: InboundHandler) -> None:
        """Hand messages to ``handler`` from now on."""
        self._handler = handler

    @property
    def health(self) -> ChannelHealth:
        """Ready once receiving; not from a failed ``getUpdates`` until one succeeds."""
        return self._health

    def report(self, health: ChannelHealth) -> None:
        """Intake's health is now ``health``."""
        self._health = health

    @property
    def stopped(self) -> bool:
        """Whether intake stopped: nothing more is taken."""
        return self._stopped

    def stop(self) -> bool:
        """Stop taking updates; ``False`` if intake had stopped already."""
        if self._stopped:
            return False
        self._stopped = True
        self._stopping.set()
        return True

    async def pause(self, seconds: float) -> None:
        """Sleep, unless intake stops first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def until(self, event: Awaitable[None]) -> bool:
        """Wait for ``event``; False if intake stopped first."""
        waiting = asyncio.ensure_future(event)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopping):
                task.cancel()
            await asyncio.gather(waiting, stopping, return_exceptions=True)
        return not self._stopped

    async def process(self, update: Update) -> None:
        """Hand one update to the core; raises if the core did not take it."""
        if update.update_id in self._seen:
            log.info("telegram: update %d was delivered again; ignored", update.update_id)
            return
        inbound: InboundMessage | None = None
        if update.message is not None:
            try:
                # Its id takes a place in the chat's sequence (see .outcomes).
                self.chats.saw(update.message.chat.id, update.message.message_id)
                inbound = self.translator.translate(update.message,
                                                    event_id=str(update.update_id))
            except Exception as exc:
                # A translation bug would fail the same way on every redelivery
                # and wedge the updates behind it: this one is skipped instead,
                # with one line saying where (a traceback per bad update would
                # let anyone who can message the bot flood the log).
                log.warning("telegram: update %d could not be translated (%s); skipped",
                            update.update_id, where(exc))
        else:
            self.unhandled.note(update_kind(update), update.update_id)
        if inbound is not None and self._handler is not None:
            await self._handler(inbound)
        # Remembered only now: a redelivery after a failed handler must go through.
        self._seen[update.update_id] = None
        if len(self._seen) > SEEN_UPDATES:
            self._seen.popitem(last=False)

    async def feed_raw(self, raw: Any) -> None:
        """Handle one update as received; malformed ones are skipped.

        Raises if the core's handler raised, as the webhook then answers 500.
        """
        update = parse_update(raw, self.api.required())
        if update is not None:
            await self.process(update)
