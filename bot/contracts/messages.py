"""The normalized message types every channel translates to and from.

Channel adapters turn platform events into :class:`InboundMessage` and turn
:class:`OutboundMessage` back into platform calls; the core sees nothing else.
:func:`parse_command` tells a slash command in a message's text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.contracts.files import OpenFile

ChatType = Literal["direct", "group"]


AttachmentKind = Literal["photo", "document", "voice", "audio", "video", "sticker", "file"]
"""What a channel says an attachment is (a static sticker arrives as ``photo``)."""


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file or media item that came with an inbound message.

    It is stored in the durable inbox as JSON, so it holds no bytes: ``url`` is the
    platform's reference the channel needs to download the file later
    (:meth:`bot.contracts.channel.Channel.download`): Telegram's ``file_id``,
    Discord's CDN url, Slack's ``url_private_download``. ``mime_type`` and ``size``
    are what the platform declared; the core trusts neither (it sniffs the bytes
    and enforces its own caps).
    """

    kind: str
    """One of :data:`AttachmentKind`'s values; anything else is handled as ``file``."""
    name: str = ""
    """The original file name, else a generated one (``photo-<message id>.jpg``)."""
    url: str = ""
    mime_type: str = ""
    size: int = 0
    """Declared size in bytes; 0 when unknown."""
    width: int = 0
    height: int = 0
    duration: float = 0.0
    """Seconds, for voice, audio and video; 0 when unknown."""

    def __post_init__(self) -> None:
        _clean_fields(self, ("kind", "name", "url", "mime_type"))


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """One message from any channel, in the shape the core understands."""

    channel: str
    chat_id: str
    chat_type: ChatType
    sender_id: str
    text: str
    sender_name: str = ""
    message_id: str = ""
    reply_to: str | None = None
    thread_id: str | None = None
    mentioned: bool = False
    attachments: tuple[Attachment, ...] = ()
    raw: Any = field(default=None, compare=False, repr=False)
    group_id: str | None = None
    """The community the chat belongs to: a Discord server (guild) id or a Slack
    workspace (team) id; ``None`` where there is none (Telegram, DMs on Discord)."""
    event_id: str = ""
    """The platform's own id of the delivery that carried this message (Telegram
    ``update_id``, Slack ``event_id``/message ``ts``, Discord message id). The
    inbox is unique on ``(channel, event_id)``, so a redelivery is never run
    twice; ``""`` means the channel cannot redeliver (console, tests) and every
    message is new."""
    conversation: str | None = None
    """A conversation of its own within a direct chat (an email thread): direct
    messages with one form a session apart from the sender's others."""

    def __post_init__(self) -> None:
        # Lone UTF-16 surrogates (valid JSON: "\ud83d") cannot be encoded; nothing
        # past the channel boundary may ever see one, in any field.
        _clean_fields(self, _INBOUND_TEXT)

    @property
    def display_name(self) -> str:
        """The sender's display name, falling back to their id."""
        return self.sender_name or self.sender_id

    def attachment_note(self) -> str:
        """One line telling the model what came with the message that is not a file.

        Locations, contacts, polls and the like carry no ``url`` (nothing to
        download); files are fetched and described by the core's media intake.
        """
        items = [a for a in self.attachments if not a.url]
        if not items:
            return ""
        parts = []
        for a in items:
            detail = ", ".join(x for x in (a.name, a.mime_type,
                                           f"{a.size // 1024} KB" if a.size else "") if x)
            parts.append(f"{a.kind} ({detail})" if detail else a.kind)
        return f"[The user sent: {'; '.join(parts)}]"


_INBOUND_TEXT = ("channel", "chat_id", "sender_id", "text", "sender_name", "message_id",
                 "reply_to", "thread_id", "group_id", "conversation", "event_id")


def _clean_fields(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, str) and not value.isascii():
            clean = clean_text(value)
            if clean is not value:
                object.__setattr__(obj, name, clean)


def clean_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (pairs become their character)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


