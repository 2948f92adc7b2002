"""Matrix events into the core's events: messages, edits, reactions, redactions.

Every field is read from the raw event (``event.source``) and checked for its type: an
event is written by whoever is in the room, so a field of the wrong type makes the event
count as not for the bot (one debug line), never an exception.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from roost import Attachment, ChatType, InboundMessage
from roost.channels import InboundEvent, MessageDeletion, MessageEdit, ReactionEvent

log = logging.getLogger("roost.channels.matrix")

CHANNEL_NAME = "matrix"
REMEMBERED = 10_000
MEDIA_KINDS = {"m.image": "photo", "m.file": "document", "m.audio": "audio",
               "m.video": "video"}
SPOKEN = frozenset({"m.text", "m.notice", "m.emote", *MEDIA_KINDS})
VOICE_KEYS = ("org.matrix.msc3245.voice", "org.matrix.msc1767.voice")
PILL = re.compile(r'href="https://matrix\.to/#/([^"?]+)')


class Recent:
    """The newest ``size`` keys and a value each, oldest dropped first."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self.items: OrderedDict[str, Any] = OrderedDict()

    def put(self, key: str, value: Any = True) -> None:
        """Remember ``key`` (with ``value``)."""
        self.items[key] = value
        self.items.move_to_end(key)
        if len(self.items) > self.size:
            self.items.popitem(last=False)

    def get(self, key: str) -> Any:
        """The value of ``key``, or ``None``."""
        return self.items.get(key)

    def pop(self, key: str) -> Any:
        """Forget ``key``; its value, or ``None``."""
        return self.items.pop(key, None)


@dataclass(frozen=True, slots=True)
class Room:
    """What the translation needs of the room an event came from."""

    room_id: str
    direct: bool
    name_of: Callable[[str], str]
    """A member's display name in the room (``""`` if unknown)."""


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


