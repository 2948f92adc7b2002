"""Presses, edits, deletions and reactions on Discord, and the bot's buttons and reactions.

A button press is an ``INTERACTION_CREATE`` of type 3 (component): it is
acknowledged at once with a deferred update (Discord wants a callback within
3 s, else "Unknown interaction", 10062) and then handed to the core; a note in
answer is an ephemeral follow-up. ``MESSAGE_UPDATE`` with an ``edited_timestamp``
is a person's edit (updates without one, or without the content, are embeds
being unfurled and are skipped); ``MESSAGE_DELETE``/``_BULK`` are deletions;
``MESSAGE_REACTION_ADD``/``_REMOVE`` are reactions (intents
``GUILD_MESSAGE_REACTIONS`` and ``DIRECT_MESSAGE_REACTIONS``, in the defaults).
The bot's reactions are put with ``PUT .../reactions/{emoji}/@me`` and replaced
by removing the one it put before; one that would wait out a rate limit longer
than :data:`REACT_WAIT` is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import discord

from bot.contracts.messages import (
    ButtonPress,
    ButtonRows,
    InboundEvent,
    InboundMessage,
    MessageDeletion,
    MessageEdit,
    ReactionEvent,
)
from channels.discord.common import (
    CHANNEL_NAME,
    RECENT_IDS,
    Intake,
    RecentIds,
    log,
    place_of,
    problem,
    snowflake,
)
from channels.discord.rest import Rest
from channels.logline import short as _short

REACT_WAIT = 2.0
"""Seconds a reaction may take, discord.py's waits for its rate limits included;
past that it is dropped (a reaction is never worth waiting for)."""
STYLES = {"primary": discord.ButtonStyle.primary, "secondary": discord.ButtonStyle.secondary,
          "success": discord.ButtonStyle.success, "danger": discord.ButtonStyle.danger}


def view_of(rows: ButtonRows) -> discord.ui.View:
    """``rows`` as message components (a stopped view: discord.py does not keep it,
    presses reach the adapter as interactions)."""
    view = discord.ui.View(timeout=None)
    for index, row in enumerate(r for r in rows if r):
        for button in row:
            view.add_item(discord.ui.Button(label=button.label, custom_id=button.data,
                                            style=STYLES[button.style], row=index))
    view.stop()
    return view


def emoji_name(emoji: discord.PartialEmoji) -> str:
    """A reaction's emoji as the core sees it: Unicode, or ``name:id`` for a custom one."""
    return f"{emoji.name}:{emoji.id}" if emoji.id else str(emoji.name)


def skip_partial_updates(client: discord.Client) -> None:
    """Skip ``MESSAGE_UPDATE`` payloads without author or content before discord.py parses
    them: such an update only adds embeds (no edit), and discord.py cannot build a message
    from it."""
    parsers = client._connection.parsers
    parse = parsers["MESSAGE_UPDATE"]

    def partial_skipped(data: Any) -> None:
        if isinstance(data, dict) and ("author" not in data or "content" not in data):
            log.debug("discord: a partial update of message %s (no edit); skipped",
                      _short(data.get("id"), 40))
            return
        parse(data)

    parsers["MESSAGE_UPDATE"] = partial_skipped


