"""Replies out: the model's Markdown as Telegram HTML, cut to Telegram's message size,
sent, edited and deleted; and where a reply goes.

Models write a small Markdown subset: ``**bold**``, ``*italic*``/``_italic_``,
``~~strike~~``, ``inline code``, fenced blocks with a language, ``[links](url)``
and ``#`` headings. Telegram's HTML mode is the one of its formats whose
escaping is simple (only ``<``, ``>`` and ``&``), so replies are rendered to it
(:func:`to_html`). Anything that is not a well-formed construct stays literal
text, escaped, so the output is always valid HTML: a stray ``*`` or ``<script>``
is shown as typed. :class:`Sender` posts the pieces (:func:`split_for_telegram`)
through :class:`~channels.telegram.outcomes.Outcomes`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from aiogram.exceptions import TelegramBadRequest
from aiogram.methods import DeleteMessage, EditMessageText, SendChatAction, SendMessage
from aiogram.types import InlineKeyboardMarkup, Message, ReplyParameters

from channels.chunking import split_message
from channels.delivery import DeliveryPolicy
from channels.telegram.client import (
    BotApi,
    Chats,
    ReplyGate,
    describe_error,
    entity_error,
    not_modified,
)
from channels.telegram.outcomes import Outcomes

log = logging.getLogger("roost.channels.telegram")

MAX_TEXT = 4096
"""Telegram's limit on a message's text, in UTF-16 code units after entity parsing."""

_FENCE = re.compile(r"^\s*```\s*([^\s`]*)[^`]*$")
_FENCE_CLOSE = re.compile(r"^\s*```\s*$")
_LANGUAGE = re.compile(r"^[A-Za-z0-9_+#.-]{1,32}$")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_SAFE_URL = re.compile(r"^(?:https?://|tg://|mailto:)[^\s<>\"]+$", re.IGNORECASE)

# One alternation, so the leftmost construct wins and, at one position, the
# earlier alternative (code before links before bold before italic). Nothing
# spans a line break: a marker left open on one line must not swallow the rest
# of the reply.
_INLINE = re.compile(
    r"(?P<tick>`+)(?P<code>[^\n]+?)(?P=tick)(?!`)"
    r"|\[(?P<label>[^\]\n]+)\]\((?P<url>[^()\s]+(?:\([^()\s]*\)[^()\s]*)*)\)"
    r"|\*\*(?P<bold>[^\s*](?:[^\n]*?[^\s*])?)\*\*"
    r"|(?<!\w)__(?P<bold2>[^\s_](?:[^\n]*?[^\s_])?)__(?!\w)"
    r"|~~(?P<strike>[^\s~](?:[^\n]*?[^\s~])?)~~"
    r"|(?<![\w*])\*(?P<italic>[^\s*](?:[^\n*]*?[^\s*])?)\*(?![\w*])"
    r"|(?<!\w)_(?P<italic2>[^\s_](?:[^\n_]*?[^\s_])?)_(?!\w)"
)


def escape(text: str) -> str:
    """``text`` with Telegram HTML's three reserved characters escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_html(markdown: str) -> str:
    """Render the Markdown subset as Telegram HTML (``parse_mode="HTML"``)."""
    parts: list[str] = []
    text: list[str] = []
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            text.append(lines[i])
            i += 1
            continue
        # A fenced block: everything up to the closing fence (or the end, for
        # a block left open, as in a draft still being streamed) is code.
        end = i + 1
        while end < len(lines) and not _FENCE_CLOSE.match(lines[end]):
            end += 1
        if text:
            parts.append(_render_text("\n".join(text)))
            text = []
        parts.append(_code_block("\n".join(lines[i + 1:end]), opening.group(1)))
        i = end + 1
    if text:
        parts.append(_render_text("\n".join(text)))
    return "\n".join(parts)


def split_for_telegram(markdown: str, limit: int = MAX_TEXT) -> list[str]:
    """Cut ``markdown`` into pieces that each render to one Telegram message.

    Cutting the Markdown (not the HTML) keeps tags whole, and
    :func:`split_message` closes and reopens a code block cut in two. The
    rendered text is never longer than its source, so a piece within
    ``limit`` stays within it; the limit counts UTF-16 code units, as
    Telegram does, so pieces heavy in emoji are cut again.
    """
    whole = markdown.strip("\n")
    if utf16_len(whole) <= limit:
        # One piece (none when blank), as split_message would cut it: not cut at all.
        return [whole] if whole.strip() else []
    return _split(markdown, limit, limit)


