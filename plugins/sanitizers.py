"""Built-in output sanitizers: seven steps that clean every final reply.

Models sometimes leak machinery into their answers: tool calls written out as
text, reasoning wrapped in tags, echoed system messages, stuttered paragraphs.
Each step below is a plain ``str -> str`` function that only ever *deletes*
text, never raises, and runs in (near) linear time: every regular expression
has bounded repetition, and every search for a closing tag either moves the
scan forward or ends it, so even adversarial 100 KB replies stay cheap.

=====  =============================  ============================================
order  name                           what it removes
=====  =============================  ============================================
100    strip_garbled_tool_xml         ``<tool_call>``, ``<function_call(s)>``,
                                      ``<tool_use>``, ``<minimax:tool_call>``,
                                      ``<invoke name=…>``, ``<parameter name=…>``
                                      blocks and DeepSeek tool-call tokens
200    strip_text_tool_calls          ``[Tool Call: …]``, ``[Tool Result …]`` and
                                      ``[Historical context: …]`` blocks
300    strip_thinking_tags            ``<think>``, ``<thinking>``, ``<thought>``,
                                      ``<antThinking>`` blocks with their content
400    unwrap_final_tags              ``<final>`` / ``</final>`` (content is kept)
500    strip_echoed_system_messages   ``[System Message]`` blocks
600    collapse_duplicate_paragraphs  a paragraph equal to the one before it
700    strip_leading_blank_lines      blank lines before the first real line
=====  =============================  ============================================

The gaps are for plugins: a sanitizer with order 350 runs after thinking is
gone but while ``<final>`` tags are still there. After the last sanitizer the
pipeline trims the text (:func:`bot.contracts.sanitize.run_pipeline`); an empty result
makes the reply silent.

Shared rules:

* Markdown code is left alone. A tag or marker that *starts* inside a fenced
  code block (```` ``` ```` or ``~~~``) or an inline code span is never
  treated as an artifact, so answers that explain ``<think>`` or show a
  ``<tool_call>`` example survive. Once an artifact has started in prose, it
  ends at its closing tag even if code sits in between (reasoning often
  contains code).
* A removed block that filled whole lines takes its line break with it, and
  if it sat between two blank lines one of them goes too, so removals do not
  leave holes in the text.
* Tag names are matched case-insensitively; closing tags are found
  non-greedily (the first one after the opening tag).
"""

from __future__ import annotations

import bisect
import re

from roost import Sanitizer, Settings, hookimpl

# -- shared helpers --------------------------------------------------------------------------

_FENCE_OPEN = re.compile(r"[ \t]*(`{3,}|~{3,})")

_SPACE = " \t\r"
"""Characters that do not count as content when tidying around a removal."""


