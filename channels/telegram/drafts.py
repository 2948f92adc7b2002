"""The draft a streamed reply grows in: one Telegram message, edited as the reply comes."""

from __future__ import annotations

import asyncio
import logging
import time

from aiogram.types import Message

from channels.delivery import DeliveryPolicy
from channels.telegram.client import describe_error
from channels.telegram.outcomes import as_reply
from channels.telegram.sender import Sender, Target, fit

log = logging.getLogger("roost.channels.telegram")

DRAFT_POLICY = DeliveryPolicy(attempts=1)
"""Drafts are not retried: the next edit or the final reply supersedes them."""

_now = time.monotonic
"""The clock the first draft's wait reads (tests replace it)."""


class DraftStream:
    """A reply streamed into one Telegram message, edited at most once per ``interval``.

    The first draft waits until the text is ``draft_chars`` long or a push comes
    ``draft_after`` seconds after the first one: a short answer that streams in
    at once is then one ``sendMessage`` at ``finish``, with no draft to edit.
    Drafts give way to rate limits: a first draft that could not be shown is
    tried again on the next push, an edit that could not be made is dropped
    (the next one or the final reply supersedes it). ``message_id`` is the
    draft's id once one is shown, and after ``finish`` the id of the reply's
    last message (``None`` if nothing is shown).
    """

    __slots__ = ("_began", "_editing", "_flusher", "_last", "_pending", "draft_after",
                 "draft_chars", "gate", "interval", "message_id", "sender", "target")

    def __init__(self, sender: Sender, target: Target, interval: float, *,
                 draft_after: float = 1.0, draft_chars: int = 400) -> None:
        self.sender = sender
        self.gate = sender.gate
        self.target = target
        self.interval = interval
        self.draft_after = draft_after
        self.draft_chars = draft_chars
        self.message_id: str | None = None
        self._began: float | None = None
        self._last = 0.0
        self._pending: str | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._editing = False

    async def push(self, text_so_far: str) -> None:
        """Show the reply so far (the whole text each time)."""
        draft = fit(text_so_far)
        if self.message_id is None:
            now = _now()
            if self._began is None:
                self._began = now
            if len(draft) < self.draft_chars and now - self._began < self.draft_after:
                return  # too early for a draft: the end may come first
            sent = await self._first(draft)
            if sent is not None:
                self.message_id = str(sent.message_id)
                self._last = time.monotonic()
            return
        self._pending = draft
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _first(self, draft: str) -> Message | None:
        async with self.gate.entered() as live:
            if not live:
                return None
            try:
                return await self.sender.send_piece(self.target, draft, urgent=False,
                                                      policy=DRAFT_POLICY)
            except Exception as exc:
                log.warning("telegram: streaming draft not shown (%s)", describe_error(exc))
                return None

    async def _flush_later(self) -> None:
        await asyncio.sleep(max(0.0, self._last + self.interval - time.monotonic()))
        draft, self._pending = self._pending, None
        if draft is None or self.message_id is None:
            return
        self._editing = True
        try:
            async with self.gate.entered() as live:
                if live:
                    await self.sender.edit(self.target, int(self.message_id), fit(draft),
                                             urgent=False)
        except Exception as exc:
            log.warning("telegram: a streaming edit failed (%s); the final reply will "
                        "still be sent", describe_error(exc))
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
        async with self.gate.entered() as live:
            if not live:
                raise RuntimeError("the Telegram channel is stopped")
            # Once delivered, the id is that of the reply's last message (the core
            # records it); if this raises, it stays the draft's, to be replaced.
            async with as_reply(None):
                self.message_id = await self.sender.deliver_reply(
                    self.target, self.message_id, final_text)
