"""Splitting long replies to fit a platform's message limit."""

from __future__ import annotations

FENCE = "```"


def split_message(text: str, limit: int) -> list[str]:
    """Split ``text`` into pieces of at most ``limit`` characters.

    Cuts prefer a paragraph break, then a line break, then a space. A cut never
    leaves a code block open: when one must fall inside a fenced block, the
    piece is closed with a fence and the next one reopens it (with its
    language), so every piece renders on its own.
    """
    if limit < 20:
        raise ValueError("limit too small to split sensibly")
    pieces: list[str] = []
    rest = text.strip("\n")
    opener = ""  # the fence line to reopen in the next piece, if a block is open
    while rest:
        body = opener + rest if opener else rest
        if len(body) <= limit:
            pieces.append(body)
            break
        room = limit - len(FENCE) - 1  # leave space to close a block if needed
        cut = _cut_point(body, room)
        piece, rest = body[:cut].rstrip(), body[cut:].lstrip("\n")
        fence = _open_fence(piece)
        if fence is not None:
            piece += "\n" + FENCE
            opener = fence + "\n"
        else:
            opener = ""
        pieces.append(piece)
    return [p for p in pieces if p.strip()]


def _cut_point(text: str, room: int) -> int:
    for sep in ("\n\n", "\n", " "):
        cut = text.rfind(sep, 0, room)
        if cut > room // 2:
            return cut + len(sep)
    return room


def _open_fence(piece: str) -> str | None:
    """The opening fence line of a block left open at the end of ``piece``."""
    fence: str | None = None
    for line in piece.split("\n"):
        if line.lstrip().startswith(FENCE):
            fence = None if fence is not None else line.strip()
    return fence
