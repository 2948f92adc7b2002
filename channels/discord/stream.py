"""Streaming a reply by editing a draft message.

A :class:`StreamedReply` posts a draft, edits it as the reply grows and puts
the final pieces in its place, all through :class:`Rest`.
"""

from __future__ import annotations

import asyncio

from bot.contracts.messages import InboundMessage, OutboundMessage
from channels.chunking import split_message
from channels.delivery import EditStream
from channels.discord.common import MESSAGE_LIMIT, defuse_mentions, fit, log, reply_reference
from channels.discord.rest import Rest
from channels.inflight import InFlight


class StreamedReply:
    """The callbacks behind one :class:`EditStream`: draft, edits, final pieces."""

    def __init__(self, rest: Rest, inflight: InFlight, message: InboundMessage, *,
                 edit_interval: float) -> None:
        """The reply to ``message``, edited at most every ``edit_interval`` seconds."""
        self.rest = rest
        self.inflight = inflight
        self.target = int(message.thread_id or message.chat_id)
        self.reference = reply_reference(OutboundMessage.reply_to_message(message, ""),
                                         self.target)
        self.shown: dict[str, str] = {}
        self.editing: asyncio.Task[None] | None = None
        self.stream: EditStream = EditStream(send=self.send, edit=self.edit,
                                             finalize=self.finalize, limit=MESSAGE_LIMIT,
                                             interval=edit_interval)

    async def send(self, draft: str) -> str:
        """Post the first draft; its id (``""`` if it could not be posted)."""
        text = fit(defuse_mentions(draft))
        with self.inflight.busy():
            try:
                sent = await self.rest.post(self.target, text, self.reference)
            except Exception:
                # A lost draft must not end the run: the final reply is sent whole.
                log.warning("discord: a streaming draft could not be sent", exc_info=True)
                return ""
        self.shown[str(sent.id)] = text
        return str(sent.id)

    async def edit(self, message_id: str, draft: str) -> None:
        """Show the reply so far in the draft."""
        if not message_id:
            return
        # Shielded: the stream cancels a pending edit when the reply is final,
        # but a request already sent would still be applied, possibly after
        # the final edit. finalize() waits for it instead.
        self.editing = asyncio.ensure_future(
            self._edit(message_id, fit(defuse_mentions(draft))))
        await asyncio.shield(self.editing)

    async def _edit(self, message_id: str, text: str) -> None:
        with self.inflight.busy():
            await self.rest.edit(self.target, int(message_id), text)
        self.shown[message_id] = text

    async def finalize(self, message_id: str | None, final_text: str | None) -> str | None:
        """Put the final pieces in the draft's place (none: delete the draft); the id of
        the message that now carries the reply (the draft may have given way to a new one)."""
        if self.editing is not None:
            await asyncio.gather(self.editing, return_exceptions=True)
        with self.inflight.busy():
            pieces = split_message(defuse_mentions(final_text or ""), MESSAGE_LIMIT)
            draft = message_id or None
            return await self.rest.deliver_reply(
                self.target, self.reference, pieces, draft=draft,
                shown=self.shown.get(draft) if draft else None)
