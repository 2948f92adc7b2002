"""Streaming a run's reply into a channel draft, and journaling the draft's id."""

from __future__ import annotations

import re
from collections.abc import Sequence

from bot.contracts.channel import Channel, ReplyStream
from bot.contracts.messages import InboundMessage
from bot.contracts.sanitize import Sanitizer, run_pipeline
from bot.engine.runloop import NO_REPLY
from bot.storage.inbox import Inbox


def draft_id(stream: ReplyStream | None) -> str | None:
    """The platform id of a stream's draft (streams of older channel plugins have none)."""
    value = getattr(stream, "message_id", None)
    return str(value) if value else None


class DraftWatch:
    """Journals the id of a run's draft once the channel showed one."""

    def __init__(self, inbox: Inbox, entries: tuple[int, ...]) -> None:
        self.inbox = inbox
        self.entries = entries
        self.seen: str | None = None

    def check(self, stream: ReplyStream | None) -> None:
        draft = draft_id(stream)
        if draft and draft != self.seen and self.entries:
            self.seen = draft
            self.inbox.set_draft(self.entries, draft)


class StreamBridge:
    """Forwards streamed text to a channel, holding back a possible NO_REPLY.

    Text the model writes before calling tools becomes its own message, so the
    final answer starts a fresh one instead of being glued onto it.
    """

    def __init__(self, channel: Channel | None, message: InboundMessage,
                 sanitizers: Sequence[Sanitizer]) -> None:
        self.channel = channel
        self.message = message
        self.sanitizers = sanitizers
        self.stream = channel.open_stream(message) if channel is not None else None
        self.text = ""
        self.visible = ""
        self.shown = False

    async def end_block(self) -> None:
        if self.stream is None or self.channel is None:
            return
        if self.shown:
            block = run_pipeline(self.text, self.sanitizers)
            await self.stream.finish(block if block and block != NO_REPLY else None)
            self.stream = self.channel.open_stream(self.message)
        self.text = ""
        self.visible = ""
        self.shown = False

    async def restart(self) -> None:
        """The model's answer is being generated again: the draft starts over."""
        self.text = ""

    async def add(self, fragment: str) -> None:
        if self.stream is None:
            return
        self.text += fragment
        # Show only what the final reply will show: sanitized, and nothing from
        # a thinking or tool block whose closing tag has not arrived yet.
        visible = run_pipeline(_complete_part(self.text), self.sanitizers)
        if not visible or NO_REPLY.startswith(visible) or visible == self.visible:
            return
        self.shown = True
        self.visible = visible
        await self.stream.push(visible)


_HIDDEN_BLOCK = re.compile(
    r"<(think|thinking|thought|antthinking|tool_call|function_calls?|tool_use|invoke)\b",
    re.IGNORECASE)


def _complete_part(text: str) -> str:
    """``text`` up to any hidden block still open, or a tag still being written."""
    for match in _HIDDEN_BLOCK.finditer(text):
        close = re.compile(rf"</{match.group(1)}\s*>", re.IGNORECASE)
        if not close.search(text, match.end()):
            text = text[:match.start()]
            break
    lt = text.rfind("<")
    if lt != -1 and ">" not in text[lt:]:
        text = text[:lt]
    return text