@dataclass(frozen=True, slots=True)
class OutboundFile:
    """A file a reply carries to the chat (``send_file``, a rendered chart).

    ``path`` is absolute and already confined to the workspace by whoever built
    it. ``source``, when given, is that file opened once: the channel uploads
    from it and never opens ``path`` (whoever built it closes it after the
    send). Without one the channel opens ``path`` once, a link there refused.
    """

    path: str
    name: str
    """The file name shown in the chat (the path's base name, usually)."""
    mime_type: str
    size: int
    caption: str = ""
    source: OpenFile | None = field(default=None, compare=False, repr=False)
    """The open file to upload from; never stored (a descriptor lives in one process)."""

    def opened(self) -> OpenFile:
        """A file to read the upload from, to be closed after: :attr:`source` borrowed,
        else :attr:`path` opened once (its last component not followed)."""
        return self.source.borrowed() if self.source is not None else OpenFile.open(self.path)


ButtonStyle = Literal["primary", "secondary", "success", "danger"]
"""How a button looks where the platform has styles (Discord, Slack); others ignore it."""
MAX_BUTTON_DATA = 64
"""Bytes (UTF-8) a button's ``data`` may have: Telegram's ``callback_data`` limit, the
smallest of the platforms'."""
MAX_BUTTON_LABEL = 75
"""Characters a button's label may have (Slack's limit; Discord allows 80)."""


@dataclass(frozen=True, slots=True)
class Button:
    """A native button under a message; pressing it sends ``data`` back as a
    :class:`ButtonPress`. ``data`` is 1–64 bytes and ``label`` 1–75 characters,
    else :class:`ValueError` (a longer ``data`` would be refused by Telegram)."""

    label: str
    data: str
    style: ButtonStyle = "secondary"

    def __post_init__(self) -> None:
        _clean_fields(self, ("label", "data"))
        if not 1 <= len(self.data.encode("utf-8")) <= MAX_BUTTON_DATA:
            raise ValueError(f"a button's data must be 1 to {MAX_BUTTON_DATA} bytes, "
                             f"not {len(self.data.encode('utf-8'))}")
        if not self.label.strip() or len(self.label) > MAX_BUTTON_LABEL:
            raise ValueError(f"a button's label must be 1 to {MAX_BUTTON_LABEL} characters")
        if self.style not in ("primary", "secondary", "success", "danger"):
            raise ValueError(f"unknown button style {self.style!r}")


