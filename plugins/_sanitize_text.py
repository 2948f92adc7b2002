"""Code-aware cutting for the output sanitizers (:mod:`plugins.sanitizers`).

Where markdown code lies in a text (fenced blocks, inline spans), a line-by-line
fence tracker, and a copier that leaves out ranges and tidies the lines a removal
emptied. Linear in the text's length.
"""

from __future__ import annotations

import bisect
import re

_FENCE_OPEN = re.compile(r"[ \t]*(`{3,}|~{3,})")

_SPACE = " \t\r"
"""Characters that do not count as content when tidying around a removal."""


def lines(text: str) -> list[str]:
    """``text`` split after every ``\\n``; joining the pieces gives ``text`` back."""
    pieces = text.split("\n")
    lines = [p + "\n" for p in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    return lines


class Fence:
    """Tracks whether a line-by-line scan is inside a fenced code block."""

    __slots__ = ("char", "size")

    def __init__(self) -> None:
        self.char = ""
        self.size = 0

    def feed(self, line: str) -> bool:
        """Advance past ``line``; true when it is a fence line or inside a fence."""
        if self.char:
            stripped = line.strip()
            if len(stripped) >= self.size and stripped == self.char * len(stripped):
                self.char = ""
            return True
        m = _FENCE_OPEN.match(line)
        # An info string after a backtick fence cannot contain backticks, so
        # "```a``` b" is inline code, not a fence.
        if m and (m.group(1)[0] == "~" or "`" not in line[m.end():]):
            self.char = m.group(1)[0]
            self.size = len(m.group(1))
            return True
        return False


def _inline_code(line: str, offset: int) -> list[tuple[int, int]]:
    """Inline code spans in one line, as ``(start, end)`` offsets into the text.

    A run of N backticks opens a span closed by the next run of exactly N
    backticks; a run with no partner is literal. Linear in the line length.
    """
    runs: list[tuple[int, int]] = []
    i = line.find("`")
    while i != -1:
        j = i
        while j < len(line) and line[j] == "`":
            j += 1
        runs.append((i, j - i))
        i = line.find("`", j)
    partner = [-1] * len(runs)
    last: dict[int, int] = {}
    for k in range(len(runs) - 1, -1, -1):
        partner[k] = last.get(runs[k][1], -1)
        last[runs[k][1]] = k
    spans: list[tuple[int, int]] = []
    k = 0
    while k < len(runs):
        j = partner[k]
        if j == -1:
            k += 1
            continue
        spans.append((offset + runs[k][0], offset + runs[j][0] + runs[j][1]))
        k = j + 1
    return spans


class Code:
    """Where markdown code lies in a text: fenced blocks and inline spans."""

    __slots__ = ("ends", "starts")

    def __init__(self, text: str) -> None:
        spans: list[tuple[int, int]] = []
        fence = Fence()
        block_start = -1
        pos = 0
        for line in lines(text):
            end = pos + len(line)
            if fence.feed(line):
                if block_start < 0:
                    block_start = pos
                if not fence.char:  # this line closed the fence
                    spans.append((block_start, end))
                    block_start = -1
            elif "`" in line:
                spans.extend(_inline_code(line, pos))
            pos = end
        if block_start >= 0:  # an unclosed fence runs to the end
            spans.append((block_start, len(text)))
        self.starts = [s for s, _ in spans]
        self.ends = [e for _, e in spans]

    def end_of(self, pos: int) -> int:
        """The end of the code span containing ``pos``, or -1 if ``pos`` is prose."""
        i = bisect.bisect_right(self.starts, pos) - 1
        if i >= 0 and pos < self.ends[i]:
            return self.ends[i]
        return -1


def _tail(tail: str, segment: str) -> str:
    """The last two characters of ``tail + segment``, ignoring spaces and tabs."""
    found = ""
    i = len(segment) - 1
    while i >= 0 and len(found) < 2:
        if segment[i] not in _SPACE:
            found = segment[i] + found
        i -= 1
    return (tail + found)[-2:]


class Cutter:
    """Copies a text while leaving out ranges, tidying up after whole-line removals."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.parts: list[str] = []
        self.pos = 0  # everything before this has been kept or cut
        self.tail = ""  # see _tail: the end of what has been kept

    def _keep(self, end: int) -> None:
        if end > self.pos:
            segment = self.text[self.pos:end]
            self.parts.append(segment)
            self.tail = _tail(self.tail, segment)
        self.pos = max(self.pos, end)

    def cut(self, start: int, end: int) -> None:
        """Leave out ``text[start:end]``; ranges must come in increasing order."""
        text, n = self.text, len(self.text)
        start = max(start, self.pos)
        end = max(end, start)
        left = start
        while left > self.pos and text[left - 1] in " \t":
            left -= 1
        spaces = end  # spaces and tabs after the range
        while spaces < n and text[spaces] in " \t":
            spaces += 1
        right = spaces  # ...and a carriage return before a line break
        while right < n and text[right] in _SPACE:
            right += 1
        at_line_start = text[left - 1] == "\n" if left > self.pos else (
            not self.parts or self.tail.endswith("\n"))
        if at_line_start and (right == n or text[right] == "\n"):
            # The removal fills whole lines: take the line break along, and if
            # the lines sat after a blank line (or at the top), a blank line
            # that follows them too.
            start, end = left, min(right + 1, n)
            before = _tail(self.tail, text[self.pos:start])
            if before in ("", "\n", "\n\n"):
                after = end
                while after < n and text[after] in _SPACE:
                    after += 1
                if after < n and text[after] == "\n":
                    end = after + 1
        elif right == n or text[right] == "\n":
            start, end = left, spaces  # no trailing spaces before the line break
        elif left < start and spaces > end:
            end = spaces  # "a <x/> b" becomes "a b", not "a  b"
        self._keep(start)
        self.pos = max(self.pos, end)

    def done(self) -> str:
        self._keep(len(self.text))
        return "".join(self.parts)


def drop_marked_blocks(text: str, marker: re.Pattern[str]) -> str:
    """Remove every block that starts with a line matching ``marker``.

    A block runs from the marker line to the next blank line outside a code
    fence. The blank line that ends it is removed too when the block followed
    a blank line (or the top of the text), so paragraphs stay one blank line
    apart. Marker lines inside code fences are left alone.
    """
    parts: list[str] = []
    fence = Fence()
    in_block = False
    kept_blank = True  # the top of the text counts as a blank line
    for line in lines(text):
        is_code = fence.feed(line)
        if in_block:
            if not is_code and not line.strip():
                in_block = False
                if not kept_blank:
                    parts.append(line)
                    kept_blank = True
            continue
        if not is_code and marker.match(line):
            in_block = True
            continue
        parts.append(line)
        kept_blank = not line.strip()
    return "".join(parts)
