"""Slash commands: registration, deferred interactions and their answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import discord

from bot.contracts.messages import InboundMessage, OutboundMessage
from channels.discord.base import _DiscordBase
from channels.discord.common import (
    _COMMAND_NAME,
    _NO_PINGS,
    MAX_COMMANDS,
    _Malformed,
    _PendingInteraction,
    _place,
    _problem,
    _snowflake,
    log,
)
from channels.logline import short as _short

if TYPE_CHECKING:
    from bot.contracts.commands import Command


class _Interactions(_DiscordBase):
    """Application commands: synced at start, deferred when used, answered by the reply."""

    async def _on_interaction(self, interaction: discord.Interaction[discord.Client]) -> None:
        if not self._intake_open or self._handler is None:
            return
        if interaction.type is not discord.InteractionType.application_command:
            return
        try:
            name, args = _command_of(interaction.data)
            _snowflake(interaction.id)
            _snowflake(interaction.user.id)
            in_guild = interaction.guild_id is not None
            chat_id, chat_type, thread_id = _place(interaction.channel, in_guild,
                                                   interaction.channel_id)
        except Exception as exc:
            log.warning("discord: skipped a malformed interaction %s (%s)",
                        _short(interaction.id, 40), _problem(exc))
            return
        if not self._seen.add(("interaction", interaction.id)):
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
            log.warning("discord: skipped a malformed interaction %s (%s)", key, _problem(exc))
            return
        else:
            pending = _PendingInteraction(interaction, thread_id or chat_id, chat_type)
            self._interactions[key] = pending
            pending.timer = self._spawn(self._expire(key))
        user = interaction.user
        await self._handler(InboundMessage(
            channel=self.name, chat_id=chat_id, chat_type=chat_type, sender_id=str(user.id),
            sender_name=str(user.display_name), text=f"/{name} {args}".strip(), message_id=key,
            thread_id=thread_id, mentioned=True, raw=interaction,
            group_id=str(interaction.guild_id) if in_guild else None,
            # Interaction ids are snowflakes too, never equal to a message id.
            event_id=key))

    async def _expire(self, key: str) -> None:
        """Withdraw a deferred answer the core never replied to (the command said nothing)."""
        await asyncio.sleep(self.interaction_timeout)
        pending = self._interactions.pop(key, None)
        if pending is not None:
            with contextlib.suppress(discord.HTTPException):
                await pending.interaction.delete_original_response()

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """Replace the global application commands with ``commands`` (aliases included)."""
        client = self.client
        if client is None or client.application_id is None:
            raise RuntimeError("start() the Discord channel before registering commands")
        payload = _command_payload(commands)
        app_id = client.application_id
        await self._deliver(
            lambda: client.http.bulk_upsert_global_commands(app_id, cast(Any, payload)),
            what="syncing discord application commands")
        log.info("discord: %d application commands synced", len(payload))

    def _claim_interaction(self, message: OutboundMessage) -> _PendingInteraction | None:
        """The deferred interaction ``message`` answers, if any.

        In groups replies name the message they answer (the interaction id).
        Direct replies do not, so a reply goes to the oldest open interaction of
        that DM; only command replies can race for it, and commands of one
        chat run in order.
        """
        if not self._interactions:
            return None
        if message.reply_to is not None and message.reply_to in self._interactions:
            return self._pop_interaction(message.reply_to)
        if message.chat_type == "direct" and message.kind == "reply":
            target = message.thread_id or message.chat_id
            for key, pending in self._interactions.items():
                if pending.chat_type == "direct" and pending.target == target:
                    return self._pop_interaction(key)
        return None

    def _pop_interaction(self, key: str) -> _PendingInteraction:
        pending = self._interactions.pop(key)
        if pending.timer is not None:
            pending.timer.cancel()
        return pending

    async def _answer(self, pending: _PendingInteraction, pieces: list[str]) -> bool:
        """Answer a deferred interaction; ``False`` if the token no longer works."""
        interaction = pending.interaction
        try:
            if not pieces:
                await self._deliver(interaction.delete_original_response,
                                    what="withdrawing a discord interaction response")
                return True
            first = pieces[0]
            await self._deliver(
                lambda: interaction.edit_original_response(content=first,
                                                           allowed_mentions=_NO_PINGS),
                what="answering a discord interaction")
            for piece in pieces[1:]:
                await self._deliver(_followup(interaction, piece),
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
        raise _Malformed("it has no data object")
    name = data.get("name")
    if not isinstance(name, str) or not _COMMAND_NAME.match(name):
        raise _Malformed("it names no command")
    options = data.get("options", [])
    if not isinstance(options, list):
        raise _Malformed("its options are not a list")
    args = []
    for option in options:
        if not isinstance(option, dict):
            raise _Malformed("an option is not an object")
        value = option.get("value", "")
        if option.get("name") == "args":
            if not isinstance(value, str | int | float | bool):
                raise _Malformed("its args are not text")
            args.append(str(value))
    return name, " ".join(args)


def _followup(interaction: discord.Interaction[discord.Client],
              text: str) -> Callable[[], Awaitable[object]]:
    async def call() -> object:
        return await interaction.followup.send(text, allowed_mentions=_NO_PINGS, wait=True)
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
            if not _COMMAND_NAME.match(name):
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