class Changes:
    """Presses, edits, deletions and reactions in; presses answered, reactions out."""

    def __init__(self, intake: Intake, rest: Rest, *, translate: Callable[
            [discord.Message, discord.ClientUser], InboundMessage],
                 react_wait: float = REACT_WAIT) -> None:
        """``translate`` is the adapter's translation of a new message (the same for an
        edited one); ``react_wait`` bounds a reaction call."""
        self.intake = intake
        self.rest = rest
        self.translate = translate
        self.react_wait = react_wait
        self._seen = RecentIds(RECENT_IDS)
        self._mine: OrderedDict[tuple[int, int], str] = OrderedDict()
        """The reaction the bot last put on each message (bounded), to replace it."""

    async def _hand(self, event: InboundEvent) -> None:
        handler = self.intake.handler
        if self.intake.open and handler is not None:
            await handler(event)

    # -- in -----------------------------------------------------------------------

    async def press(self, interaction: discord.Interaction[discord.Client]) -> None:
        """A button pressed: acknowledged at once (deferred update), then handed in."""
        if not self.intake.open or not self._seen.add(interaction.id):
            return
        try:
            data: Any = interaction.data or {}
            custom_id = data.get("custom_id")
            message = interaction.message
            if not isinstance(custom_id, str) or message is None:
                raise ValueError("no custom_id or message")
            in_guild = interaction.guild_id is not None
            chat_id, chat_type, thread_id = place_of(interaction.channel, in_guild,
                                                   interaction.channel_id)
            press = ButtonPress(
                channel=CHANNEL_NAME, chat_id=chat_id, message_id=str(snowflake(message.id)),
                data=custom_id, user_id=str(snowflake(interaction.user.id)),
                user_name=str(interaction.user.display_name), press_id=str(interaction.id),
                token=interaction.token, chat_type=chat_type, thread_id=thread_id,
                group_id=str(interaction.guild_id) if in_guild else None, raw=interaction)
        except Exception as exc:
            log.warning("discord: skipped a malformed button press %s (%s)",
                        _short(interaction.id, 40), problem(exc))
            return
        try:
            await interaction.response.defer()
        except discord.HTTPException as exc:
            # Too late (10062) or answered already: the person saw "This interaction
            # failed"; the press itself still counts.
            log.warning("discord: could not acknowledge the press %s (%s)", press.press_id,
                        _short(exc, 200))
        await self._hand(press)

    async def edited(self, payload: discord.RawMessageUpdateEvent) -> None:
        """A message edited by its author (not an embed unfurled): handed in as an edit."""
        client = self.rest.client
        if client is None or client.user is None or not payload.data.get("edited_timestamp"):
            return
        message = payload.message
        try:
            author = message.author
            if author.bot or author.id == client.user.id or message.webhook_id is not None:
                return
            inbound = self.translate(message, client.user)
            edited = message.edited_at.timestamp() if message.edited_at else None
        except Exception as exc:
            log.warning("discord: skipped a malformed edit of %s (%s)",
                        _short(payload.message_id, 40), problem(exc))
            return
        # An edit is its own delivery: the message id with the edit time.
        inbound = dataclasses.replace(
            inbound, event_id=f"{inbound.message_id}@{payload.data.get('edited_timestamp')}")
        await self._hand(MessageEdit(inbound, **({"edited_at": edited} if edited else {})))

    async def deleted(self, channel_id: int, message_ids: list[int],
                      guild_id: int | None) -> None:
        """Messages deleted in a channel (one, or a bulk deletion)."""
        client = self.rest.client
        channel = client.get_channel(channel_id) if client is not None else None
        chat_id, _, thread_id = place_of(channel, guild_id is not None, channel_id)
        await self._hand(MessageDeletion(
            channel=CHANNEL_NAME, chat_id=chat_id, thread_id=thread_id,
            message_ids=tuple(str(i) for i in sorted(message_ids)),
            event_id=f"delete:{min(message_ids)}"))

    async def reaction(self, payload: discord.RawReactionActionEvent) -> None:
        """Someone else's reaction added or removed."""
        client = self.rest.client
        if client is None or client.user is None or payload.user_id == client.user.id:
            return
        member = payload.member
        added = payload.event_type == "REACTION_ADD"
        emoji = emoji_name(payload.emoji)
        await self._hand(ReactionEvent(
            channel=CHANNEL_NAME, chat_id=str(payload.channel_id),
            message_id=str(payload.message_id), user_id=str(payload.user_id),
            user_name=str(member.display_name) if member is not None else "", emoji=emoji,
            added=added, event_id=f"{payload.message_id}:{payload.user_id}:{emoji}:{added}"))

    # -- out ------------------------------------------------------------------------

    async def answer(self, press: ButtonPress, note: str | None) -> None:
        """An ephemeral follow-up with ``note`` (the press was acknowledged on arrival)."""
        if note is None:
            return
        interaction = press.raw
        if not isinstance(interaction, discord.Interaction):
            log.info("discord: press %s came to another process; its note is not shown",
                     press.press_id)
            return
        try:
            await interaction.followup.send(note[:2000], ephemeral=True)
        except discord.HTTPException as exc:
            log.info("discord: the note for press %s was not shown (%s)", press.press_id,
                     _short(exc, 200))

    async def react(self, target: int, message_id: int, emoji: str | None, *,
                    replacing: str | None = None) -> bool:
        """Put ``emoji`` on a message in place of the bot's earlier reaction there
        (``None``: only remove that; ``replacing``: the earlier one if this process did
        not put it); ``False`` if Discord refused or it would wait."""
        client = self.rest.client
        if client is None or client.user is None:
            return False
        me = client.user
        message = client.get_partial_messageable(target).get_partial_message(message_id)
        key = (target, message_id)
        before = self._mine.get(key, replacing)
        try:
            async with asyncio.timeout(self.react_wait):
                if emoji is not None and emoji != before:
                    await message.add_reaction(emoji)
                if before is not None and before != emoji:
                    with contextlib.suppress(discord.NotFound):
                        await message.remove_reaction(before, me)
        except TimeoutError:
            log.info("discord: reaction on %s dropped (rate limited)", message_id)
            return False
        except discord.HTTPException as exc:
            log.info("discord: reaction on %s not set (%s)", message_id, _short(exc, 200))
            return False
        self._mine.pop(key, None)
        if emoji is not None:
            self._mine[key] = emoji
            if len(self._mine) > RECENT_IDS:
                self._mine.popitem(last=False)
        return True

