"""The :class:`DiscordChannel`: the channel contract, delegated to the parts it builds.

Its parts: :class:`Sessions` (the gateway sessions, sharded or not),
:class:`Inbound` (messages into the core and the catch-up), :class:`Interactions`
(slash commands), :class:`Rest` (posts, edits, deletes), :class:`Media`
(downloads and uploads) and a :class:`StreamedReply` per streamed reply.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

import discord

from bot.config.settings import Settings
from bot.contracts.channel import (
    Capabilities,
    Channel,
    ChannelHealth,
    InboundHandler,
    ReplyStream,
)
from bot.contracts.messages import (
    Attachment,
    ButtonPress,
    ButtonRows,
    InboundMessage,
    OutboundMessage,
)
from channels.chunking import split_message
from channels.delivery import DeliveryPolicy
from channels.discord.changes import REACT_WAIT, Changes, view_of
from channels.discord.common import (
    CATCHUP_LIMIT,
    CHANNEL_NAME,
    INTERACTION_TIMEOUT,
    MESSAGE_LIMIT,
    Intake,
    defuse_mentions,
    reply_reference,
    reply_target,
)
from channels.discord.endpoints import Endpoints
from channels.discord.inbound import Inbound
from channels.discord.interactions import Interactions
from channels.discord.media import Media
from channels.discord.rest import Rest
from channels.discord.shards import Sessions
from channels.discord.stream import StreamedReply
from channels.inflight import InFlight
from channels.uploading import opened_files

if TYPE_CHECKING:
    from bot.contracts.commands import Command

STOP_GRACE = 10.0
"""How long :meth:`DiscordChannel.stop` lets sends in flight finish."""


class DiscordChannel(Channel):
    """Discord through discord.py's gateway client; see the package docstring."""

    name = CHANNEL_NAME
    capabilities = Capabilities(buttons=True, edit=True, react=True, edits_in=True,
                                deletions_in=True, reactions_in=True)

    def __init__(self, settings: Settings, *, guild_ready_timeout: float = 1.0,
                 ready_timeout: float = 60.0, delivery: DeliveryPolicy | None = None,
                 edit_interval: float = 1.0,
                 interaction_timeout: float = INTERACTION_TIMEOUT,
                 catchup_limit: int | None = None, call_timeout: float | None = None,
                 max_ratelimit_timeout: float = 30.0, react_wait: float = REACT_WAIT) -> None:
        """Read the token and endpoints from ``settings`` and build the parts; nothing
        connects yet.

        ``guild_ready_timeout`` is how long discord.py waits for further guilds
        before ``on_ready`` (and so :meth:`start`) returns; ``ready_timeout``
        bounds the whole start. ``delivery`` tunes retries of 5xx and connection
        errors; ``edit_interval`` spaces streaming edits. ``catchup_limit``
        bounds the messages read back per chat when catching up (default: the
        ``discord_catchup_limit`` setting if there is one, else 100).
        ``call_timeout``, if set, bounds each REST call, discord.py's own
        queueing for its rate-limit buckets included (so it must be generous;
        without it a stalled call is bounded by aiohttp's 5-minute default).
        discord.py waits out 429s up to ``max_ratelimit_timeout`` seconds by
        itself, longer ones reach :func:`deliver` as :class:`RateLimited`.
        ``react_wait`` bounds a reaction call (one that would wait longer is dropped).
        """
        if settings.discord_bot_token is None:
            raise ValueError("DISCORD_BOT_TOKEN is not set")
        self.settings = settings
        self.edit_interval = edit_interval
        configured = getattr(settings, "discord_catchup_limit", None)
        limit = int(catchup_limit if catchup_limit is not None
                    else configured if isinstance(configured, int) else CATCHUP_LIMIT)
        delivery = delivery or DeliveryPolicy()
        self.inflight = InFlight()
        self.intake = Intake()
        self.rest = Rest(delivery=delivery, call_timeout=call_timeout)
        self.media = Media(settings, self.rest, delivery=delivery)
        self.inbound = Inbound(self.intake, self.rest, self.inflight, catchup_limit=limit)
        self.interactions = Interactions(self.intake, self.rest, self.inflight,
                                         timeout=interaction_timeout)
        self.changes = Changes(self.intake, self.rest, translate=self.inbound.translate,
                               react_wait=react_wait)
        self.sessions = Sessions(
            settings, token=settings.discord_bot_token.get_secret_value(),
            intake=self.intake, rest=self.rest, inbound=self.inbound,
            interactions=self.interactions, changes=self.changes, inflight=self.inflight,
            endpoints=Endpoints(settings), guild_ready_timeout=guild_ready_timeout,
            ready_timeout=ready_timeout, max_ratelimit_timeout=max_ratelimit_timeout)

    @property
    def client(self) -> discord.Client | None:
        """The discord.py client REST calls go through (``None`` before :meth:`start`)."""
        return self.rest.client

    # -- lifecycle -----------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Log in, connect to the gateway and return once ``on_ready`` fired.

        Sharded (``discord_shard_count`` above 1, or replicas on PostgreSQL): once
        the shards this process took are ready (:mod:`channels.discord.shards`).
        """
        self.intake.start(handler)
        try:
            await self.sessions.start(self.leadership)
        except BaseException:
            await self.stop()
            raise

    def health(self) -> ChannelHealth:
        """Ready while every gateway session is up (READY or RESUMED since the last drop).

        What ``/readyz`` shows; a shard's problem is named with its shard.
        """
        return self.sessions.health()

    async def stop_intake(self) -> None:
        """Hand the core no more messages; the REST client keeps sending until :meth:`stop`.

        Discord never redelivers, but nothing is lost: what arrives from now
        on advances no cursor, so the catch-up after the restart reads it
        from the history (the core's cursors stop at its last recorded message).
        """
        self.intake.close()
        self.inbound.stop()
        await self.sessions.release_shards()  # other replicas take them over at once

    async def stop(self) -> None:
        """Let sends in flight finish (10 s at most), then close the client."""
        self.sessions.begin_stop()
        self.intake.close()
        await self.inflight.wait_idle(STOP_GRACE)
        await self.inflight.cancel_tasks()
        await self.sessions.stop()
        await self.media.close()

    # -- inbound ---------------------------------------------------------------

    async def catch_up(self, cursors: Mapping[str, str]) -> None:
        """Read back what was said while Roost was away (see :meth:`Inbound.catch_up`)."""
        await self.inbound.catch_up(cursors)

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """Replace the global application commands with ``commands`` (aliases included)."""
        await self.interactions.register_commands(commands)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of ``attachment`` from Discord's CDN (see :meth:`Media.download`)."""
        return await self.media.download(attachment, limit)

    # -- outbound --------------------------------------------------------------

    @property
    def max_upload(self) -> int:
        """The largest file uploaded, in bytes (``discord_max_upload_mb``)."""
        return self.media.max_upload

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one reply; the id of its last message (``None`` for an interaction's).

        Split, referenced in groups, as the interaction's answer if one is
        pending. With ``replace`` the draft is edited into the first piece, or,
        if that edit fails for good, the reply is posted anew and the draft
        deleted. ``message.files`` are uploaded after the text, one message
        each; a file over the upload limit raises :class:`MediaTooLarge` before
        anything is posted. Raises when the reply was not delivered.
        """
        # Every file opened once and checked before anything is posted; uploads read
        # from those descriptors.
        with self.inflight.busy(), opened_files(message.files, self.media.check_file) as opened:
            pieces = split_message(defuse_mentions(message.text), MESSAGE_LIMIT)
            target = reply_target(message)
            reference = reply_reference(message, target)
            # A message with buttons (a prompt) is its own message: the command's
            # answer stays for the reply.
            pending = None if message.replace or message.buttons \
                else self.interactions.claim(message)
            if pending is not None and await self.interactions.answer(pending, pieces):
                if message.files:
                    # An interaction's answer is text; its files follow in the channel.
                    await self.media.upload_files(target, message.files, opened, None,
                                                  message.delivery_id)
                return None
            last = await self.rest.deliver_reply(
                target, reference, pieces, draft=message.replace or None,
                delivery_id=message.delivery_id,
                view=view_of(message.buttons) if message.buttons else None)
            if message.files:
                uploaded = await self.media.upload_files(
                    target, message.files, opened, reference if last is None else None,
                    message.delivery_id)
                last = uploaded or last
            return last

    async def answer_press(self, press: ButtonPress, note: str | None = None, *,
                           alert: bool = False) -> None:
        """The press was acknowledged on arrival; ``note`` goes to the presser alone
        (an ephemeral follow-up; Discord has no alerts)."""
        await self.changes.answer(press, note)

    async def edit(self, chat_id: str, message_id: str, text: str,
                   buttons: ButtonRows = (), *, thread_id: str | None = None) -> bool:
        """Edit one of the bot's messages, its buttons replaced (none: removed); ``False``
        if it is gone."""
        with self.inflight.busy():
            try:
                await self.rest.edit(int(thread_id or chat_id), int(message_id),
                                     defuse_mentions(text)[:MESSAGE_LIMIT],
                                     view_of(buttons) if buttons else None, buttons=True)
            except discord.NotFound:
                return False
            return True

    async def react(self, chat_id: str, message_id: str, emoji: str | None, *,
                    thread_id: str | None = None, replacing: str | None = None) -> bool:
        """Put ``emoji`` in place of the bot's earlier reaction (``None``: remove it)."""
        with self.inflight.busy():
            return await self.changes.react(int(thread_id or chat_id), int(message_id), emoji,
                                            replacing=replacing)

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete one of the bot's messages (``chat_id`` may be a thread); gone is fine."""
        with self.inflight.busy():
            await self.rest.delete(int(chat_id), int(message_id))

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """A draft message edited as the reply grows, unless streaming is off for discord."""
        if self.rest.client is None or not self.settings.streams(self.name):
            return None
        return StreamedReply(self.rest, self.inflight, message,
                             edit_interval=self.edit_interval).stream

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Show "typing…" in the message's channel or thread, refreshed until the block ends."""
        if self.rest.client is None:
            yield
            return
        task = self.inflight.spawn(
            self.rest.keep_typing(int(message.thread_id or message.chat_id)))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
