"""Telegram's HTML parse mode as the server reads it: the visible text, or its 400."""

from __future__ import annotations

import re


class HtmlError(ValueError):
    """Text that Telegram's HTML parser refuses ("can't parse entities")."""


_TAGS = frozenset({"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code",
                   "pre", "span", "tg-spoiler", "tg-emoji", "blockquote"})
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)((?:\s+[a-zA-Z-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'"
                  r"|[^\s>]+))*)\s*>")
_ENTITY = re.compile(r"&(#[0-9]{1,7}|#x[0-9a-fA-F]{1,6}|lt|gt|amp|quot);")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def parse_html(text: str) -> str:
    """The visible text of Telegram-HTML ``text``; :class:`HtmlError` where Telegram errs.

    Strict where Telegram is: unsupported tags, unbalanced or misnested tags,
    ``<a>`` without ``href``, a bare ``<``, ``>`` or ``&`` outside a tag or entity,
    and tags nested inside ``<code>``/``<pre>`` (only ``<pre><code class=...>``).
    """
    out: list[str] = []
    stack: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "<":
            match = _TAG.match(text, i)
            if match is None:
                raise HtmlError(f"Unexpected character '<' at byte offset {_bytes_at(text, i)}")
            closing, name, attrs = match.group(1) == "/", match.group(2).lower(), match.group(3)
            if name not in _TAGS:
                raise HtmlError(f'Unsupported start tag "{name}" at byte offset '
                                f"{_bytes_at(text, i)}")
            if closing:
                if not stack or stack[-1] != name:
                    raise HtmlError(f'Unexpected end tag at byte offset {_bytes_at(text, i)}')
                stack.pop()
            else:
                if stack and (stack[-1] == "code" or (stack[-1] == "pre" and name != "code")):
                    raise HtmlError(f'Entity "{name}" can\'t be nested in "{stack[-1]}"')
                if name == "a" and "href" not in attrs:
                    raise HtmlError("Can't find href in <a> tag")
                stack.append(name)
            i = match.end()
        elif ch == "&":
            match = _ENTITY.match(text, i)
            if match is None:
                raise HtmlError(f"Character '&' is reserved at byte offset "
                                f"{_bytes_at(text, i)}; use &amp;")
            ref = match.group(1)
            if ref in _NAMED:
                out.append(_NAMED[ref])
            else:
                out.append(chr(int(ref[2:], 16) if ref[1] == "x" else int(ref[1:])))
            i = match.end()
        elif ch == ">":
            raise HtmlError(f"Character '>' is reserved at byte offset {_bytes_at(text, i)}")
        else:
            out.append(ch)
            i += 1
    if stack:
        raise HtmlError(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    return "".join(out)


def _bytes_at(text: str, index: int) -> int:
    return len(text[:index].encode())
