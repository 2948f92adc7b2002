"""Markdown as the model writes it, turned into WhatsApp's own formatting.

WhatsApp knows ``*bold*``, ``_italic_``, ``~strike~``, ```` `code` ```` and
```` ``` ```` blocks; it has no headings or links. Code is left as it is.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![*\w])\*(?=[^\s*])([^*\n]+?)(?<=\S)\*(?![*\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_LINK = re.compile(r"\[([^\]\n]+)\]\((\S+?)\)")
_HOLE = "\x00{}\x00"


def to_whatsapp(text: str) -> str:
    """``text`` (Markdown) in WhatsApp's formatting; code spans and blocks unchanged."""
    kept: list[str] = []

    def keep(match: re.Match[str]) -> str:
        body = match.group(0)
        if body.startswith("```"):
            body = "```\n" + (match.group(1) or "").rstrip("\n") + "\n```"
        kept.append(body)
        return _HOLE.format(len(kept) - 1)

    text = _FENCE.sub(keep, text.replace("\x00", ""))
    text = _INLINE_CODE.sub(keep, text)
    text = _ITALIC.sub(r"_\1_", text)
    text = _BOLD.sub(lambda m: f"*{m.group(1) or m.group(2)}*", text)
    text = _STRIKE.sub(r"~\1~", text)
    text = _HEADING.sub(r"*\1*", text)
    text = _LINK.sub(lambda m: m.group(1) if m.group(1) == m.group(2)
                     else f"{m.group(1)} ({m.group(2)})", text)
    return re.sub("\x00(\\d+)\x00", lambda m: kept[int(m.group(1))], text)
