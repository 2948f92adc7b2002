"""Constants, small helpers and the two bits of state the parts of the Discord adapter share.

Ids checked, places named, text defused, nonces derived; :class:`Intake` (the
core's handler and whether it takes messages) and :class:`RecentIds`.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Hashable

import discord

from bot.contracts.channel import InboundHandler
from bot.contracts.messages import ChatType, OutboundMessage
from channels.logline import short as _short

log = logging.getLogger("roost.channels.discord")

CHANNEL_NAME = "discord"
"""The channel's name in the core's messages."""
MESSAGE_LIMIT = 2000
"""Discord's limit on a message's content, in characters."""
TYPING_REFRESH = 8.0
"""A typing indicator lasts 10 s; refresh it before it lapses."""
RECENT_IDS = 2048
"""How many message ids are remembered to drop redeliveries and spot replies to the bot."""
MAX_COMMANDS = 100
"""Discord's limit on global chat-input commands."""
INTERACTION_TIMEOUT = 600.0
"""A deferred interaction nobody answered is withdrawn after this (tokens last 15 min)."""
CATCHUP_LIMIT = 100
"""Messages read back per chat when catching up (the ``discord_catchup_limit`` default)."""
NONCE_LIMIT = 25
"""Discord refuses a message nonce longer than this."""
SNOWFLAKE_LIMIT = 1 << 64
"""Discord ids are unsigned 64-bit integers; anything else is no Discord id."""

COMMAND_NAME = re.compile(r"^[-_a-z0-9]{1,32}$")
_MASS_MENTION = re.compile(r"@(everyone|here)\b")
ADDRESSED_TYPES = (discord.MessageType.default, discord.MessageType.reply)
NO_PINGS = discord.AllowedMentions(everyone=False, users=False, roles=False,
                                   replied_user=True)
"""The model's text pings nobody; a reply still notifies the person it answers."""


class Malformed(ValueError):
    """A gateway payload missing what the adapter needs, or holding the wrong types."""


class Intake:
    """The core's handler once the channel started, and whether messages may reach it now.

    Closed for good by :meth:`close` (shutdown): what arrives after that is left
    for the catch-up after the restart.
    """

    def __init__(self) -> None:
        self.handler: InboundHandler | None = None
        self.open = True

    def start(self, handler: InboundHandler) -> None:
        """Hand messages to ``handler`` from now on."""
        self.handler = handler

    def close(self) -> None:
        """Hand the core no more messages."""
        self.open = False


class RecentIds:
    """The last ``size`` keys seen, for dropping redeliveries in bounded memory."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def add(self, key: Hashable) -> bool:
        """Remember ``key``; ``False`` if it was already there."""
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self.size:
            self._keys.popitem(last=False)
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._keys


def piece_nonce(delivery_id: str, piece: int) -> str:
    """The nonce of one piece of reply ``delivery_id``: stable, at most 25 characters.

    ``roost-<outbox id>`` fits as it is (``.n`` marks the later pieces);
    a longer key is hashed down to Discord's limit.
    """
    plain = delivery_id if piece == 0 else f"{delivery_id}.{piece}"
    if len(plain) <= NONCE_LIMIT:
        return plain
    return hashlib.sha256(plain.encode("utf-8", "surrogatepass")).hexdigest()[:NONCE_LIMIT]


def place_of(channel: object, in_guild: bool,
           channel_id: int | None = None) -> tuple[str, ChatType, str | None]:
    """``(chat_id, chat_type, thread_id)`` for a channel: threads keep their parent.

    Raises :class:`Malformed` when an id is no Discord id.
    """
    ident = snowflake(getattr(channel, "id", channel_id))
    if not in_guild:
        return str(ident), "direct", None
    if isinstance(channel, discord.Thread):
        return str(snowflake(channel.parent_id)), "group", str(ident)
    return str(ident), "group", None


def snowflake(value: object) -> int:
    """``value`` if it is a Discord id (an unsigned 64-bit integer); ``ValueError`` if not."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < SNOWFLAKE_LIMIT:
        return value
    raise Malformed(f"{_short(value, 40)} is not a Discord id")


def problem(exc: BaseException) -> str:
    """What was wrong with a payload, in a few words for a warning line."""
    return str(exc) if isinstance(exc, Malformed) else f"{type(exc).__name__}: {_short(exc)}"


def strip_mentions(text: str, bot_id: int, role_id: int | None) -> str:
    """``text`` without the mentions of the bot (and of its managed role)."""
    pattern = rf"<@!?{bot_id}>" + (rf"|<@&{role_id}>" if role_id is not None else "")
    return re.sub(rf"[ \t]*(?:{pattern})[ \t]*", " ", text).strip()


def defuse_mentions(text: str) -> str:
    """``text`` with ``@everyone`` and ``@here`` shown but no longer mentions."""
    # A zero-width space after "@" shows the word but is no mention; the
    # allowed-mentions setting blocks the ping as well, this keeps it readable.
    return _MASS_MENTION.sub("@\u200b\\1", text)


def fit(text: str) -> str:
    """``text`` cut to one message (an ellipsis marks the cut)."""
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def reply_target(message: OutboundMessage) -> int:
    """The channel a reply is posted in: the thread if there is one."""
    return int(message.thread_id or message.chat_id)


def reply_reference(message: OutboundMessage, target: int) -> discord.MessageReference | None:
    """The reference a group reply carries to the message it answers (``None`` in DMs)."""
    if message.chat_type != "group" or not message.reply_to or not message.reply_to.isdigit():
        return None
    # fail_if_not_exists=False: if the message was deleted meanwhile, the
    # reply is still posted, just without the reference.
    return discord.MessageReference(message_id=int(message.reply_to), channel_id=target,
                                    fail_if_not_exists=False)
