"""A Telegram ``Message`` as the core's :class:`InboundMessage`: who spoke, whether
the bot was addressed, the text without the bot's @mention, what came with it.

What comes with a message besides text (photos, files, voice, a location, a
contact, a poll...) becomes described attachments: files through
:func:`~channels.telegram.media.file_attachments` (nothing is downloaded), the rest
described here. A message that carries none of them (:data:`CARRIERS`) is not
looked at for attachments at all.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiogram.types import Chat, Message, MessageOriginChannel, User

from bot.contracts.messages import Attachment, ChatType, InboundMessage, clean_text
from channels.telegram.media import FILE_FIELDS, MB, file_attachments

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
DESCRIBED = ("venue", "location", "contact", "poll", "dice", "game", "story", "invoice",
             "checklist", "giveaway", "paid_media", "live_photo")
"""The fields of a message :func:`attachments_of` describes besides its files."""
CARRIERS = FILE_FIELDS + DESCRIBED
"""Every field of a message that can make an attachment: a message with none of them set
has none."""
CARRIED = operator.attrgetter(*CARRIERS)
"""A message's :data:`CARRIERS`, read at once."""


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
        attachments = attachments_of(message, int(self.settings.media_max_file_mb * MB)) \
            if CARRIED(message).count(None) < len(CARRIERS) else ()
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


def utf16(text: str) -> bytes:
    """``text`` in UTF-16-LE, the unit of Telegram's entity offsets.

    Lone surrogates (valid in JSON: ``"\\ud83d"``) are kept as the code units
    they are, so every offset after them still points where Telegram meant;
    the core replaces them once the text is in its own hands.
    """
    return text.encode("utf-16-le", "surrogatepass")


def without(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` minus the entity spans (UTF-16 offsets), tidied where a span was cut."""
    data = utf16(text)
    pieces: list[bytes] = []
    at = 0
    # One pass, not one copy of the text per span: a hostile message may carry
    # thousands of mentions in a megabyte of text.
    for offset, length in sorted(spans):
        start, end = offset * 2, (offset + length) * 2
        if start > at:
            pieces.append(data[at:start])
        at = max(at, end)
    pieces.append(data[at:])
    result = b"".join(pieces).decode("utf-16-le", "surrogatepass")
    if any(offset == 0 for offset, _ in spans):
        # "@bot, do this" → "do this"
        result = re.sub(r"^[\s,:;]+", "", result)
    return re.sub(r"[ \t]{2,}", " ", result).strip()


def chat_name(chat: Chat) -> str:
    """What a chat speaking as a sender is called: its title, else its name."""
    names = " ".join(n for n in (chat.first_name, chat.last_name) if n)
    return chat.title or names or (f"@{chat.username}" if chat.username else "")


DESCRIPTION = 300
"""Characters kept of each piece of an attachment's description (a poll's question,
a venue's address...): enough for the model, and a hostile megabyte stays out."""


def short(value: object) -> str:
    """``value`` as text for a description: clean, on one line, at most DESCRIPTION long."""
    text = clean_text(str(value)).replace("\x00", "")
    text = " ".join(text.split())
    return text if len(text) <= DESCRIPTION else f"{text[:DESCRIPTION - 1]}…"


def attachments_of(message: Message, cap: int) -> tuple[Attachment, ...]:
    """What came with ``message`` besides its text, for the core.

    Files (photos, documents, voice...) become attachments the core can
    download (:func:`~channels.telegram.media.file_attachments`; ``cap`` is the
    largest file the core accepts, which picks the photo size). Everything
    else (a location, a contact, a poll...) is described in the attachment's
    name and has no ``url``: there is nothing to download.
    """
    found = file_attachments(message, cap)
    if message.venue is not None:
        # A venue carries its location too: one attachment.
        venue = message.venue
        found.append(Attachment("venue", name=", ".join(x for x in (
            short(venue.title), short(venue.address),
            _coordinates(venue.location.latitude, venue.location.longitude)) if x)))
    elif message.location is not None:
        where = message.location
        live = " (live)" if where.live_period else ""
        found.append(Attachment("location", name=_coordinates(where.latitude,
                                                              where.longitude) + live))
    if message.contact is not None:
        contact = message.contact
        name = " ".join(x for x in (contact.first_name, contact.last_name) if x)
        found.append(Attachment("contact", name=", ".join(
            short(x) for x in (name, contact.phone_number) if x)))
    if message.poll is not None:
        poll = message.poll
        options = " / ".join(short(o.text) for o in poll.options[:12])
        found.append(Attachment("quiz" if poll.type == "quiz" else "poll",
                                name=f"{short(poll.question)}: {options}"))
    if message.dice is not None:
        found.append(Attachment("dice", name=f"{short(message.dice.emoji)} "
                                             f"showing {message.dice.value}"))
    for kind, value, detail in (
            ("game", message.game, lambda g: g.title),
            ("story", message.story, lambda s: chat_name(s.chat)),
            ("invoice", message.invoice, lambda i: f"{i.title}, {i.total_amount} {i.currency}"),
            ("checklist", message.checklist, lambda c: c.title),
            ("giveaway", message.giveaway, lambda g: f"{g.winner_count} winners"),
            ("paid media", message.paid_media, lambda p: f"{len(p.paid_media)} items"),
            ("live photo", message.live_photo, lambda _: ""),
    ):
        if value is not None:
            found.append(Attachment(kind, name=short(detail(value))))
    return tuple(found)


def _coordinates(latitude: float, longitude: float) -> str:
    return f"{latitude:.6g},{longitude:.6g}"
