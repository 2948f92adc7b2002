"""What came with a message besides its text, described for the model; text helpers."""

from __future__ import annotations

import re

from aiogram.types import Chat, Message

from bot.contracts.messages import Attachment, clean_text
from channels.telegram.media import file_attachments


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


def attachments(message: Message, cap: int) -> tuple[Attachment, ...]:
    """What came with ``message`` besides its text, for the core.

    Files (photos, documents, voice...) become attachments the core can
    download (:func:`channels.telegram.media.file_attachments`; ``cap`` is the
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
