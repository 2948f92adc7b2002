"""Streaming a reply by editing a draft message."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bot.contracts.messages import InboundMessage, OutboundMessage
from channels.chunking import split_message
from channels.delivery import EditStream
from channels.discord.common import MESSAGE_LIMIT, _escape, _fit, _reference, log

if TYPE_CHECKING:
    from channels.discord.channel import DiscordChannel


class _StreamedReply:
    """The callbacks behind one :class:`EditStream`: draft, edits, final pieces."""

    def __init__(self, channel: DiscordChannel, message: InboundMessage) -> None:
        self.channel = channel
        self.target = int(message.thread_id or message.chat_id)
        self.reference = _reference(OutboundMessage.reply_to_message(message, ""), self.target)
        self.shown: dict[str, str] = {}
        self.editing: asyncio.Task[None] | None = None
        self.stream: EditStream = EditStream(send=self.send, edit=self.edit, finalize=self.finalize,
                                 limit=MESSAGE_LIMIT, interval=channel.edit_interval)

    async def send(self, draft: str) -> str:
        text = _fit(_escape(draft))
        with self.channel._busy():
            try:
                sent = await self.channel._post(self.target, text, self.reference)
            except Exception:
                # A lost draft must not end the run: the final reply is sent whole.
                log.warning("discord: a streaming draft could not be sent", exc_info=True)
                return ""
        self.shown[str(sent.id)] = text
        return str(sent.id)

    async def edit(self, message_id: str, draft: str) -> None:
        if not message_id:
            return
        # Shielded: the stream cancels a pending edit when the reply is final,
        # but a request already sent would still be applied, possibly after
        # the final edit. finalize() waits for it instead.
        self.editing = asyncio.ensure_future(self._edit(message_id, _fit(_escape(draft))))
        await asyncio.shield(self.editing)

    async def _edit(self, message_id: str, text: str) -> None:
        with self.channel._busy():
            await self.channel._edit(self.target, int(message_id), text)
        self.shown[message_id] = text

    async def finalize(self, message_id: str | None, final_text: str | None) -> None:
        if self.editing is not None:
            await asyncio.gather(self.editing, return_exceptions=True)
        with self.channel._busy():
            pieces = split_message(_escape(final_text or ""), MESSAGE_LIMIT)
            draft = message_id or None
            last = await self.channel._deliver_reply(
                self.target, self.reference, pieces, draft=draft,
                shown=self.shown.get(draft) if draft else None)
            # The draft may have given way to a new message: name the one
            # that now carries the reply.
            self.stream.message_id = last
