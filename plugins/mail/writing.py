"""Replies as mail: ``multipart/alternative`` text and HTML, files attached, in the thread.

A reply answers the newest mail of its thread (``In-Reply-To``, ``References``) under
its subject with ``Re:``, so mail clients show one conversation. Every mail Roost
sends carries ``Auto-Submitted: auto-replied`` (RFC 3834) and
``X-Auto-Response-Suppress: All``, so well-behaved responders do not answer it and
Roost itself ignores whatever comes back with those marks: no loops. The
``Message-ID`` comes from the reply's ``delivery_id``, so every attempt at one reply
carries the same id (receivers that deduplicate by id show it once).
"""

from __future__ import annotations

import html
import re
from email.message import EmailMessage
from email.utils import format_datetime, localtime

from plugins.mail.reading import format_address

_CODE = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)
_INLINE = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*([^*\n]+)\*\*")
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+)\)")


def to_html(text: str) -> str:
    """The reply's Markdown as simple HTML: paragraphs, line breaks, code, bold, links."""
    out: list[str] = []
    position = 0
    for block in _CODE.finditer(text):
        out.append(_paragraphs(text[position:block.start()]))
        out.append(f"<pre>{html.escape(block.group(1).rstrip())}</pre>")
        position = block.end()
    out.append(_paragraphs(text[position:]))
    body = "\n".join(piece for piece in out if piece)
    return f'<!DOCTYPE html>\n<html><body>\n{body}\n</body></html>\n'


def _paragraphs(text: str) -> str:
    paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
    rendered = []
    for paragraph in paragraphs:
        escaped = html.escape(paragraph)
        escaped = _INLINE.sub(r"<code>\1</code>", escaped)
        escaped = _BOLD.sub(r"<strong>\1</strong>", escaped)
        escaped = _LINK.sub(r'<a href="\2">\1</a>', escaped)
        rendered.append("<p>" + escaped.replace("\n", "<br>\n") + "</p>")
    return "\n".join(rendered)


def reply_subject(subject: str, fallback: str) -> str:
    """``Re: subject`` (not ``Re: Re: ...``); ``fallback`` for a mail that had none."""
    subject = " ".join(subject.split())
    if not subject:
        return fallback
    return subject if subject[:3].lower() == "re:" else f"Re: {subject}"


def compose(*, sender: str, sender_name: str, to: str, subject: str, text: str,
            message_id: str, in_reply_to: str | None, references: list[str],
            files: list[tuple[str, str, bytes]]) -> EmailMessage:
    """The reply mail; ``files`` are ``(name, mime type, bytes)`` attached after the text."""
    mail = EmailMessage()
    mail["From"] = format_address(sender, sender_name)
    mail["To"] = to
    mail["Subject"] = subject
    mail["Date"] = format_datetime(localtime())
    mail["Message-ID"] = message_id
    if in_reply_to:
        mail["In-Reply-To"] = in_reply_to
    if references:
        mail["References"] = " ".join(references)
    mail["Auto-Submitted"] = "auto-replied"
    mail["X-Auto-Response-Suppress"] = "All"
    mail.set_content(text or " ")
    mail.add_alternative(to_html(text), subtype="html")
    for name, mime, data in files:
        maintype, _, subtype = mime.partition("/")
        if not subtype:
            maintype, subtype = "application", "octet-stream"
        mail.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return mail