def _split(text: str, units: int, chars: int) -> list[str]:
    pieces: list[str] = []
    for piece in split_message(text, chars):
        size = utf16_len(piece)
        if size <= units:
            pieces.append(piece)
        else:
            # Astral characters (emoji) count twice: cut this piece again, shorter.
            pieces.extend(_split(piece, units, max(len(piece) * units // size - 8, 20)))
    return pieces


def fit(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` shortened (with an ellipsis) to at most ``limit`` UTF-16 code units."""
    if utf16_len(text) <= limit:
        return text
    data = text.encode("utf-16-le")[: (limit - 1) * 2]
    return data.decode("utf-16-le", errors="ignore") + "…"


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, the unit of Telegram's limits and entity offsets."""
    return len(text.encode("utf-16-le")) // 2


def _code_block(code: str, language: str) -> str:
    if _LANGUAGE.match(language):
        return f'<pre><code class="language-{language}">{escape(code)}</code></pre>'
    return f"<pre>{escape(code)}</pre>"


def _render_text(text: str) -> str:
    lines = []
    for line in text.split("\n"):
        heading = _HEADING.match(line)
        lines.append(f"<b>{_inline(heading.group(1))}</b>" if heading else _inline(line))
    return "\n".join(lines)


def _inline(text: str) -> str:
    out: list[str] = []
    pos = 0
    for match in _INLINE.finditer(text):
        out.append(escape(text[pos:match.start()]))
        out.append(_construct(match))
        pos = match.end()
    out.append(escape(text[pos:]))
    return "".join(out)


def _construct(match: re.Match[str]) -> str:
    groups = match.groupdict()
    if groups["code"] is not None:
        code = groups["code"]
        # Markdown lets ``` `` `x` `` ``` pad a span that starts or ends with a backtick.
        if len(groups["tick"]) > 1 and code.startswith(" ") and code.endswith(" "):
            code = code[1:-1]
        return f"<code>{escape(code)}</code>"
    if groups["url"] is not None:
        url = groups["url"]
        if not _SAFE_URL.match(url):
            return escape(match.group(0))
        href = escape(url).replace('"', "&quot;")
        return f'<a href="{href}">{_inline(groups["label"] or "")}</a>'
    for name, tag in (("bold", "b"), ("bold2", "b"), ("strike", "s"), ("italic", "i"),
                      ("italic2", "i")):
        body = groups[name]
        if body is not None:
            return f"<{tag}>{_inline(body)}</{tag}>"
    return escape(match.group(0))  # pragma: no cover - every alternative is handled above


@dataclass(frozen=True, slots=True)
class Target:
    """Where a reply goes: the chat, its forum topic, and the message it answers."""

    chat_id: int | str
    thread_id: int | None = None
    reply_to: int | None = None

    @classmethod
    def of(cls, chat_id: str, thread_id: str | None, reply_to: str | None) -> Target:
        return cls(chat_id_of(chat_id), int_or_none(thread_id), int_or_none(reply_to))

    def unthreaded(self) -> Target:
        """The same chat and topic, not replying: for the pieces after the first."""
        return Target(self.chat_id, self.thread_id)


def chat_id_of(chat_id: str) -> int | str:
    """A chat id as Telegram takes it: a number, or an ``@channel`` name as it is."""
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def int_or_none(value: str | None) -> int | None:
    """``value`` as a number, ``None`` when absent or not one."""
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


class Sender:
    """Replies out: pieces sent, drafts edited into the final reply, stale drafts deleted,
    the typing status kept up."""

    def __init__(self, api: BotApi, outcomes: Outcomes, chats: Chats, gate: ReplyGate, *,
                 policy: DeliveryPolicy, typing_interval: float) -> None:
        self.api = api
        self.outcomes = outcomes
        self.chats = chats
        self.gate = gate
        self.policy = policy
        self.typing_interval = typing_interval

    async def send_piece(self, target: Target, source: str, *, urgent: bool = True,
                          policy: DeliveryPolicy | None = None,
                          markup: InlineKeyboardMarkup | None = None) -> Message | None:
        """Send one piece as HTML; if Telegram cannot parse it, as the plain text.

        A final reply is retried after a reset, a timeout or a 5xx once it is found
        out that it did not arrive (:mod:`channels.telegram.outcomes`). Drafts
        (``urgent`` false) are tried once and give way to rate limits: ``None`` then.
        """
        reply = ReplyParameters(message_id=target.reply_to, allow_sending_without_reply=True) \
            if target.reply_to is not None else None
        for text, mode in ((to_html(source), "HTML"), (source, None)):
            method = SendMessage(chat_id=target.chat_id, text=text, parse_mode=mode,
                                 message_thread_id=target.thread_id, reply_parameters=reply,
                                 reply_markup=markup)
            try:
                sent = await self.outcomes.create(method, "sendMessage",
                                          policy=policy or self.policy, urgent=urgent)
            except TelegramBadRequest as exc:
                if mode is None or not entity_error(exc):
                    raise
                log.warning("telegram: HTML refused (%s); sending the piece as plain text",
                            exc.message)
                continue
            if sent is not None:
                self.chats.remember_shown(sent.chat.id, sent.message_id, text, mode)
            return sent
        raise AssertionError("unreachable")

    async def edit(self, target: Target, message_id: int, source: str, *,
                    urgent: bool = True, markup: InlineKeyboardMarkup | None = None) -> bool:
        """Show ``source`` in message ``message_id``; ``False`` if a draft edit gave way.

        An edit to what the message already shows is not made (Telegram would
        refuse it as "message is not modified"); that answer, should it come
        anyway (a retry after the first attempt took effect), means success.
        With ``markup`` the message's buttons become those (an empty keyboard:
        none), and the edit is made even if the text is unchanged.
        """
        for text, mode in ((to_html(source), "HTML"), (source, None)):
            if markup is None and self.chats.shows(target.chat_id, message_id, text, mode):
                return True
            method = EditMessageText(chat_id=target.chat_id, message_id=message_id, text=text,
                                     parse_mode=mode, reply_markup=markup)
            try:
                if urgent:
                    await self.api.deliver(method, "editMessageText")
                elif await self.api.call(method, urgent=False) is None:
                    return False
            except TelegramBadRequest as exc:
                if not_modified(exc):
                    self.chats.remember_shown(target.chat_id, message_id, text, mode)
                    return True
                if mode is None or not entity_error(exc):
                    raise
                continue
            self.chats.remember_shown(target.chat_id, message_id, text, mode)
            return True
        raise AssertionError("unreachable")

    async def delete(self, chat_id: int | str, message_id: int) -> None:
        try:
            await self.api.deliver(DeleteMessage(chat_id=chat_id, message_id=message_id),
                                "deleteMessage")
        except TelegramBadRequest as exc:
            # Gone already (deleted by someone, or our own earlier attempt took
            # effect before its answer was lost).
            if "message to delete not found" not in exc.message.lower():
                raise
            log.info("telegram: message %d in %s was already gone", message_id, chat_id)
        self.chats.forget_shown(chat_id, message_id)

    async def deliver_reply(self, target: Target, draft_id: str | None,
                             text: str | None,
                             markup: InlineKeyboardMarkup | None = None) -> str | None:
        """The final reply: the draft (if any) becomes its first piece, the rest follow.

        A draft whose final edit fails for good is not left showing a partial
        reply: the reply is sent anew and the draft deleted. ``text=None``
        removes the draft. ``markup`` goes under the last piece. Returns the id
        of the last message sent.
        """
        pieces = split_for_telegram(text) if text is not None else []
        draft = int(draft_id) if draft_id and draft_id.lstrip("-").isdigit() else None
        last: str | None = None
        stale = False
        if draft is not None:
            if not pieces:
                await self.delete(target.chat_id, draft)
                return None
            try:
                await self.edit(target, draft, pieces[0],
                                markup=markup if len(pieces) == 1 else None)
                pieces, last = pieces[1:], str(draft)
            except Exception as exc:
                log.warning("telegram: could not put the reply into draft %d (%s); sending "
                            "it anew", draft, describe_error(exc))
                stale = True
        for index, piece in enumerate(pieces):
            first = index == 0 and last is None
            sent = await self.send_piece(target if first else target.unthreaded(), piece,
                                         markup=markup if index == len(pieces) - 1 else None)
            assert sent is not None
            last = str(sent.message_id)
        if stale and draft is not None:
            try:
                await self.delete(target.chat_id, draft)
            except Exception as exc:
                # The reply is out; only the stale draft stays. The core journals
                # its id and withdraws it later.
                log.warning("telegram: stale draft %d not deleted (%s)", draft, describe_error(exc))
        return last

    async def keep_typing(self, chat_id: int | str, thread_id: int | None) -> None:
        """Refresh "typing…"; it gives way to every other call to the chat."""
        while not self.gate.shut:
            try:
                await self.api.call(SendChatAction(chat_id=chat_id, action="typing",
                                               message_thread_id=thread_id), urgent=False)
            except Exception as exc:
                log.debug("telegram: typing status not sent: %s", describe_error(exc))
            await asyncio.sleep(self.typing_interval)
