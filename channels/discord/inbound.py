"""Messages into the core: live ones, and those read back when catching up.

:class:`Inbound` translates each gateway message into an
:class:`~bot.contracts.messages.InboundMessage`, hands it to the core once, and
keeps the per-channel cursors a catch-up after a gap starts from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import discord

from bot.contracts.messages import InboundMessage
from channels.discord.common import (
    ADDRESSED_TYPES,
    CHANNEL_NAME,
    RECENT_IDS,
    Intake,
    Malformed,
    RecentIds,
    log,
    place_of,
    problem,
    snowflake,
    strip_mentions,
)
from channels.discord.media import attachment_of
from channels.discord.rest import Rest
from channels.inflight import InFlight
from channels.logline import short as _short


class Inbound:
    """Gateway messages translated and handed to the core once, and the catch-up after a gap."""

    def __init__(self, intake: Intake, rest: Rest, inflight: InFlight, *,
                 catchup_limit: int) -> None:
        """``catchup_limit`` bounds the messages read back per chat when catching up."""
        self.intake = intake
        self.rest = rest
        self.inflight = inflight
        self.catchup_limit = catchup_limit
        self._seen = RecentIds(RECENT_IDS)
        self._cursors: dict[int, int] = {}
        """Per channel (or thread), the newest message id the core has (or was
        not meant to get): where a catch-up after a reconnect starts."""
        self._gaps: dict[int, int] = {}
        """Per channel, the id just before the oldest message the handler
        failed on: a catch-up starts there, so that message is read again."""
        self._catching_up: asyncio.Task[None] | None = None

    def stop(self) -> None:
        """Stop the catch-up under way, if any (intake is closed)."""
        if self._catching_up is not None:
            self._catching_up.cancel()

    async def message(self, message: discord.Message) -> None:
        """A message arrived live: hand it to the core, unless intake is closed."""
        if self.intake.open:
            await self._take(message)
        else:
            log.debug("discord: message %s arrived while shutting down; the catch-up after "
                      "the restart reads it", _short(getattr(message, "id", "?"), 40))

    async def _take(self, message: discord.Message) -> None:
        """Hand one message (live or read back from history) to the core.

        Bots (this one included), webhooks and system messages are skipped
        the same way whether they arrive live or in a catch-up. A message the
        core already has (same id) is skipped; one whose handler raised
        leaves a gap that the next catch-up starts from, and the error
        propagates (a catch-up stops there, to keep the order).
        """
        client = self.rest.client
        handler = self.intake.handler
        if client is None or client.user is None or handler is None:
            return
        try:
            # discord.py stores some fields as the payload had them (content,
            # ids of partial objects), so a malformed one surfaces only here.
            where = snowflake(message.channel.id)
            author = message.author
            mine = author.id == client.user.id
            if mine:
                self.rest.own.add(message.id)
            skipped = (author.bot or mine or message.webhook_id is not None
                       or message.type not in ADDRESSED_TYPES)  # joins, pins, threads...
            inbound = None if skipped or message.id in self._seen \
                else self.translate(message, client.user)
        except Exception as exc:
            log.warning("discord: skipped a malformed message %s (%s)",
                        _short(getattr(message, "id", "?"), 40), problem(exc))
            return
        if inbound is None:
            if skipped:
                self._advance(where, message.id)
            else:
                log.debug("discord: message %s delivered twice; ignored", message.id)
            return
        try:
            await handler(inbound)
        except BaseException:
            gap = self._gaps.get(where)
            self._gaps[where] = min(gap, message.id - 1) if gap is not None \
                else message.id - 1
            raise
        self._seen.add(message.id)
        self._advance(where, message.id)

    def _advance(self, where: int, message_id: int) -> None:
        if message_id > self._cursors.get(where, 0):
            self._cursors[where] = message_id

    async def catch_up(self, cursors: Mapping[str, str]) -> None:
        """Read back what was said while Roost was away, and hand it to the core.

        Discord never redelivers a message a disconnected client missed, so
        each chat's history after its cursor (the last message id the core
        recorded) is read, oldest first, at most :attr:`catchup_limit`
        messages a chat, and treated as if it had arrived live. A key is a
        channel or thread id, or ``chat:thread`` for a thread, read after its
        own cursor. A guild channel's active threads that have no key of
        their own are read after the channel's cursor (ids are time-ordered,
        so that covers them if the cursor is the newest id of the chat,
        threads included). The core dedupes on the message id, so reading a
        range twice is harmless. Failures are logged per chat and do not
        stop the others.
        """
        own_keys = {int(key.rsplit(":", 1)[-1]) for key in cursors
                    if ":" in key and key.rsplit(":", 1)[-1].isdigit()}
        for key, cursor in cursors.items():
            if not self.intake.open:
                return
            place = key.rsplit(":", 1)[-1]
            if not place.isdigit() or not str(cursor).isdigit():
                log.warning("discord: cannot catch up %s after %r: not Discord ids", key, cursor)
                continue
            await self._catch_up_channel(int(place), int(cursor), own_keys)

    async def _catch_up_channel(self, where: int, after: int,
                                keyed: set[int] | frozenset[int] = frozenset()) -> None:
        client = self.rest.client
        if client is None:
            return
        try:
            channel = client.get_channel(where) or await self.rest.deliver(
                lambda: client.fetch_channel(where), what=f"reading discord channel {where}")
        except Exception:
            log.exception("discord: could not catch up channel %s: it cannot be read", where)
            return
        if isinstance(channel, discord.abc.Messageable):
            await self.catch_up_history(channel, where, after)
        if isinstance(channel, discord.TextChannel | discord.ForumChannel):
            # A thread is a session of its own but shares its parent's chat id,
            # so the core's cursor for the chat covers its threads too (ids are
            # time-ordered): the active threads are read after the same id.
            for thread in channel.threads:
                if thread.id not in keyed:
                    await self.catch_up_history(thread, thread.id, after)

    async def catch_up_history(self, channel: discord.abc.Messageable, where: int,
                                after: int) -> None:
        """Hand the messages of ``channel`` after ``after`` to the core, oldest first."""
        async def read() -> list[discord.Message]:
            # A fresh iterator per try: a failed one cannot be resumed.
            return [message async for message in channel.history(
                limit=self.catchup_limit, after=discord.Object(after), oldest_first=True)]

        try:
            missed = await self.rest.deliver(read, what=f"reading discord history of {where}")
        except Exception:
            log.exception("discord: could not read the history of %s after %s", where, after)
            return
        if len(missed) >= self.catchup_limit:
            log.warning("discord: catching up %s stopped at %d messages (the limit); the "
                        "oldest ones after %s were read, newer ones were not", where,
                        len(missed), after)
        taken = 0
        for message in missed:
            if not self.intake.open:
                return  # shutting down: the next start reads the rest
            try:
                await self._take(message)
            except Exception:
                log.exception("discord: the core did not take message %s while catching up "
                              "%s; the rest waits for the next catch-up", message.id, where)
                return
            taken += 1
        if taken:
            log.info("discord: caught up %d message(s) in %s", taken, where)
        gap = self._gaps.get(where)
        if gap is not None and after <= gap:
            self._gaps.pop(where)  # the failed message was read again and taken

    def reconnected(self) -> None:
        """A new gateway session (READY, not RESUME): Discord replayed nothing missed.

        Catch-ups run one after another; each reads from the cursors as they
        are when it starts, so a second reconnect during one is covered too.
        """
        if not self.intake.open:
            return
        previous = self._catching_up

        async def run() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            starts = {where: min(cursor, self._gaps.get(where, cursor))
                      for where, cursor in self._cursors.items()}
            for where, gap in self._gaps.items():
                starts.setdefault(where, gap)
            if starts:
                log.info("discord: new gateway session; catching up %d channel(s)",
                         len(starts))
                await self.catch_up({str(where): str(after) for where, after in starts.items()})

        self._catching_up = self.inflight.spawn(run())

    def translate(self, message: discord.Message, me: discord.ClientUser) -> InboundMessage:
        """The core's message for ``message``; raises :class:`Malformed` (or worse) if
        the payload was malformed."""
        snowflake(message.id)
        snowflake(message.author.id)
        if not isinstance(message.content, str):
            raise Malformed("its content is not text")
        # A guild discord.py has not cached (unavailable, or an id it never
        # heard of) leaves ``guild`` None, but the channel still names it: such
        # a message is a group message, never a DM.
        guild_id = message.guild.id if message.guild is not None \
            else getattr(message.channel, "guild_id", None)
        chat_id, chat_type, thread_id = place_of(message.channel, guild_id is not None)
        role = message.guild.self_role if message.guild is not None else None
        text = strip_mentions(message.content, me.id, role.id if role else None)
        reference = message.reference
        reply_to = str(reference.message_id) if reference and reference.message_id else None
        mentioned = (chat_type == "direct" or self._addresses_me(message, me, role)
                     or text.startswith("/"))
        return InboundMessage(
            channel=CHANNEL_NAME, chat_id=chat_id, chat_type=chat_type,
            sender_id=str(message.author.id), sender_name=str(message.author.display_name),
            text=text, message_id=str(message.id), reply_to=reply_to, thread_id=thread_id,
            mentioned=mentioned, raw=message,
            attachments=tuple(attachment_of(a, message.id) for a in message.attachments),
            group_id=str(guild_id) if guild_id is not None else None,
            event_id=str(message.id))

    def _addresses_me(self, message: discord.Message, me: discord.ClientUser,
                      role: discord.Role | None) -> bool:
        if any(user.id == me.id for user in message.mentions):
            return True
        if role is not None and any(r.id == role.id for r in message.role_mentions):
            return True
        reference = message.reference
        if reference is None:
            return False
        replied = reference.resolved
        if isinstance(replied, discord.Message) and replied.author.id == me.id:
            return True
        return reference.message_id is not None and reference.message_id in self.rest.own