def _lines(text: str) -> list[str]:
    """``text`` split after every ``\\n``; joining the pieces gives ``text`` back."""
    pieces = text.split("\n")
    lines = [p + "\n" for p in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    return lines


class _Fence:
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


class _Code:
    """Where markdown code lies in a text: fenced blocks and inline spans."""

    __slots__ = ("ends", "starts")

    def __init__(self, text: str) -> None:
        spans: list[tuple[int, int]] = []
        fence = _Fence()
        block_start = -1
        pos = 0
        for line in _lines(text):
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


class _Cutter:
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


def _drop_marked_blocks(text: str, marker: re.Pattern[str]) -> str:
    """Remove every block that starts with a line matching ``marker``.

    A block runs from the marker line to the next blank line outside a code
    fence. The blank line that ends it is removed too when the block followed
    a blank line (or the top of the text), so paragraphs stay one blank line
    apart. Marker lines inside code fences are left alone.
    """
    parts: list[str] = []
    fence = _Fence()
    in_block = False
    kept_blank = True  # the top of the text counts as a blank line
    for line in _lines(text):
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


# -- 1. garbled tool XML ---------------------------------------------------------------------

_NS = r"(?:[A-Za-z][\w.-]{0,32}:)?"  # an optional namespace, as in <minimax:tool_call>
_TOOL_BLOCKS = ("tool_calls", "tool_call", "function_calls", "function_call", "tool_use",
                "tool_results", "tool_result", "tool_response")
_DEEPSEEK_KINDS = ("calls", "call", "outputs", "output")
_BAR = "[|\uff5c]"  # DeepSeek writes its special tokens with a fullwidth bar...
_SEP = "[_\u2581]"  # ...and a "lower one eighth block" as the word separator

_TOOL_TAG = re.compile(
    # A block-level tag; attributes are allowed, "<tool_caller>" is not a match.
    rf"<{_NS}(?P<block>{'|'.join(_TOOL_BLOCKS)})(?:\s[^<>]{{0,256}})?/?>"
    # <invoke> and <parameter> count only in the form tool calls use.
    rf"|<{_NS}(?P<named>invoke|parameter)\s+name\s*=[^<>]{{0,256}}>"
    rf"|<{_BAR}tool{_SEP}(?P<ds>{'|'.join(_DEEPSEEK_KINDS)}){_SEP}begin{_BAR}>"
    # Leftovers: closing tags without an opening one, other DeepSeek tokens.
    rf"|(?P<stray></{_NS}(?:{'|'.join(_TOOL_BLOCKS)}|invoke|parameter)\s*>"
    rf"|<{_BAR}tool{_SEP}[a-z_\u2581]{{1,40}}{_BAR}>)",
    re.IGNORECASE,
)
_TOOL_CLOSE: dict[str, re.Pattern[str]] = {
    **{name: re.compile(rf"</{_NS}{name}\s*>", re.IGNORECASE)
       for name in (*_TOOL_BLOCKS, "invoke", "parameter")},
    **{f"ds:{kind}": re.compile(rf"<{_BAR}tool{_SEP}{kind}{_SEP}end{_BAR}>", re.IGNORECASE)
       for kind in _DEEPSEEK_KINDS},
}


def strip_garbled_tool_xml(text: str) -> str:
    """Remove tool-call XML that a model wrote as text instead of calling the tool.

    Handles ``<tool_call>…</tool_call>`` (Hermes, Qwen, GLM), ``<function_call>``,
    ``<function_calls>``, ``<tool_use>``, ``<tool_result>``, ``<tool_response>``,
    namespaced variants such as ``<minimax:tool_call>``, ``<invoke name=…>`` and
    ``<parameter name=…>`` (only with a ``name`` attribute, so prose like
    "<parameter>" is not mistaken for one), and DeepSeek's
    ``<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`` tokens. Each block goes with
    its content (a self-closing tag has none). A block that is never closed
    was cut off mid-call, so it is removed up to the end of the text. Stray
    closing tags are removed too.
    If nothing but whitespace remains, the result is ``""``.
    """
    if "<" not in text:
        return text
    code = _Code(text)
    cutter = _Cutter(text)
    pos = 0
    while (m := _TOOL_TAG.search(text, pos)) is not None:
        skip = code.end_of(m.start())
        if skip >= 0:
            pos = skip
            continue
        if m.group("stray") is not None or m.group().endswith("/>"):  # nothing inside
            cutter.cut(m.start(), m.end())
            pos = m.end()
            continue
        ds = m.group("ds")
        key = f"ds:{ds}" if ds is not None else (m.group("block") or m.group("named"))
        close = _TOOL_CLOSE[key.lower()].search(text, m.end())
        if close is None:
            cutter.cut(m.start(), len(text))
            break
        cutter.cut(m.start(), close.end())
        pos = close.end()
    cleaned = cutter.done()
    return cleaned if cleaned.strip() else ""


# -- 2. tool calls downgraded to text --------------------------------------------------------

_TEXT_TOOL_MARKER = re.compile(
    r"[ \t]*\[(?:tool call:|tool result\b|historical context:)", re.IGNORECASE)


def strip_text_tool_calls(text: str) -> str:
    """Remove tool calls and results that a model wrote out as bracketed text.

    When history is replayed as plain text, models imitate it: a line starting
    with ``[Tool Call: name]`` followed by JSON arguments, ``[Tool Result …]``
    followed by output, or ``[Historical context: …]``. Each such block runs
    from the marker line to the next blank line (blank lines inside a code
    fence do not end it). Markers must start a line; inside code they are kept.
    """
    if "[" not in text:
        return text
    return _drop_marked_blocks(text, _TEXT_TOOL_MARKER)


# -- 3. thinking tags ------------------------------------------------------------------------

_THINK_NAMES = "think|thinking|thought|antthinking"
_THINK_TAG = re.compile(rf"<(?P<close>/)?(?:{_THINK_NAMES})(?:\s[^<>]{{0,256}})?>",
                        re.IGNORECASE)
_THINK_CLOSE = re.compile(rf"</(?:{_THINK_NAMES})\s*>", re.IGNORECASE)


def strip_thinking_tags(text: str) -> str:
    """Remove reasoning blocks: ``<think>``, ``<thinking>``, ``<thought>``, ``<antThinking>``.

    A block ends at the first closing tag of any of these names (models do mix
    them up). Edge cases, chosen so the user sees the answer and not the
    reasoning:

    * A closing tag before any opening tag means the opening tag was part of
      the prompt template (DeepSeek-R1, Qwen3): everything up to it is
      reasoning and is removed. Later unmatched closing tags are just dropped.
    * An opening tag that is never closed, after some answer text, means the
      reasoning was cut off: it is removed along with everything after it.
    * A reply that *starts* with an opening tag that is never closed gives no
      hint where reasoning ends; hiding all of it would leave the user with no
      reply at all, so only the tag is removed and the text is kept.
    """
    if "<" not in text:
        return text
    code = _Code(text)
    cutter = _Cutter(text)
    lead = len(text) - len(text.lstrip())
    first = True
    closes_left = True  # becomes false once a search for a closing tag failed
    pos = 0
    while (m := _THINK_TAG.search(text, pos)) is not None:
        skip = code.end_of(m.start())
        if skip >= 0:
            pos = skip
            continue
        pos = m.end()
        if m.group("close") is not None:
            cutter.cut(0 if first else m.start(), m.end())
        else:
            close = _THINK_CLOSE.search(text, m.end()) if closes_left else None
            if close is not None:
                cutter.cut(m.start(), close.end())
                pos = close.end()
            elif m.start() == lead:
                closes_left = False
                cutter.cut(m.start(), m.end())
            else:
                cutter.cut(m.start(), len(text))
                break
        first = False
    return cutter.done()


# -- 4. final tags ---------------------------------------------------------------------------

_FINAL_TAG = re.compile(r"</?final(?:\s[^<>]{0,256})?>", re.IGNORECASE)


def unwrap_final_tags(text: str) -> str:
    """Remove ``<final>`` and ``</final>`` tags, keeping what they wrap.

    Text outside the tags is kept as well; tags inside code are left alone.
    """
    if "<" not in text:
        return text
    code = _Code(text)
    cutter = _Cutter(text)
    for m in _FINAL_TAG.finditer(text):
        if code.end_of(m.start()) < 0:
            cutter.cut(m.start(), m.end())
    return cutter.done()


# -- 5. echoed system messages ---------------------------------------------------------------

_SYSTEM_MARKER = re.compile(r"[ \t]*\[system message\]", re.IGNORECASE)


def strip_echoed_system_messages(text: str) -> str:
    """Remove ``[System Message]`` blocks a model echoed or made up.

    A block runs from a line starting with ``[System Message]`` to the next
    blank line outside a code fence; inside code the marker is kept.
    """
    if "[" not in text:
        return text
    return _drop_marked_blocks(text, _SYSTEM_MARKER)


# -- 6. stuttered paragraphs -----------------------------------------------------------------


def collapse_duplicate_paragraphs(text: str) -> str:
    """Drop a paragraph that repeats the one right before it (model stutter).

    Paragraphs are separated by blank lines; a fenced code block counts as
    part of its paragraph, so blank lines inside code never split it and code
    is never deduplicated line by line. Paragraphs are compared with
    surrounding whitespace trimmed; a repeat goes with the blank lines before
    it. Only *consecutive* repeats are collapsed.
    """
    if "\n" not in text:
        return text
    fence = _Fence()
    blocks: list[tuple[str, str]] = []  # (blank lines before, paragraph)
    gap: list[str] = []
    para: list[str] = []
    for line in _lines(text):
        if not fence.feed(line) and not line.strip():
            if para:
                blocks.append(("".join(gap), "".join(para)))
                gap, para = [], []
            gap.append(line)
        else:
            para.append(line)
    if para:
        blocks.append(("".join(gap), "".join(para)))
        gap = []
    out: list[str] = []
    previous: str | None = None
    for before, paragraph in blocks:
        key = paragraph.strip()
        if key == previous:
            continue
        out += (before, paragraph)
        previous = key
    out += gap
    return "".join(out)


# -- 7. leading blank lines ------------------------------------------------------------------


def strip_leading_blank_lines(text: str) -> str:
    """Remove whitespace-only lines at the top, keeping the first real line's indentation.

    An answer that opens with an indented code line keeps its indentation
    here (the final trim of the pipeline is a separate step).
    """
    pos = 0
    while True:
        nl = text.find("\n", pos)
        if nl == -1:
            return text[pos:] if text[pos:].strip() else ""
        if text[pos:nl].strip():
            return text[pos:]
        pos = nl + 1


# -- the hook --------------------------------------------------------------------------------


@hookimpl
def roost_output_sanitizers(settings: Settings) -> list[Sanitizer]:
    """The built-in cleaning steps, orders 100 to 700 (see the module docstring)."""
    return [
        Sanitizer("strip_garbled_tool_xml", strip_garbled_tool_xml, 100),
        Sanitizer("strip_text_tool_calls", strip_text_tool_calls, 200),
        Sanitizer("strip_thinking_tags", strip_thinking_tags, 300),
        Sanitizer("unwrap_final_tags", unwrap_final_tags, 400),
        Sanitizer("strip_echoed_system_messages", strip_echoed_system_messages, 500),
        Sanitizer("collapse_duplicate_paragraphs", collapse_duplicate_paragraphs, 600),
        Sanitizer("strip_leading_blank_lines", strip_leading_blank_lines, 700),
    ]
