"""Text translation for Slack: the model's Markdown to mrkdwn, and Slack markup to plain text.

Slack does not render Markdown; it has its own "mrkdwn": ``*bold*``,
``_italic_``, ``~strike~``, ``<url|label>`` links, and ``&``, ``<``, ``>``
escaped as HTML entities everywhere (they are control characters for links
and mentions). Inbound text uses the same markup for mentions and links.
"""

from __future__ import annotations

import re

from channels.chunking import split_message

FENCE = "```"

# Headings become bold lines: mrkdwn has no headings.
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$")
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(?=\S)")
_QUOTE = re.compile(r"^([ \t]*)>[ \t]?")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[([^\]\n]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![\w*\\])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")
_BOLD_MARK = "\x01"  # stands for a bold ``*`` until single-star italics are converted


def escape(text: str) -> str:
    """Escape Slack's three control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(markdown: str) -> str:
    """Convert the model's Markdown to Slack mrkdwn.

    ``**bold**``/``__bold__`` → ``*bold*``, ``*italic*``/``_italic_`` →
    ``_italic_``, ``~~strike~~`` → ``~strike~``, ``[text](url)`` →
    ``<url|text>``, headings → bold lines, list bullets → ``•``. Code blocks
    and inline code are kept verbatim (only escaped); a fence's language tag
    is dropped because Slack would show it as the first line of code.
    Everything else has ``&``, ``<`` and ``>`` escaped, so model output can
    never form a mention or an ``@channel`` broadcast.
    """
    text = markdown.replace("\x00", "").replace(_BOLD_MARK, "")
    out: list[str] = []
    in_code = False
    for line in text.split("\n"):
        if line.lstrip().startswith(FENCE):
            # An opening fence loses its language tag; a closing one stays as is.
            out.append(FENCE if not in_code else line.strip())
            in_code = not in_code
        elif in_code:
            out.append(escape(line))
        else:
            out.append(_line(line))
    return "\n".join(out)


def _line(line: str) -> str:
    heading = _HEADING.match(line)
    if heading:
        content = re.sub(r"\*\*|__", "", heading.group(1))
        return f"*{_inline(content)}*" if content else ""
    prefix = ""
    quote = _QUOTE.match(line)
    if quote:
        # A leading ">" is a block quote in mrkdwn too; it must stay unescaped.
        prefix, line = quote.group(1) + ">", line[quote.end():]
        prefix += " " if line else ""
    bullet = _BULLET.match(line)
    if bullet:
        prefix, line = prefix + bullet.group(1) + "• ", line[bullet.end():]
    return prefix + _inline(line)


def _inline(text: str) -> str:
    kept: list[str] = []

    def keep(value: str) -> str:
        kept.append(value)
        return f"\x00{len(kept) - 1}\x00"

    text = _INLINE_CODE.sub(lambda m: keep(m.group(1) + escape(m.group(2)) + m.group(1)), text)
    text = _LINK.sub(lambda m: keep(_link(m.group(2), m.group(1))), text)
    text = _AUTOLINK.sub(lambda m: keep(_link(m.group(1), "")), text)
    text = escape(text)
    text = _BOLD.sub(lambda m: f"{_BOLD_MARK}{m.group(1) or m.group(2)}{_BOLD_MARK}", text)
    text = _ITALIC.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text)
    text = text.replace(_BOLD_MARK, "*")
    return _PLACEHOLDER.sub(lambda m: kept[int(m.group(1))], text)


def _link(url: str, label: str) -> str:
    # Inside <url|label> a raw "<", ">" or "|" in the URL would end the link early.
    safe_url = (url.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E")
                .replace("|", "%7C"))
    label = label.strip()
    if not label or label == url:
        return f"<{safe_url}>"
    return f"<{safe_url}|{escape(label)}>"


_SLACK_LINK = re.compile(r"<((?:https?|mailto|tel):[^|>]+)(?:\|([^>]*))?>")
_CHANNEL_REF = re.compile(r"<#([A-Z0-9]+)(?:\|([^>]*))?>")
_USER_REF = re.compile(r"<@([A-Z0-9]+)(?:\|([^>]*))?>")
_SPECIAL = re.compile(r"<!([a-z]+)(?:\^[^|>]*)?(?:\|([^>]*))?>")


def from_slack(text: str, bot_user_id: str) -> tuple[str, bool]:
    """Slack message text as plain text for the model, and whether it @-mentions the bot.

    The bot's own mention is removed (with a ``:`` or ``,`` right after a
    leading one); other users become ``@U123``, channels ``#name``, links
    ``label (url)``, and the HTML entities Slack escapes are decoded.
    """
    mentioned = False

    def user(match: re.Match[str]) -> str:
        nonlocal mentioned
        if bot_user_id and match.group(1) == bot_user_id:
            mentioned = True
            return "\x00"
        return "@" + (match.group(2) or match.group(1))

    text = _USER_REF.sub(user, text)
    if mentioned:
        text = re.sub(r"^\s*\x00\s*[:,]?\s*", "", text)
        text = re.sub(r"[ \t]*\x00[ \t]?", " ", text)
    text = _SLACK_LINK.sub(_plain_link, text)
    text = _CHANNEL_REF.sub(lambda m: "#" + (m.group(2) or m.group(1)), text)
    text = _SPECIAL.sub(lambda m: m.group(2) or "@" + m.group(1), text)
    return unescape(text).strip(), mentioned


def _plain_link(match: re.Match[str]) -> str:
    url, label = match.group(1), match.group(2)
    bare = re.sub(r"^(?:https?://|mailto:|tel:)", "", url)
    if not label or label in (url, bare):
        return url
    return f"{label} ({url})"


def unescape(text: str) -> str:
    """Decode the entities Slack escapes (``&amp;`` last, so ``&amp;lt;`` stays ``&lt;``)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def split_for_slack(text: str, limit: int) -> list[str]:
    """Markdown ``text`` as mrkdwn pieces of at most ``limit`` characters.

    The Markdown is split first (:func:`split_message` keeps code blocks closed
    in every piece), then each piece converted; escaping can lengthen a piece, so one
    that grew past the limit is split once more as mrkdwn.
    """
    pieces: list[str] = []
    for piece in split_message(text, limit):
        converted = to_mrkdwn(piece)
        pieces.extend(split_message(converted, limit) if len(converted) > limit else [converted])
    return pieces