def _dict(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


class Translator:
    """Turns one room's events into inbound events; remembers what it must to do so.

    ``bot_posted`` are the events the bot sent (a reply to one addresses the bot), and
    ``fetch_sender(room, event id)`` asks the server who sent an event it does not know.
    """

    def __init__(self, user_id: str, display_name: Callable[[], str],
                 bot_posted: Recent,
                 fetch_sender: Callable[[str, str], Awaitable[str | None]]) -> None:
        self.user_id = user_id
        self.display_name = display_name
        self.bot_posted = bot_posted
        self.bot_threads = Recent()
        self.fetch_sender = fetch_sender
        self.reactions = Recent()
        """Reaction event id → (room, message id, user, emoji), to report its removal."""

    async def translate(self, event: Mapping[str, Any], room: Room) -> InboundEvent | None:
        """The core's event for ``event``, or ``None`` when it is nothing for the bot."""
        kind, sender, event_id = _str(event, "type"), _str(event, "sender"), \
            _str(event, "event_id")
        if not sender or not event_id or sender == self.user_id:
            return None
        content = _dict(event, "content")
        if kind == "m.reaction":
            return self._reaction(content, room, sender, event_id)
        if kind == "m.room.redaction":
            redacts = _str(event, "redacts") or _str(content, "redacts")
            return self._redaction(redacts, room, event_id) if redacts else None
        if kind not in ("m.room.message", "m.sticker"):
            return None
        relation = _dict(content, "m.relates_to")
        if _str(relation, "rel_type") == "m.replace":
            original = _str(relation, "event_id")
            new = _dict(content, "m.new_content")
            if not original or not new:
                return None
            message = await self._message(new, room, sender, original, event_id,
                                          relation=None, kind=kind)
            return None if message is None else MessageEdit(message)
        return await self._message(content, room, sender, event_id, event_id,
                                   relation=relation, kind=kind)

    async def _message(self, content: dict[str, Any], room: Room, sender: str,
                       message_id: str, event_id: str, *, relation: dict[str, Any] | None,
                       kind: str) -> InboundMessage | None:
        msgtype = "m.sticker" if kind == "m.sticker" else _str(content, "msgtype")
        if msgtype not in SPOKEN and msgtype != "m.sticker":
            return None
        body = _str(content, "body")
        relation = relation or {}
        thread_id = _str(relation, "event_id") \
            if _str(relation, "rel_type") == "m.thread" else ""
        reply_to = _str(_dict(relation, "m.in_reply_to"), "event_id")
        if relation.get("is_falling_back") is True:
            reply_to = ""  # a thread message's fallback reply, not a reply
        attachments: tuple[Attachment, ...] = ()
        if msgtype in MEDIA_KINDS or msgtype == "m.sticker":
            attachment = self._attachment(content, msgtype, message_id)
            if attachment is None:
                return None
            attachments = (attachment,)
            name = _str(content, "filename")
            body = body if name and body != name else ""
        elif reply_to and body.startswith("> "):
            body = _without_fallback(body)
        mentioned = room.direct or await self._addressed(content, room, reply_to, thread_id)
        text = self._without_mention(body) if mentioned and not room.direct else body
        if msgtype == "m.emote":
            text = f"* {room.name_of(sender) or sender} {text}"
        chat_type: ChatType = "direct" if room.direct else "group"
        return InboundMessage(
            channel=CHANNEL_NAME, chat_id=room.room_id, chat_type=chat_type, sender_id=sender,
            text=text, sender_name=room.name_of(sender), message_id=message_id,
            reply_to=reply_to or None, thread_id=thread_id or None, mentioned=mentioned,
            attachments=attachments, event_id=event_id)

    def _attachment(self, content: dict[str, Any], msgtype: str,
                    message_id: str) -> Attachment | None:
        url = _str(content, "url")
        if not url:
            log.info("Matrix: %s without a plain url (an encrypted file?) skipped", msgtype)
            return None
        info = _dict(content, "info")
        kind = "sticker" if msgtype == "m.sticker" else MEDIA_KINDS[msgtype]
        if kind == "audio" and any(key in content for key in VOICE_KEYS):
            kind = "voice"
        name = _str(content, "filename") or _str(content, "body") or f"{kind}-{message_id}"
        size, width, height = (info.get(k) for k in ("size", "w", "h"))
        duration = info.get("duration")
        return Attachment(
            kind=kind, name=name[:255], url=url, mime_type=_str(info, "mimetype"),
            size=size if isinstance(size, int) and size > 0 else 0,
            width=width if isinstance(width, int) and width > 0 else 0,
            height=height if isinstance(height, int) and height > 0 else 0,
            duration=duration / 1000 if isinstance(duration, int) and duration > 0 else 0.0)

    async def _addressed(self, content: dict[str, Any], room: Room, reply_to: str,
                         thread_id: str) -> bool:
        """A mention (``m.mentions``, a pill, the MXID or the display name in the text),
        a reply to the bot, or a message in a thread the bot speaks in."""
        mentions = _dict(content, "m.mentions").get("user_ids")
        if isinstance(mentions, list) and self.user_id in mentions:
            return True
        html = _str(content, "formatted_body")
        if any(unquote(target) == self.user_id for target in PILL.findall(html)):
            return True
        body = _str(content, "body")
        if self.user_id.lower() in body.lower() or self._name_pattern().search(body):
            return True
        if thread_id and (self.bot_threads.get(thread_id) or self.bot_posted.get(thread_id)):
            return True
        if reply_to:
            if self.bot_posted.get(reply_to):
                return True
            return await self.fetch_sender(room.room_id, reply_to) == self.user_id
        return False

    def _name_pattern(self) -> re.Pattern[str]:
        name = self.display_name().strip()
        if not name:
            return re.compile(r"(?!x)x")
        return re.compile(rf"(?<!\w){re.escape(name)}(?!\w)", re.IGNORECASE)

    def _without_mention(self, body: str) -> str:
        """``body`` without a leading ``Name:``/``@bot:server,`` (how clients write a pill)."""
        for name in (self.user_id, self.display_name().strip()):
            if name and body.lower().startswith(name.lower()):
                rest = body[len(name):]
                if not rest or rest[0] in ":, \n":
                    return rest.lstrip(":, \n") or body
        return body

    def _reaction(self, content: dict[str, Any], room: Room, sender: str,
                  event_id: str) -> ReactionEvent | None:
        relation = _dict(content, "m.relates_to")
        target, key = _str(relation, "event_id"), _str(relation, "key")
        if _str(relation, "rel_type") != "m.annotation" or not target or not key:
            return None
        self.reactions.put(event_id, (room.room_id, target, sender, key))
        return ReactionEvent(channel=CHANNEL_NAME, chat_id=room.room_id, message_id=target,
                             user_id=sender, emoji=key[:64], added=True,
                             user_name=room.name_of(sender), event_id=event_id)

    def _redaction(self, redacts: str, room: Room, event_id: str) -> InboundEvent:
        reaction = self.reactions.pop(redacts)
        if reaction is not None:
            room_id, target, user, key = reaction
            return ReactionEvent(channel=CHANNEL_NAME, chat_id=room_id, message_id=target,
                                 user_id=user, emoji=key, added=False,
                                 user_name=room.name_of(user), event_id=event_id)
        return MessageDeletion(channel=CHANNEL_NAME, chat_id=room.room_id,
                               message_ids=(redacts,), event_id=event_id)


def _without_fallback(body: str) -> str:
    """A reply's text without the quoted ``> <@someone> ...`` fallback older clients add."""
    lines = body.split("\n")
    while lines and lines[0].startswith(">"):
        lines.pop(0)
    if lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)
