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
gone but while ``<final>`` tags are still there. Each step declares the characters
its artifacts contain (``<``, ``[`` or a line break: ``Sanitizer.needs``), so a
reply without any of them is not scanned at all. After the last sanitizer the
pipeline trims the text (:func:`bot.contracts.llm.run_pipeline`); an empty result
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

import re

from plugins._sanitize_text import Code, Cutter, Fence, drop_marked_blocks, lines
from roost import Sanitizer, Settings, hookimpl

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
    code = Code(text)
    cutter = Cutter(text)
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
    return drop_marked_blocks(text, _TEXT_TOOL_MARKER)


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
    code = Code(text)
    cutter = Cutter(text)
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
    code = Code(text)
    cutter = Cutter(text)
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
    return drop_marked_blocks(text, _SYSTEM_MARKER)


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
    fence = Fence()
    blocks: list[tuple[str, str]] = []  # (blank lines before, paragraph)
    gap: list[str] = []
    para: list[str] = []
    for line in lines(text):
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
        Sanitizer("strip_garbled_tool_xml", strip_garbled_tool_xml, 100, needs="<"),
        Sanitizer("strip_text_tool_calls", strip_text_tool_calls, 200, needs="["),
        Sanitizer("strip_thinking_tags", strip_thinking_tags, 300, needs="<"),
        Sanitizer("unwrap_final_tags", unwrap_final_tags, 400, needs="<"),
        Sanitizer("strip_echoed_system_messages", strip_echoed_system_messages, 500, needs="["),
        Sanitizer("collapse_duplicate_paragraphs", collapse_duplicate_paragraphs, 600,
                  needs="\n"),
        # Text without a line break has no blank line above its first one; a text of
        # blanks alone is emptied by the pipeline's final trim all the same.
        Sanitizer("strip_leading_blank_lines", strip_leading_blank_lines, 700, needs="\n"),
    ]
