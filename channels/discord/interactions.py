"""Slash commands: registration, deferred interactions and their answers.

:class:`Interactions` syncs the application commands, defers each use at once
and hands it to the core as ``/name args``; the reply to it answers the
interaction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import discord

from bot.contracts.messages import ChatType, InboundMessage, OutboundMessage
from channels.discord.common import (
    CHANNEL_NAME,
    COMMAND_NAME,
    MAX_COMMANDS,
    NO_PINGS,
    RECENT_IDS,
    Intake,
    Malformed,
    RecentIds,
    log,
    place_of,
    problem,
    snowflake,
)
from channels.discord.rest import Rest
from channels.inflight import InFlight
from channels.logline import short as _short

if TYPE_CHECKING:
    from bot.contracts.commands import Command


@dataclass(slots=True)
class PendingInteraction:
    """A deferred interaction waiting for the reply that answers it."""

    interaction: discord.Interaction[discord.Client]
    target: str
    chat_type: ChatType
    timer: asyncio.Task[None] | None = None


class Interactions:
    """Application commands: synced at start, deferred when used, answered by the reply."""

    def __init__(self, intake: Intake, rest: Rest, inflight: InFlight, *,
                 timeout: float) -> None:
        """A deferred interaction nobody answered is withdrawn after ``timeout`` seconds."""
        self.intake = intake
        self.rest = rest
        self.inflight = inflight
        self.timeout = timeout
        self._seen = RecentIds(RECENT_IDS)
        self._pending: dict[str, PendingInteraction] = {}

    async def interaction(self, interaction: discord.Interaction[discord.Client]) -> None:
        """Defer one use of a command and hand it to the core (unless intake is closed)."""
        handler = self.intake.handler
        if not self.intake.open or handler is None:
            return
        if interaction.type is not discord.InteractionType.application_command:
            return
        try:
            name, args = _command_of(interaction.data)
            snowflake(interaction.id)
            snowflake(interaction.user.id)
            in_guild = interaction.guild_id is not None
            chat_id, chat_type, thread_id = place_of(interaction.channel, in_guild,
                                                   interaction.channel_id)
        except Exception as exc:
            log.warning("discord: skipped a malformed interaction %s (%s)",
                        _short(interaction.id, 40), problem(exc))
            return
        if not self._seen.add(interaction.id):
            return
        key = str(interaction.id)
        try:
            # Discord wants an answer within 3 s; the command may take longer.
            await interaction.response.defer()
        except discord.HTTPException as exc:
            # Discord's answer says all there is to say (an expired or unknown
            # interaction): one line, no traceback.
            log.warning("discord: could not defer interaction /%s (%s); replying in the "
                        "channel", name, _short(exc, 200))
        except Exception as exc:
            # discord.py reads more of the payload to answer it; if that fails,
            # nothing can be answered either.
            log.warning("discord: skipped a malformed interaction %s (%s)", key, problem(exc))
            return
        else:
            # The timer starts before the entry exists; it sleeps before it looks.
            timer = self.inflight.spawn(self._expire(key))
            self._pending[key] = PendingInteraction(interaction, thread_id or chat_id,
                                                    chat_type, timer)
        user = interaction.user
        await handler(InboundMessage(
            channel=CHANNEL_NAME, chat_id=chat_id, chat_type=chat_type, sender_id=str(user.id),
            sender_name=str(user.display_name), text=f"/{name} {args}".strip(), message_id=key,
            thread_id=thread_id, mentioned=True, raw=interaction,
            group_id=str(interaction.guild_id) if in_guild else None,
            # Interaction ids are snowflakes too, never equal to a message id.
            event_id=key))

    async def _expire(self, key: str) -> None:
        """Withdraw a deferred answer the core never replied to (the command said nothing)."""
        await asyncio.sleep(self.timeout)
        pending = self._pending.pop(key, None)
        if pending is not None:
            with contextlib.suppress(discord.HTTPException):
                await pending.interaction.delete_original_response()

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """Replace the global application commands with ``commands`` (aliases included)."""
        client = self.rest.client
        if client is None or client.application_id is None:
            raise RuntimeError("start() the Discord channel before registering commands")
        payload = _command_payload(commands)
        app_id = client.application_id
        await self.rest.deliver(
            lambda: client.http.bulk_upsert_global_commands(app_id, cast(Any, payload)),
            what="syncing discord application commands")
        log.info("discord: %d application commands synced", len(payload))

    def claim(self, message: OutboundMessage) -> PendingInteraction | None:
        """The deferred interaction ``message`` answers, if any.

        In groups replies name the message they answer (the interaction id).
        Direct replies do not, so a reply goes to the oldest open interaction of
        that DM; only command replies can race for it, and commands of one
        chat run in order.
        """
        if not self._pending:
            return None
        if message.reply_to is not None and message.reply_to in self._pending:
            return self._pop(message.reply_to)
        if message.chat_type == "direct" and message.kind == "reply":
            target = message.thread_id or message.chat_id
            for key, pending in self._pending.items():
                if pending.chat_type == "direct" and pending.target == target:
                    return self._pop(key)
        return None

    def _pop(self, key: str) -> PendingInteraction:
        pending = self._pending.pop(key)
        if pending.timer is not None:
            pending.timer.cancel()
        return pending

    async def answer(self, pending: PendingInteraction, pieces: list[str]) -> bool:
        """Answer a deferred interaction; ``False`` if the token no longer works."""
        interaction = pending.interaction
        try:
            if not pieces:
                await self.rest.deliver(interaction.delete_original_response,
                                    what="withdrawing a discord interaction response")
                return True
            first = pieces[0]
            await self.rest.deliver(
                lambda: interaction.edit_original_response(content=first,
                                                           allowed_mentions=NO_PINGS),
                what="answering a discord interaction")
            for piece in pieces[1:]:
                await self.rest.deliver(_followup(interaction, piece),
                                    what="following up a discord interaction")
        except (discord.NotFound, discord.Forbidden):
            log.warning("discord: interaction %s expired; replying in the channel",
                        interaction.id)
            return False
        return True


def _command_of(data: object) -> tuple[str, str]:
    """``(name, args)`` of an application command interaction's ``data``.

    discord.py keeps ``data`` as the payload had it, so every type is checked.
    """
    if not isinstance(data, dict):
        raise Malformed("it has no data object")
    name = data.get("name")
    if not isinstance(name, str) or not COMMAND_NAME.match(name):
        raise Malformed("it names no command")
    options = data.get("options", [])
    if not isinstance(options, list):
        raise Malformed("its options are not a list")
    args = []
    for option in options:
        if not isinstance(option, dict):
            raise Malformed("an option is not an object")
        value = option.get("value", "")
        if option.get("name") == "args":
            if not isinstance(value, str | int | float | bool):
                raise Malformed("its args are not text")
            args.append(str(value))
    return name, " ".join(args)


def _followup(interaction: discord.Interaction[discord.Client],
              text: str) -> Callable[[], Awaitable[object]]:
    async def call() -> object:
        return await interaction.followup.send(text, allowed_mentions=NO_PINGS, wait=True)
    return call


def _command_payload(commands: Sequence[Command]) -> list[dict[str, Any]]:
    """Application commands for ``commands``: names Discord accepts, with an ``args`` option."""
    payload: list[dict[str, Any]] = []
    seen: set[str] = set()
    for command in commands:
        for name in (command.name, *command.aliases):
            name = name.lower()
            if name in seen:
                continue
            if not COMMAND_NAME.match(name):
                log.warning("discord: /%s is not a valid application command name; "
                            "it still works typed as a message", name)
                continue
            seen.add(name)
            payload.append({
                "name": name, "type": 1,
                "description": (command.description or name)[:100],
                "options": [{"type": 3, "name": "args", "required": False,
                             "description": (command.usage or "arguments")[:100]}],
            })
    if len(payload) > MAX_COMMANDS:
        log.warning("discord: only the first %d of %d commands are registered",
                    MAX_COMMANDS, len(payload))
    return payload[:MAX_COMMANDS]