ButtonRows = tuple[tuple[Button, ...], ...]
"""Buttons in rows, top to bottom (each row left to right)."""


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A reply the core asks a channel to deliver."""

    channel: str
    chat_id: str
    text: str
    chat_type: ChatType = "direct"
    reply_to: str | None = None
    thread_id: str | None = None
    kind: Literal["reply", "notice", "error"] = "reply"
    replace: str | None = None
    """A platform message id (a streaming draft) this reply replaces: the adapter
    edits it into the reply's first piece, or, if that edit fails for good,
    sends the reply anew and deletes the draft, so no draft is left frozen."""
    redelivery: bool = False
    """An earlier attempt at this reply failed or was cut off by a restart, and may have
    reached the platform: an adapter that can check (by ``delivery_id``) should."""
    delivery_id: str | None = None
    """A stable key of this reply across attempts and restarts (``roost-<outbox id>``).
    Adapters whose platform supports it use it to make the post idempotent
    (Discord's enforced nonce, Slack message metadata)."""
    attempt_note: str | None = None
    """On a redelivery, what the adapter noted right before an earlier attempt's first
    platform call (:func:`bot.contracts.channel.marked_send`), to find out whether it
    was shown (Telegram: the chat's highest message id then)."""
    files: tuple[OutboundFile, ...] = ()
    """Files to upload with the reply (after or with its text). A file over the
    platform's limit makes :meth:`bot.contracts.channel.Channel.send` raise
    :class:`bot.contracts.media.MediaTooLarge`."""
    buttons: ButtonRows = ()
    """Native buttons under the reply's last text piece (rows of :class:`Button`);
    a channel without buttons (:attr:`Capabilities.buttons` false) ignores them."""

    @classmethod
    def reply_to_message(
        cls, msg: InboundMessage, text: str, kind: Literal["reply", "notice", "error"] = "reply"
    ) -> OutboundMessage:
        """Address a reply to the chat (and thread) ``msg`` came from.

        In groups the reply threads to the triggering message, which is what
        people in a busy group expect; in direct chats it does not.
        """
        return cls(
            channel=msg.channel,
            chat_id=msg.chat_id,
            text=text,
            chat_type=msg.chat_type,
            reply_to=msg.message_id if msg.chat_type == "group" and msg.message_id else None,
            thread_id=msg.thread_id,
            kind=kind,
        )


def now() -> float:
    """The time an event is received (seconds since the epoch)."""
    return time.time()


@dataclass(frozen=True, slots=True)
class ButtonPress:
    """Someone pressed a :class:`Button` under a message the bot sent.

    ``press_id`` (Telegram's callback query id, Discord's interaction id, Slack's
    ``trigger_id``) and ``token`` (Discord's interaction token, Slack's
    ``response_url``) are what :meth:`bot.contracts.channel.Channel.answer_press`
    needs; a press must be answered soon (Telegram: ~15 s; Discord and Slack
    acknowledge it on receipt, so the answer is a follow-up).
    """

    channel: str
    chat_id: str
    message_id: str
    """The platform id of the message the button is under."""
    data: str
    user_id: str
    press_id: str
    token: str = field(default="", repr=False)
    user_name: str = ""
    chat_type: ChatType = "direct"
    thread_id: str | None = None
    group_id: str | None = None
    received_at: float = field(default_factory=now)
    raw: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _clean_fields(self, ("channel", "chat_id", "message_id", "data", "user_id", "press_id",
                             "user_name", "thread_id", "group_id"))


@dataclass(frozen=True, slots=True)
class MessageEdit:
    """Someone edited a message they had sent: ``message`` is its new version with its
    original ``message_id`` (so the core finds what it recorded) and a fresh
    ``event_id`` (the edit's own delivery)."""

    message: InboundMessage
    edited_at: float = field(default_factory=now)
    """When the platform says it was edited (seconds since the epoch)."""

    @property
    def channel(self) -> str:
        """The channel the message came from."""
        return self.message.channel


@dataclass(frozen=True, slots=True)
class MessageDeletion:
    """Messages deleted in a chat (Discord and Slack report it; Telegram does not)."""

    channel: str
    chat_id: str
    message_ids: tuple[str, ...]
    thread_id: str | None = None
    event_id: str = ""
    received_at: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class ReactionEvent:
    """Someone added (``added``) or removed a reaction on a message in a chat.

    ``emoji`` is the Unicode emoji, or ``name:id`` for a Discord custom emoji and
    ``:name:`` for a Slack one."""

    channel: str
    chat_id: str
    message_id: str
    user_id: str
    emoji: str
    added: bool
    user_name: str = ""
    event_id: str = ""
    received_at: float = field(default_factory=now)

    def __post_init__(self) -> None:
        _clean_fields(self, ("channel", "chat_id", "message_id", "user_id", "emoji",
                             "user_name", "event_id"))


InboundEvent = InboundMessage | ButtonPress | MessageEdit | MessageDeletion | ReactionEvent
"""Everything a channel hands the core: a message, or an interaction with one."""


@dataclass(frozen=True, slots=True)
class ReplyReaction:
    """A person's reaction (``event``) on one of Roost's replies: the reply of run
    ``run_id`` in conversation ``session_key``."""

    event: ReactionEvent
    run_id: str
    session_key: str


def parse_command(text: str, bot_username: str = "") -> tuple[str, str] | None:
    """Split ``/name[@bot] args`` into ``(name, args)``; ``None`` if not a command.

    A ``@botname`` suffix addressed to another bot means the command is not
    ours, which matters in groups with several bots.
    """
    stripped = text.strip()
    if not stripped.startswith("/") or stripped[1:2].isspace():
        return None
    parts = stripped[1:].split(maxsplit=1)
    if not parts:
        return None
    name, _, target = parts[0].partition("@")
    if target and bot_username and target.lower() != bot_username.lower():
        return None
    name = name.lower()
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        return None
    return name, parts[1].strip() if len(parts) > 1 else ""
