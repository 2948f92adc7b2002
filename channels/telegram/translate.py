"""A Telegram ``Message`` as the core's :class:`InboundMessage`: who spoke, whether
the bot was addressed, the text without the bot's @mention, what came with it."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiogram.types import Message, MessageOriginChannel, User

from bot.contracts.messages import ChatType, InboundMessage
from channels.telegram.describe import attachments as described
from channels.telegram.describe import chat_name, short, utf16, without
from channels.telegram.media import MB

if TYPE_CHECKING:
    from bot.config.settings import Settings

log = logging.getLogger("roost.channels.telegram")

CHANNEL_NAME = "telegram"
SERVICE_USER = 777000
"""The account "Telegram": the ``from`` of automatic forwards and service notices."""
UNHANDLED_KINDS = 256
"""Kinds of unhandled updates remembered, so each is logged once (bounded: the names
of unknown kinds come from the server)."""
_COMMAND = re.compile(r"^/([A-Za-z0-9_]{1,64})(?:@([A-Za-z0-9_]{1,64}))?(?=\s|$)")


class Unhandled:
    """Notes updates Roost does not handle: at debug, the first of each kind only."""

    def __init__(self) -> None:
        self._kinds: set[str] = set()

    def note(self, kind: str, event_id: str | int) -> None:
        """Such updates are confirmed like any other; a stream of them (reactions,
        members joining) would otherwise fill the debug log."""
        kind = kind[:64]
        if kind in self._kinds:
            return
        if len(self._kinds) < UNHANDLED_KINDS:
            self._kinds.add(kind)
        log.debug("telegram: update %s (%s) is of a kind Roost does not handle; ignored, as "
                  "are later ones of this kind (not logged)", event_id, kind)


class Translator:
    """Turns messages into :class:`InboundMessage` (or ``None`` when not for Roost), once
    it knows the bot's own account (:meth:`identify`)."""

    def __init__(self, settings: Settings, unhandled: Unhandled) -> None:
        self.settings = settings
        self.unhandled = unhandled
        self.me: User | None = None
        """The bot's own account (``getMe``); ``None`` before the channel started."""
        self._commands: frozenset[str] = frozenset()

    def identify(self, me: User) -> None:
        """The bot is ``me``: its @mentions, replies to it and commands addressed to it."""
        self.me = me

    def know_commands(self, names: Iterable[str]) -> None:
        """The core's command names (``/start`` becomes ``/help`` unless one is it)."""
        self._commands = frozenset(names)

    def translate(self, message: Message, *, event_id: str = "") -> InboundMessage | None:
        """The core's view of ``message``, or ``None`` if it is not for Roost.

        ``event_id`` is the ``update_id`` that carried it (the inbox dedupes on it).

        Not for Roost: messages from bots (itself included), channel posts,
        commands addressed to another bot (``/help@other_bot``), service
        messages (members joining, pins...) and automatic forwards when
        ``telegram_automatic_forwards`` is ``"ignore"``. A message sent on
        behalf of a chat (a linked channel's automatic forward, an anonymous
        admin, a user posting as their channel) comes from that chat: the
        ``from`` of such messages is a placeholder account (Telegram, 777000;
        GroupAnonymousBot; Channel_Bot) that says nothing about who spoke.
        """
        chat_type: ChatType
        if message.chat.type == "private":
            chat_type = "direct"
        elif message.chat.type in ("group", "supergroup"):
            chat_type = "group"
        else:
            return None
        if self.me is None:
            return None
        speaker = self._speaker(message, event_id)
        if speaker is None:
            return None
        sender_id, sender_name = speaker
        attachments = described(message, int(self.settings.media_max_file_mb * MB))
        if message.text is not None:
            text, entities = message.text, message.entities or []
        else:
            text, entities = message.caption or "", message.caption_entities or []
        if not text and not attachments:
            kind = message.content_type
            self.unhandled.note(f"{getattr(kind, 'value', kind)} message", event_id)
            return None
        me = self.me
        handle = f"@{me.username}".lower() if me.username else None
        mentioned = False
        drop: list[tuple[int, int]] = []
        units: bytes | None = None
        for entity in entities:
            if entity.type == "mention" and handle is not None \
                    and entity.length == len(handle) and entity.offset >= 0:
                # Offsets count UTF-16 units; the handle is ASCII, one unit a character.
                if units is None:
                    units = utf16(text)
                start = entity.offset * 2
                found = units[start:start + entity.length * 2]
                if found.decode("utf-16-le", "surrogatepass").lower() == handle:
                    mentioned = True
                    drop.append((entity.offset, entity.length))
            elif entity.type == "text_mention" and entity.user is not None \
                    and entity.user.id == me.id:
                mentioned = True
        if drop:
            text = without(text, drop)
        command = _COMMAND.match(text.lstrip())
        if command is not None:
            target = command.group(2)
            if target is not None:
                if me.username is None or target.lower() != me.username.lower():
                    return None
                # The core parses "/cmd args": drop our own @suffix.
                stripped = text.lstrip()
                text = f"/{command.group(1)}{stripped[command.end():]}"
            # Telegram's Start button sends /start (with a deep-link payload at
            # most); without a command of that name the core would answer
            # "I don't know /start", so it is shown the help instead.
            if command.group(1).lower() == "start" and "start" not in self._commands:
                text = "/help"
            mentioned = True
        replied = message.reply_to_message
        # In a forum topic every message "replies" to the topic's creation
        # message; that is not a reply to anyone.
        if replied is not None and replied.forum_topic_created is not None:
            replied = None
        if replied is not None and replied.from_user is not None \
                and replied.from_user.id == me.id:
            mentioned = True
        thread = message.message_thread_id if message.is_topic_message else None
        return InboundMessage(
            channel=CHANNEL_NAME,
            chat_id=str(message.chat.id),
            chat_type=chat_type,
            sender_id=sender_id,
            sender_name=sender_name,
            text=text,
            message_id=str(message.message_id),
            reply_to=str(replied.message_id) if replied is not None else None,
            thread_id=str(thread) if thread is not None else None,
            mentioned=mentioned,
            attachments=attachments,
            raw=message,
            event_id=event_id,
        )

    def _speaker(self, message: Message, event_id: str) -> tuple[str, str] | None:
        """``(sender_id, sender_name)`` of ``message``, or ``None`` if Roost ignores its sender."""
        if message.is_automatic_forward:
            if self.settings.telegram_automatic_forwards == "ignore":
                log.debug("telegram: update %s is a channel post forwarded automatically "
                          "into %s; ignored (telegram_automatic_forwards)", event_id,
                          message.chat.id)
                return None
            origin = message.sender_chat
            if origin is None and isinstance(message.forward_origin, MessageOriginChannel):
                origin = message.forward_origin.chat
            if origin is None:
                # Without the channel only the placeholder account is left.
                log.debug("telegram: update %s is an automatic forward without its channel; "
                          "ignored", event_id)
                return None
            return str(origin.id), short(chat_name(origin))
        if message.sender_chat is not None:
            return str(message.sender_chat.id), short(chat_name(message.sender_chat))
        sender = message.from_user
        if sender is None or sender.is_bot or sender.id == SERVICE_USER:
            return None
        # Short: the name goes into every prompt line of the sender's, and Telegram's
        # own limits (64 characters a name, 128 a title) do not bind a forged update.
        return str(sender.id), short(sender.full_name)
