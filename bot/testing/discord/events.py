"""Pushing users' messages and interactions, as Discord dispatches them."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from bot.testing.discord.gateway import Gateway
from bot.testing.discord.state import State
from bot.testing.discord.wire import (
    APP_ID,
    BOT_ID,
    BOT_ROLE_ID,
    CHANNEL_ID,
    DM_CHANNEL_ID,
    GUILD_ID,
    OTHER_BOT_ID,
    THREAD_ID,
    TIMESTAMP,
    USER_ID,
    FakeMessage,
    Interaction,
    bot_message_payload,
    message_object,
    text_channel,
    thread_channel,
    user_payload,
)

EDITED = "2024-01-01T00:05:{:02d}.000000+00:00"
"""When the users' edits are made: each a second after the one before, as Discord gives
every edit a timestamp of its own."""


class Events:
    """MESSAGE_CREATE and INTERACTION_CREATE from users, recorded in ``state`` and
    dispatched through ``gateway``."""

    def __init__(self, state: State, gateway: Gateway) -> None:
        self._state = state
        self._gateway = gateway
        self._edits = itertools.count()

    def message_payload(self, content: str, *, channel_id: int = CHANNEL_ID,
                        guild: bool = True, author: Mapping[str, Any] | None = None,
                        mentions: Sequence[Mapping[str, Any]] = (),
                        mention_roles: Sequence[int] = (),
                        referenced: FakeMessage | Mapping[str, Any] | None = None,
                        message_id: int | None = None,
                        attachments: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """A MESSAGE_CREATE payload from a user (``author``; Alice by default)."""
        guild_id = (self._state.guild_of(channel_id) or GUILD_ID) if guild else None
        data = message_object(message_id or next(self._state.ids), channel_id, content,
                              dict(author or user_payload(USER_ID, "alice")), guild_id=guild_id)
        data["attachments"] = [dict(a) for a in attachments]
        if any("waveform" in a for a in attachments):
            data["flags"] = 1 << 13  # IS_VOICE_MESSAGE
        data["mentions"] = [dict(m) for m in mentions]
        data["mention_roles"] = [str(r) for r in mention_roles]
        if referenced is not None:
            ref = (bot_message_payload(referenced) if isinstance(referenced, FakeMessage)
                   else dict(referenced))
            data["type"] = 19
            data["message_reference"] = {"message_id": ref["id"],
                                         "channel_id": ref["channel_id"],
                                         **({"guild_id": data["guild_id"]} if guild else {})}
            data["referenced_message"] = ref
        return data

    async def push_message(self, data: Mapping[str, Any]) -> int:
        """Dispatch a MESSAGE_CREATE with ``data`` (kept in the history); its message id."""
        self._state.user_messages[int(data["id"])] = dict(data)
        await self._gateway.dispatch("MESSAGE_CREATE", dict(data))
        return int(data["id"])

    def missed(self, content: str, *, channel_id: int = CHANNEL_ID, mention: bool = False,
               author: Mapping[str, Any] | None = None) -> int:
        """A message sent while the bot was not connected: in the history, never dispatched.

        ``channel_id`` :data:`DM_CHANNEL_ID` makes it a DM. Returns its id.
        """
        guild = channel_id != DM_CHANNEL_ID
        mentions = [user_payload(BOT_ID, "testbot", bot=True)] if mention else []
        data = self.message_payload(f"<@{BOT_ID}> {content}" if mention else content,
                                    channel_id=channel_id, guild=guild, author=author,
                                    mentions=mentions)
        self._state.user_messages[int(data["id"])] = data
        return int(data["id"])

    async def guild_message(self, content: str, *, mention: bool = False,
                            channel_id: int = CHANNEL_ID,
                            author: Mapping[str, Any] | None = None,
                            message_id: int | None = None,
                            attachments: Sequence[Mapping[str, Any]] = ()) -> int:
        """A message in the guild text channel; ``mention`` prefixes ``<@bot>``."""
        mentions = [user_payload(BOT_ID, "testbot", bot=True)] if mention else []
        text = f"<@{BOT_ID}> {content}" if mention else content
        return await self.push_message(self.message_payload(
            text, channel_id=channel_id, author=author, mentions=mentions,
            message_id=message_id, attachments=attachments))

    async def role_mention(self, content: str) -> int:
        """A message that mentions the bot's managed role instead of the bot."""
        return await self.push_message(self.message_payload(
            f"<@&{BOT_ROLE_ID}> {content}", mention_roles=[BOT_ROLE_ID]))

    async def reply_to_bot(self, message: FakeMessage, content: str) -> int:
        """A reply (with a message reference) to one of the bot's messages."""
        return await self.push_message(self.message_payload(
            content, channel_id=message.channel_id, referenced=message))

    async def thread_message(self, content: str, *, mention: bool = False) -> int:
        """A message in the thread of the guild text channel."""
        return await self.guild_message(content, mention=mention, channel_id=THREAD_ID)

    async def dm(self, content: str, *, author: Mapping[str, Any] | None = None,
                 message_id: int | None = None,
                 attachments: Sequence[Mapping[str, Any]] = ()) -> int:
        """A direct message to the bot (with ``attachments`` from :meth:`attachment`)."""
        return await self.push_message(self.message_payload(
            content, channel_id=DM_CHANNEL_ID, guild=False, author=author,
            message_id=message_id, attachments=attachments))

    async def bot_message(self, content: str, *, mention: bool = True) -> int:
        """A guild message from another bot (mentioning ours by default)."""
        return await self.guild_message(
            content, mention=mention, author=user_payload(OTHER_BOT_ID, "otherbot", bot=True))

    async def malformed(self) -> None:
        """A MESSAGE_CREATE the client cannot parse (no author, a non-numeric id)."""
        await self._gateway.dispatch("MESSAGE_CREATE", {"id": "not-a-snowflake",
                                                        "channel_id": str(CHANNEL_ID),
                                                        "guild_id": str(GUILD_ID), "content": "?"})

    async def interaction(self, name: str, args: str = "", *, user_id: int = USER_ID,
                          channel_id: int = CHANNEL_ID, guild: bool = True) -> int:
        """An INTERACTION_CREATE for the slash command ``/name`` with option ``args``."""
        data = self.interaction_payload(name, args, user_id=user_id, channel_id=channel_id,
                                        guild=guild)
        await self._gateway.dispatch("INTERACTION_CREATE", data)
        return int(data["id"])

    def interaction_payload(self, name: str, args: str = "", *, user_id: int = USER_ID,
                            channel_id: int = CHANNEL_ID, guild: bool = True) -> dict[str, Any]:
        """The INTERACTION_CREATE payload :meth:`interaction` sends (its callbacks work).

        For tests that change it before dispatching it themselves.
        """
        ids = self._state.ids
        interaction = Interaction(next(ids), f"itoken-{next(ids)}", channel_id)
        self._state.interactions[interaction.id] = interaction
        user = user_payload(user_id, "alice")
        data: dict[str, Any] = {
            "id": str(interaction.id), "application_id": str(APP_ID), "type": 2,
            "token": interaction.token, "version": 1, "attachment_size_limit": 8_388_608,
            "locale": "en-US", "app_permissions": "0",
            "data": {"id": "7777", "name": name, "type": 1,
                     **({"options": [{"name": "args", "type": 3, "value": args}]}
                        if args else {})},
            "channel_id": str(channel_id),
        }
        if guild:
            guild_id = self._state.guild_of(channel_id) or GUILD_ID
            data["guild_id"] = str(guild_id)
            data["guild_locale"] = "en-US"
            data["channel"] = (thread_channel() if channel_id == THREAD_ID
                               else text_channel(channel_id, guild_id))
            data["member"] = {"user": user, "roles": [], "joined_at": TIMESTAMP,
                              "deaf": False, "mute": False, "flags": 0, "permissions": "0"}
            data["context"] = 0
        else:
            data["channel"] = {"id": str(channel_id), "type": 1, "recipients": [user]}
            data["user"] = user
            data["context"] = 1
        return data

    async def press(self, message: FakeMessage, custom_id: str, *, user_id: int = USER_ID,
                    guild: bool = True) -> Interaction:
        """An INTERACTION_CREATE of type 3: a user pressed the button ``custom_id`` under
        the bot's ``message``; the interaction (its callback is due within
        ``ack_within`` seconds of now)."""
        data = self.interaction_payload("", user_id=user_id, channel_id=message.channel_id,
                                        guild=guild)
        interaction = self._state.interactions[int(data["id"])]
        interaction.message_id = message.id
        data["type"] = 3
        data["data"] = {"custom_id": custom_id, "component_type": 2}
        data["message"] = bot_message_payload(message)
        if guild:
            data["message"]["guild_id"] = data["guild_id"]
        await self._gateway.dispatch("INTERACTION_CREATE", data)
        return interaction

    async def edit_message(self, message_id: int, content: str, *, partial: bool = False,
                           mention_bot: bool = False) -> None:
        """A MESSAGE_UPDATE: the user edited their message ``message_id`` to ``content``
        (``mention_bot``: prefixed with the bot's mention). ``partial``: only the
        fields that changed, with no edit time (as for an embed unfurled)."""
        original = self._state.user_messages[message_id]
        data = {**original, "content": content,
                "edited_timestamp": EDITED.format(next(self._edits) % 60)}
        if mention_bot:
            data["content"] = f"<@{BOT_ID}> {content}"
            data["mentions"] = [user_payload(BOT_ID, "testbot", bot=True)]
        self._state.user_messages[message_id] = data
        if partial:
            data = {k: original[k] for k in ("id", "channel_id", "guild_id") if k in original}
            data["embeds"] = []
        await self._gateway.dispatch("MESSAGE_UPDATE", data)

    async def delete_message(self, message_id: int) -> None:
        """A MESSAGE_DELETE of the user's message ``message_id``."""
        original = self._state.user_messages.pop(message_id)
        data = {k: original[k] for k in ("id", "channel_id", "guild_id") if k in original}
        await self._gateway.dispatch("MESSAGE_DELETE", data)

    async def user_reaction(self, channel_id: int, message_id: int, emoji: str, *,
                            added: bool = True, user_id: int = USER_ID,
                            guild: bool = True) -> None:
        """A MESSAGE_REACTION_ADD (or ``_REMOVE``) of a user's ``emoji`` on a message."""
        data: dict[str, Any] = {"user_id": str(user_id), "channel_id": str(channel_id),
                                "message_id": str(message_id), "burst": False, "type": 0,
                                "emoji": {"id": None, "name": emoji}}
        if guild:
            data["guild_id"] = str(self._state.guild_of(channel_id) or GUILD_ID)
            if added:
                data["member"] = {"user": user_payload(user_id, "alice"), "roles": [],
                                  "joined_at": TIMESTAMP, "deaf": False, "mute": False,
                                  "flags": 0}
        await self._gateway.dispatch("MESSAGE_REACTION_ADD" if added
                                     else "MESSAGE_REACTION_REMOVE", data)

    def interaction_deferred(self, interaction_id: int) -> bool:
        """Whether the interaction was answered with a deferred (type 5) response."""
        return self._state.interactions[interaction_id].deferred
