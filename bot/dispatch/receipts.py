"""Reactions as receipts: the bot's reactions on people's messages, and people's on its replies.

With ``ack_reaction`` set, a person's message gets that reaction once the inbox holds it;
when its run ends, ``done_reaction`` (answered) or ``error_reaction`` (failed, refused,
given up) replaces it, or it is removed (stopped, dropped from a full queue). The bot's
reactions are best effort: adapters pace them below everything else and drop them under
rate limits, and a reaction that fails never touches the reply. The run may end on
another replica than the one that put the ack: the end names the ack it replaces.

A person's reaction on one of Roost's replies (found by the platform id the reply was
delivered as) goes to the plugins' ``roost_reaction`` hook with the reply's run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal

from bot.config.settings import Settings
from bot.contracts.channel import Capabilities, Channel
from bot.contracts.messages import InboundMessage, ReactionEvent, ReplyReaction
from bot.storage.inbox import Inbox

log = logging.getLogger("roost.dispatch.receipts")

Outcome = Literal["done", "error", "dropped"]
"""How a run's messages ended: answered, failed (or refused), or not answered at all."""

ReactionHandler = Callable[[ReplyReaction], Awaitable[None]]
"""Who hears of people's reactions on Roost's replies (the plugins' ``roost_reaction``)."""

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]

FALLBACKS = {"✅": "👍", "✔": "👍", "☑": "👍", "⚠": "🤷", "❌": "👎", "❗": "🤯",
             "⏳": "👀", "⌛": "👀"}
"""What a receipt becomes where the platform takes only a fixed list (Telegram's has
neither ✅ nor ⚠️)."""

VARIATION = "\ufe0f"


def fitted(emoji: str, capabilities: Capabilities) -> str | None:
    """``emoji`` as the channel can put it: itself, or its :data:`FALLBACKS` entry where the
    channel takes a fixed list without it; ``None`` if neither is on the list."""
    allowed = capabilities.reaction_emoji
    if allowed is None or emoji in allowed:
        return emoji
    bare = emoji.replace(VARIATION, "")
    for candidate in (bare, FALLBACKS.get(bare)):
        if candidate is not None and candidate in allowed:
            return candidate
    return None


class Receipts:
    """Puts the receipts on people's messages and hands reactions on replies to plugins."""

    def __init__(self, settings: Settings, channels: Mapping[str, Channel], inbox: Inbox, *,
                 spawn: Spawn, reactions: ReactionHandler | None = None) -> None:
        """``spawn`` starts a tracked task (the dispatcher's, so draining waits for the
        receipts too); ``reactions`` hears of reactions on replies (``None``: nobody)."""
        self.settings = settings
        self.channels = channels
        self.inbox = inbox
        self.spawn = spawn
        self.reactions = reactions
        self._acks: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        """Acks being put, by message, so the end of a quick run waits for its ack."""

    def stored(self, message: InboundMessage) -> None:
        """``message`` is in the inbox and will be run: put the ack on it."""
        ack = self.settings.ack_reaction
        if not ack or not message.message_id:
            return
        key = (message.channel, message.chat_id, message.message_id)
        task = self.spawn(self._put(message, ack, None))
        self._acks[key] = task
        task.add_done_callback(lambda done: self._forget(key, done))

    def ended(self, message: InboundMessage, entries: Sequence[int], outcome: Outcome) -> None:
        """The run answering inbox ``entries`` (``message``: the one, when there is one)
        ended: replace the ack on each of their messages."""
        if not self.settings.ack_reaction or not entries:
            return
        self.spawn(self._end(message, tuple(entries), outcome))

    async def reaction(self, event: ReactionEvent) -> None:
        """Someone's reaction: to the plugins if it is on one of Roost's replies."""
        if self.reactions is None:
            return
        try:
            found = await self.inbox.reply_run(event.channel, event.chat_id, event.message_id)
        except Exception:
            log.exception("%s: looking up the reply a reaction is on failed", event.channel)
            return
        if found is None:
            log.debug("%s: reaction on %s, not one of Roost's replies; ignored", event.channel,
                      event.message_id)
            return
        await self.reactions(ReplyReaction(event, *found))

    async def _end(self, message: InboundMessage, entries: tuple[int, ...],
                   outcome: Outcome) -> None:
        emoji = {"done": self.settings.done_reaction, "error": self.settings.error_reaction,
                 "dropped": ""}[outcome]
        messages = [message] if len(entries) == 1 else await self.inbox.messages_of(entries)
        for each in messages:
            earlier = self._acks.get((each.channel, each.chat_id, each.message_id))
            if earlier is not None:  # a quick run: its ack is still being put
                with contextlib.suppress(Exception):
                    await asyncio.shield(earlier)
            await self._put(each, emoji or None, self.settings.ack_reaction)

    async def _put(self, message: InboundMessage, emoji: str | None,
                   replacing: str | None) -> None:
        """Set the bot's reaction on ``message``; a failure is logged, never raised."""
        channel = self.channels.get(message.channel)
        if channel is None or not channel.capabilities.react or not message.message_id:
            return
        put = emoji
        if emoji is not None:
            put = fitted(emoji, channel.capabilities)
            if put is None:
                log.debug("%s takes no %r reaction; %s", message.channel, emoji,
                          "skipped" if replacing is None else "the ack is removed")
                if replacing is None:
                    return
        try:
            await channel.react(message.chat_id, message.message_id, put,
                                thread_id=message.thread_id,
                                replacing=None if replacing is None
                                else fitted(replacing, channel.capabilities))
        except Exception:
            log.exception("%s: reacting to %s failed", message.channel, message.message_id)

    def _forget(self, key: tuple[str, str, str], task: asyncio.Task[None]) -> None:
        if self._acks.get(key) is task:
            del self._acks[key]
