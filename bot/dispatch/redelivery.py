"""Replies the platform did not take: sent again later, replacing their drafts, then given up."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping

from bot.config.masking import mask_text
from bot.contracts.channel import Channel, sending_mark
from bot.contracts.messages import OutboundMessage
from bot.resilience.retry import RetryPolicy
from bot.storage.inbox import Inbox

log = logging.getLogger("roost.dispatch.redelivery")

REDELIVERY = RetryPolicy.fixed(5.0, 30.0, 120.0, 600.0)
"""A reply the platform did not take is sent again after 5 s, 30 s, 2 min and 10 min
(and after a restart), then given up."""


async def send_marked(channel: Channel, reply: OutboundMessage, inbox: Inbox,
                      outbox_id: int) -> str | None:
    """``channel.send(reply)`` with the outbox's ``sending`` mark set as late as the
    adapter allows: by the adapter right before its platform call (after its rate-limit
    waits) where it can, else here just before the send."""
    if not channel.marks_sending:
        await inbox.sending(outbox_id)
        return await channel.send(reply)

    noted = False

    async def mark(on: bool, note: str | None = None) -> None:
        nonlocal noted
        await inbox.sending(outbox_id, on, note, forget=not on and noted)
        noted = on and (noted or note is not None)

    with sending_mark(mark):
        return await channel.send(reply)


class Redeliveries:
    """Committed replies waiting for another attempt.

    Each attempt carries the reply's stable ``delivery_id`` (``roost-<outbox id>``)
    and ``redelivery=True``, so adapters that can check whether an earlier attempt
    landed do. ``count(channel, outcome)`` sees every attempt's outcome.
    """

    def __init__(self, inbox: Inbox, channels: Mapping[str, Channel],
                 count: Callable[[str, str], None]) -> None:
        self.inbox = inbox
        self.channels = channels
        self.count = count
        self.tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[int, asyncio.Task[None]] = {}

    def schedule(self, outbox_id: int, reply: OutboundMessage, draft: str | None,
                 attempts: int, delay: float | None = None) -> None:
        """Send the reply again after ``delay`` (the policy's, by default), backing off.

        An attempt of the same reply still waiting is replaced (a retry asked now)."""
        if delay is None:
            delay = REDELIVERY.delay(attempts)
        waiting = self._waiting.pop(outbox_id, None)
        if waiting is not None:
            waiting.cancel()
        task = asyncio.ensure_future(self._again(outbox_id, reply, draft, attempts, delay))
        self._waiting[outbox_id] = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(lambda done: self._finished(outbox_id, done))

    def _finished(self, outbox_id: int, task: asyncio.Task[None]) -> None:
        if self._waiting.get(outbox_id) is task:
            del self._waiting[outbox_id]

    def cancel(self) -> None:
        """Stop waiting: what is not delivered stays in the outbox for the next start."""
        for task in list(self.tasks):
            task.cancel()

    async def _again(self, outbox_id: int, reply: OutboundMessage, draft: str | None,
                     attempts: int, delay: float) -> None:
        await asyncio.sleep(delay)
        if not await self.inbox.still_to_send(outbox_id):
            # Delivered, dropped or retried elsewhere (the Control UI) meanwhile.
            log.info("reply %d is no longer this process's to send", outbox_id)
            return
        channel = self.channels.get(reply.channel)
        if channel is None:
            log.error("reply %d: no channel %r; kept in the outbox", outbox_id, reply.channel)
            return
        try:
            platform_id = await send_marked(channel, dataclasses.replace(
                reply, replace=draft, delivery_id=f"roost-{outbox_id}", redelivery=True),
                self.inbox, outbox_id)
        except Exception as exc:
            final = attempts >= REDELIVERY.retries
            self.count(reply.channel, "given_up" if final else "failed")
            self.inbox.not_delivered(outbox_id, final=final, error=mask_text(str(exc)))
            if final:
                log.error("reply %d to %s:%s could not be delivered; given up (%s)",
                          outbox_id, reply.channel, reply.chat_id, exc)
            else:
                log.warning("reply %d to %s:%s not delivered (%s); trying again",
                            outbox_id, reply.channel, reply.chat_id, exc)
                self.schedule(outbox_id, reply, draft, attempts + 1)
            return
        self.count(reply.channel, "ok")
        self.inbox.delivered(outbox_id, platform_id)
