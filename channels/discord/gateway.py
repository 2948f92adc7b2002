"""The discord.py client of one gateway session, and the guards that keep one bad
gateway payload from ending it.

A :class:`GatewayClient` reports what its session receives to the
:class:`GatewayEvents` it was built with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import discord

from bot.contracts.channel import READY, ChannelHealth
from channels.discord.common import log
from channels.logline import short as _short


class GatewayEvents(Protocol):
    """Where a gateway session's events go."""

    @property
    def stopping(self) -> bool:
        """Whether the channel is shutting down (a disconnect is then no problem)."""

    def session_ready(self, client: GatewayClient, *, again: bool) -> None:
        """``client``'s session is up: a READY, ``again`` after a reconnect that could
        not resume (what was missed meanwhile must be read back from the history)."""

    async def message(self, message: discord.Message) -> None:
        """A message was posted where the bot can read it."""

    async def interaction(self, interaction: discord.Interaction[discord.Client]) -> None:
        """Someone used one of the bot's application commands or pressed a button."""

    async def edited(self, payload: discord.RawMessageUpdateEvent) -> None:
        """A message was updated (edited, or an embed unfurled)."""

    async def deleted(self, channel_id: int, message_ids: list[int],
                      guild_id: int | None) -> None:
        """Messages were deleted."""

    async def reaction(self, payload: discord.RawReactionActionEvent) -> None:
        """A reaction was added or removed."""


class GatewayClient(discord.Client):
    """A plain client whose events go to :class:`GatewayEvents` (no command tree).

    One gateway session (all of the bot's guilds, or one shard's with
    ``shard_id``/``shard_count``), or only REST calls when it never connects.
    """

    def __init__(self, events: GatewayEvents, *, taken_at: float | None = None,
                 **options: Any) -> None:
        """``taken_at``: when this replica took the session's shard over from another
        (``None``: at start); ``options`` go to :class:`discord.Client`."""
        super().__init__(**options)
        self.events = events
        self.connected = asyncio.Event()
        """Set at its first READY."""
        self.health = ChannelHealth(False, "connecting")
        """Its gateway session's part of the channel's health."""
        self.taken_at = taken_at
        """When this replica took its shard over from another (``None``: at start)."""

    def not_ready(self, detail: str) -> None:
        """Report the session down until its next READY; ``detail`` says why."""
        self.health = ChannelHealth(False, detail)

    async def on_ready(self) -> None:
        # discord.py fires this after every READY: at start, and after a
        # reconnect that could not resume (the missed messages are lost to
        # the gateway and must be read back from the channels' history).
        again = self.connected.is_set()
        self.connected.set()
        self.health = READY
        self.events.session_ready(self, again=again)

    async def on_resumed(self) -> None:
        self.health = READY

    async def on_disconnect(self) -> None:
        # discord.py reconnects by itself (resuming when it can); until READY or
        # RESUMED, nothing arrives.
        if not self.events.stopping:
            self.health = ChannelHealth(False, "gateway disconnected; reconnecting")

    async def on_message(self, message: discord.Message) -> None:
        await self.events.message(message)

    async def on_interaction(self, interaction: discord.Interaction[discord.Client]) -> None:
        await self.events.interaction(interaction)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        await self.events.edited(payload)

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        await self.events.deleted(payload.channel_id, [payload.message_id], payload.guild_id)

    async def on_raw_bulk_message_delete(self,
                                         payload: discord.RawBulkMessageDeleteEvent) -> None:
        await self.events.deleted(payload.channel_id, sorted(payload.message_ids),
                                  payload.guild_id)

    async def on_raw_reaction_add(self, payload: discord.RawReactionActionEvent) -> None:
        await self.events.reaction(payload)

    async def on_raw_reaction_remove(self, payload: discord.RawReactionActionEvent) -> None:
        await self.events.reaction(payload)

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        # discord.py calls on_error from inside its except block: the exception is current.
        log.exception("discord: handling %s failed", event_method)


def guard_parsers(client: discord.Client) -> None:
    """Make a gateway event the library cannot parse a logged, skipped event.

    discord.py calls its parsers straight from the websocket loop, so one
    malformed payload (a missing field, a bad snowflake) would otherwise
    escape ``connect()`` and end the client.
    """
    parsers = client._connection.parsers

    def guarded(event: str, parser: Callable[[Any], None]) -> Callable[[Any], None]:
        def parse(data: Any) -> None:
            try:
                parser(data)
            except Exception as exc:
                # One line: a traceback per hostile payload would flood the log.
                log.warning("discord: skipped a malformed %s payload (%s: %s)", event,
                            type(exc).__name__, _short(exc))
        return parse

    for event, parser in list(parsers.items()):
        parsers[event] = guarded(event, parser)


def guard_frames(client: discord.Client) -> None:
    """Make a gateway frame that is not JSON a logged, skipped frame.

    discord.py decodes each frame in ``DiscordWebSocket.received_message``,
    unguarded: a frame that is not JSON, or nested past the decoder's depth,
    escapes ``connect()`` and drops the connection (and the adapter would
    reconnect after a backoff, once per such frame). Each websocket discord.py
    opens passes through ``ConnectionState._update_references``, so that is
    where its ``received_message`` gets the guard.
    """
    state = client._connection
    update_references = state._update_references

    def update(ws: discord.gateway.DiscordWebSocket) -> None:
        update_references(ws)
        received = ws.received_message

        async def guarded(msg: Any, /) -> None:
            try:
                await received(msg)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                log.warning("discord: skipped a gateway frame that could not be decoded "
                            "(%s: %s)", type(exc).__name__, _short(exc, 100))

        setattr(ws, "received_message", guarded)  # noqa: B010  (mypy: method assignment)

    setattr(state, "_update_references", update)  # noqa: B010
