"""The model's Markdown as Telegram HTML, and replies cut to Telegram's message size.

Models write a small Markdown subset: ``**bold**``, ``*italic*``/``_italic_``,
``~~strike~~``, ``inline code``, fenced blocks with a language, ``[links](url)``
and ``#`` headings. Telegram's HTML mode is the one of its formats whose
escaping is simple (only ``<``, ``>`` and ``&``), so replies are rendered to it.
Anything that is not a well-formed construct stays literal text, escaped, so
the output is always valid HTML: a stray ``*`` or ``<script>`` is shown as typed.
"""

from __future__ import annotations

import re

from channels.chunking import split_message

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
