"""Sending replies: HTML pieces of at most 4,096 characters, edits of drafts, deletions,
typing, and the draft a streamed reply grows in."""

from __future__ import annotations

import asyncio
import logging
import time

from aiogram.exceptions import TelegramBadRequest
from aiogram.methods import DeleteMessage, EditMessageText, SendChatAction, SendMessage
from aiogram.types import Message, ReplyParameters

from channels.delivery import DeliveryPolicy
from channels.telegram.api import BotApi, ReplyGate
from channels.telegram.chats import Chats
from channels.telegram.errors import describe_error, entity_error, not_modified
from channels.telegram.outcomes import Outcomes, as_reply
from channels.telegram.target import Target
from channels.telegram_format import fit, split_for_telegram, to_html

log = logging.getLogger("roost.channels.telegram")

DRAFT_POLICY = DeliveryPolicy(attempts=1)
"""Drafts are not retried: the next edit or the final reply supersedes them."""


class Sender:
    """Replies out: pieces sent, drafts edited into the final reply, stale drafts deleted,
    the typing status kept up."""

    def __init__(self, api: BotApi, outcomes: Outcomes, chats: Chats, gate: ReplyGate, *,
                 policy: DeliveryPolicy, typing_interval: float) -> None:
        self.api = api
        self.outcomes = outcomes
        self.chats = chats
        self.gate = gate
        self.policy = policy
        self.typing_interval = typing_interval

    async def send_piece(self, target: Target, source: str, *, urgent: bool = True,
                          policy: DeliveryPolicy | None = None) -> Message | None:
        """Send one piece as HTML; if Telegram cannot parse it, as the plain text.

        A final reply is retried after a reset, a timeout or a 5xx once it is found
        out that it did not arrive (:mod:`channels.telegram.outcomes`). Drafts
        (``urgent`` false) are tried once and give way to rate limits: ``None`` then.
        """
        reply = ReplyParameters(message_id=target.reply_to, allow_sending_without_reply=True) \
            if target.reply_to is not None else None
        for text, mode in ((to_html(source), "HTML"), (source, None)):
            method = SendMessage(chat_id=target.chat_id, text=text, parse_mode=mode,
                                 message_thread_id=target.thread_id, reply_parameters=reply)
            try:
                sent = await self.outcomes.create(method, "sendMessage",
                                          policy=policy or self.policy, urgent=urgent)
            except TelegramBadRequest as exc:
                if mode is None or not entity_error(exc):
                    raise
                log.warning("telegram: HTML refused (%s); sending the piece as plain text",
                            exc.message)
                continue
            if sent is not None:
                self.chats.remember_shown(sent.chat.id, sent.message_id, text, mode)
            return sent
        raise AssertionError("unreachable")

    async def edit(self, target: Target, message_id: int, source: str, *,
                    urgent: bool = True) -> bool:
        """Show ``source`` in message ``message_id``; ``False`` if a draft edit gave way.

        An edit to what the message already shows is not made (Telegram would
        refuse it as "message is not modified"); that answer, should it come
        anyway (a retry after the first attempt took effect), means success.
        """
        for text, mode in ((to_html(source), "HTML"), (source, None)):
            if self.chats.shows(target.chat_id, message_id, text, mode):
                return True
            method = EditMessageText(chat_id=target.chat_id, message_id=message_id, text=text,
                                     parse_mode=mode)
            try:
                if urgent:
                    await self.api.deliver(method, "editMessageText")
                elif await self.api.call(method, urgent=False) is None:
                    return False
            except TelegramBadRequest as exc:
                if not_modified(exc):
                    self.chats.remember_shown(target.chat_id, message_id, text, mode)
                    return True
                if mode is None or not entity_error(exc):
                    raise
                continue
            self.chats.remember_shown(target.chat_id, message_id, text, mode)
            return True
        raise AssertionError("unreachable")

    async def delete(self, chat_id: int | str, message_id: int) -> None:
        try:
            await self.api.deliver(DeleteMessage(chat_id=chat_id, message_id=message_id),
                                "deleteMessage")
        except TelegramBadRequest as exc:
            # Gone already (deleted by someone, or our own earlier attempt took
            # effect before its answer was lost).
            if "message to delete not found" not in exc.message.lower():
                raise
            log.info("telegram: message %d in %s was already gone", message_id, chat_id)
        self.chats.forget_shown(chat_id, message_id)

    async def deliver_reply(self, target: Target, draft_id: str | None,
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
                await self.delete(target.chat_id, draft)
                return None
            try:
                await self.edit(target, draft, pieces[0])
                pieces, last = pieces[1:], str(draft)
            except Exception as exc:
                log.warning("telegram: could not put the reply into draft %d (%s); sending "
                            "it anew", draft, describe_error(exc))
                stale = True
        for index, piece in enumerate(pieces):
            first = index == 0 and last is None
            sent = await self.send_piece(target if first else target.unthreaded(), piece)
            assert sent is not None
            last = str(sent.message_id)
        if stale and draft is not None:
            try:
                await self.delete(target.chat_id, draft)
            except Exception as exc:
                # The reply is out; only the stale draft stays. The core journals
                # its id and withdraws it later.
                log.warning("telegram: stale draft %d not deleted (%s)", draft, describe_error(exc))
        return last

    async def keep_typing(self, chat_id: int | str, thread_id: int | None) -> None:
        """Refresh "typing…"; it gives way to every other call to the chat."""
        while not self.gate.shut:
            try:
                await self.api.call(SendChatAction(chat_id=chat_id, action="typing",
                                               message_thread_id=thread_id), urgent=False)
            except Exception as exc:
                log.debug("telegram: typing status not sent: %s", describe_error(exc))
            await asyncio.sleep(self.typing_interval)


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
            self.message_id = await as_reply(None, lambda: self.sender.deliver_reply(
                self.target, self.message_id, final_text))
