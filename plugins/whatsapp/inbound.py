"""A webhook delivery's ``messages`` turned into Roost's events.

Every message is a direct chat with its sender (``wa_id``), keyed by its ``wamid``
(the inbox drops a redelivery). Texts, media (a media id to look up later),
reactions (an empty emoji: removed) and reply-button presses are handed in;
locations and contacts arrive as a note; ``unsupported`` and system messages are
skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from roost import Attachment, InboundMessage
from roost.channels import ButtonPress, InboundEvent, ReactionEvent, extension_for

CHANNEL_NAME = "whatsapp"

_MEDIA = {"image": "photo", "document": "document", "audio": "audio", "video": "video",
          "sticker": "sticker"}


def changes(payload: Any) -> Iterator[dict[str, Any]]:
    """The ``value`` of every ``messages`` change in a webhook body."""
    if not isinstance(payload, dict):
        return
    for entry in payload.get("entry") or ():
        for change in (entry or {}).get("changes") or ():
            value = (change or {}).get("value")
            if isinstance(value, dict) and (change.get("field") or "messages") == "messages":
                yield value


def names(value: dict[str, Any]) -> dict[str, str]:
    """Profile names by ``wa_id`` from a change's ``contacts``."""
    return {str(c.get("wa_id")): str((c.get("profile") or {}).get("name") or "")
            for c in value.get("contacts") or () if isinstance(c, dict)}


def event_of(message: dict[str, Any], sender_name: str) -> InboundEvent | None:
    """The event one webhook ``message`` stands for, or ``None`` to skip it."""
    kind = str(message.get("type") or "")
    wamid = str(message.get("id") or "")
    sender = str(message.get("from") or "")
    if not wamid or not sender:
        return None
    context = message.get("context") or {}
    reply_to = str(context.get("id") or "") or None
    if kind == "reaction":
        reaction = message.get("reaction") or {}
        target = str(reaction.get("message_id") or "")
        if not target:
            return None
        emoji = str(reaction.get("emoji") or "")
        return ReactionEvent(CHANNEL_NAME, sender, target, sender, emoji, added=bool(emoji),
                             user_name=sender_name, event_id=wamid)
    if kind == "interactive":
        reply = (message.get("interactive") or {}).get("button_reply") or {}
        if not reply.get("id") or not reply_to:
            return None
        return ButtonPress(CHANNEL_NAME, sender, reply_to, str(reply["id"]), sender, wamid,
                           user_name=sender_name)
    text = ""
    attachments: tuple[Attachment, ...] = ()
    if kind == "text":
        text = str((message.get("text") or {}).get("body") or "")
    elif kind == "button":  # a template's quick-reply button: its text, as if typed
        text = str((message.get("button") or {}).get("text") or "")
    elif kind in _MEDIA:
        media = message.get(kind) or {}
        if not media.get("id"):
            return None
        text = str(media.get("caption") or "")
        attachments = (media_attachment(kind, media, wamid),)
    elif kind in ("location", "contacts"):
        attachments = (Attachment(kind="location" if kind == "location" else "contact"),)
    else:
        return None  # unsupported, system, order...: nothing for the model
    return InboundMessage(channel=CHANNEL_NAME, chat_id=sender, chat_type="direct",
                          sender_id=sender, text=text, sender_name=sender_name,
                          message_id=wamid, reply_to=reply_to, attachments=attachments,
                          event_id=wamid, raw=message)


def media_attachment(kind: str, media: dict[str, Any], wamid: str) -> Attachment:
    """An attachment whose ``url`` is the media id (looked up when downloaded)."""
    mime = str(media.get("mime_type") or "").split(";", 1)[0].strip()
    our_kind = "voice" if kind == "audio" and media.get("voice") else _MEDIA[kind]
    name = str(media.get("filename") or "") or \
        f"{our_kind}-{wamid[-12:]}{extension_for(mime) if mime else ''}"
    return Attachment(kind=our_kind, name=name, url=str(media["id"]), mime_type=mime,
                      size=int(media.get("file_size") or 0) if str(
                          media.get("file_size") or "0").isdigit() else 0)


def failed_statuses(value: dict[str, Any]) -> Iterator[tuple[str, str, int, float]]:
    """Each ``failed`` status in a change as (its line for the log, the recipient, the
    first error code, its time); the other statuses are ignored (read and delivered
    receipts need nothing from Roost)."""
    for status in value.get("statuses") or ():
        if isinstance(status, dict) and status.get("status") == "failed":
            errors = status.get("errors") or [{}]
            first = errors[0] if isinstance(errors[0], dict) else {}
            recipient = str(status.get("recipient_id") or "")
            try:
                code, at = int(first.get("code") or 0), float(status.get("timestamp") or 0)
            except (TypeError, ValueError):
                code, at = 0, 0.0
            line = (f"message {status.get('id')} to {recipient} failed: "
                    f"{code or '?'} {first.get('title', '')}".rstrip())
            yield line, recipient, code, at
