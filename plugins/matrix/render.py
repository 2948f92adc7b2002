"""Replies as Matrix message contents: Markdown to ``formatted_body`` HTML, pieces that fit
an event, replies, threads and edits (``m.replace``)."""

from __future__ import annotations

import json
from typing import Any

from markdown_it import MarkdownIt

from roost.channels import split_message

EVENT_LIMIT = 65_536
"""Bytes a whole event may take (the spec's limit, the content's JSON included)."""
CONTENT_BUDGET = 60_000
"""Bytes a message's content may take: the rest of an event (ids, signatures, hashes) fits
in the remainder."""
FIRST_CUT = 16_000
"""Characters a piece is cut at before its encoded size is measured."""
HTML = "org.matrix.custom.html"

# Raw HTML in a reply is shown as text, never passed on: the reply may quote an attacker.
# markdown-it also refuses javascript:, vbscript: and file: links.
_markdown = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(
    ["table", "strikethrough"])


def to_html(text: str) -> str:
    """The reply's Markdown as the HTML subset Matrix clients render."""
    return str(_markdown.render(text)).strip()


def text_content(text: str) -> dict[str, Any]:
    """An ``m.text`` content: ``body`` the Markdown as written, ``formatted_body`` its HTML."""
    content: dict[str, Any] = {"msgtype": "m.text", "body": text}
    html = to_html(text)
    if html != f"<p>{_escaped(text)}</p>":
        content["format"] = HTML
        content["formatted_body"] = html
    return content


def _escaped(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def size(content: dict[str, Any]) -> int:
    """Bytes ``content`` takes in an event (UTF-8 JSON, as the server measures it)."""
    return len(json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode())


def pieces(text: str, cut: int = FIRST_CUT) -> list[str]:
    """``text`` split (code fences kept whole) into pieces whose content fits one event."""
    out: list[str] = []
    for piece in split_message(text, cut):
        if size(text_content(piece)) <= CONTENT_BUDGET or cut <= 256:
            out.append(piece)
        else:
            out.extend(pieces(piece, cut // 2))
    return out


def related(content: dict[str, Any], *, reply_to: str | None,
            thread_id: str | None) -> dict[str, Any]:
    """``content`` placed in a thread (``m.thread``, replying to ``reply_to`` in it) or as a
    reply to ``reply_to``; unchanged when neither is given."""
    if thread_id:
        relation: dict[str, Any] = {"rel_type": "m.thread", "event_id": thread_id}
        if reply_to and reply_to != thread_id:
            relation["m.in_reply_to"] = {"event_id": reply_to}
        else:
            relation["is_falling_back"] = True
            relation["m.in_reply_to"] = {"event_id": thread_id}
        return {**content, "m.relates_to": relation}
    if reply_to:
        return {**content, "m.relates_to": {"m.in_reply_to": {"event_id": reply_to}}}
    return content


def replacement(event_id: str, content: dict[str, Any]) -> dict[str, Any]:
    """An edit (``m.replace``) of ``event_id`` to ``content``, with the ``* `` fallback
    clients without edits show."""
    edit: dict[str, Any] = {"msgtype": content["msgtype"], "body": "* " + content["body"],
                            "m.new_content": content,
                            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}}
    if "formatted_body" in content:
        edit["format"] = HTML
        edit["formatted_body"] = "* " + content["formatted_body"]
    return edit


def media_content(kind: str, name: str, url: str, mime_type: str, length: int,
                  caption: str = "") -> dict[str, Any]:
    """An ``m.image``/``m.audio``/``m.video``/``m.file`` content for an uploaded file."""
    content: dict[str, Any] = {"msgtype": kind, "body": caption or name, "url": url,
                               "info": {"mimetype": mime_type, "size": length}}
    if caption:
        content["filename"] = name
    return content


def media_kind(mime_type: str) -> str:
    """The msgtype a file of ``mime_type`` is sent as."""
    major = mime_type.split("/", 1)[0]
    return {"image": "m.image", "audio": "m.audio", "video": "m.video"}.get(major, "m.file")
