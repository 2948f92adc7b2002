"""Output sanitizers: what a user receives when the model leaks machinery into its reply."""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable

import pytest

from bot.config.settings import Settings
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import Sanitizer, run_pipeline
from bot.testing.app import scripted, settle
from plugins.sanitizers import (
    collapse_duplicate_paragraphs,
    roost_output_sanitizers,
    strip_echoed_system_messages,
    strip_garbled_tool_xml,
    strip_leading_blank_lines,
    strip_text_tool_calls,
    strip_thinking_tags,
    unwrap_final_tags,
)
from tests.conftest import AppFactory

STEPS: list[Callable[[str], str]] = [
    strip_garbled_tool_xml, strip_text_tool_calls, strip_thinking_tags, unwrap_final_tags,
    strip_echoed_system_messages, collapse_duplicate_paragraphs, strip_leading_blank_lines,
]
BUILTINS = roost_output_sanitizers(Settings.model_construct())


async def deliver(make_app: AppFactory, reply: str, *plugins: object) -> list[str]:
    """What the channel receives when the model answers ``reply``."""
    app, channel, log = await make_app(scripted({"reply": reply}), *plugins)
    await channel.say("hi")
    await settle(app)
    await log.wait_for("run.completed")
    return channel.replies


def is_subsequence(small: str, big: str) -> bool:
    chars = iter(big)
    return all(c in chars for c in small)


# -- each step, through the run engine -------------------------------------------------------


async def test_tool_call_xml_written_as_text_is_removed(make_app: AppFactory) -> None:
    reply = ('Let me check the weather.\n<tool_call>\n{"name": "weather", "arguments": '
             '{"city": "Paris"}}\n</tool_call>\nIt is sunny in Paris.')
    assert await deliver(make_app, reply) == ["Let me check the weather.\nIt is sunny in Paris."]


async def test_text_tool_calls_results_and_history_markers_are_removed(
    make_app: AppFactory,
) -> None:
    reply = ("Checking your notes.\n\n"
             '[Tool Call: read_file]\n{"path": "notes.md"}\n\n'
             "[Tool Result read_file]\ntea\nmilk\n\n"
             "[Historical context: earlier you asked about coffee]\n\n"
             "Your notes say tea and milk.")
    expected = "Checking your notes.\n\nYour notes say tea and milk."
    assert await deliver(make_app, reply) == [expected]


async def test_thinking_blocks_are_removed_with_their_content(make_app: AppFactory) -> None:
    reply = ("<think>\nThe user greets me.\nI should greet back.\n</think>\n"
             "Hello! <THOUGHT>keep it short</THOUGHT>How can I help?")
    assert await deliver(make_app, reply) == ["Hello! How can I help?"]


async def test_final_tags_are_unwrapped_keeping_the_answer(make_app: AppFactory) -> None:
    reply = "<final>\nThe answer is **42**.\n</final>"
    assert await deliver(make_app, reply) == ["The answer is **42**."]


async def test_echoed_system_message_blocks_are_removed(make_app: AppFactory) -> None:
    reply = ("Sure, done.\n\n[System Message] Reminder: be brief.\nNever reveal this.\n\n"
             "Anything else?")
    assert await deliver(make_app, reply) == ["Sure, done.\n\nAnything else?"]


async def test_stuttered_paragraphs_are_collapsed(make_app: AppFactory) -> None:
    reply = ("Here is the plan.\n\nHere is the plan.\n\n  Here is the plan.  \n\n"
             "Pack.\n\nGo.\n\nPack.")
    assert await deliver(make_app, reply) == ["Here is the plan.\n\nPack.\n\nGo.\n\nPack."]


class Recorder:
    """A sanitizer plugin that records the text it is given, unchanged."""

    def __init__(self, order: int) -> None:
        self.order = order
        self.seen: list[str] = []

    def _record(self, text: str) -> str:
        self.seen.append(text)
        return text

    @hookimpl
    def roost_output_sanitizers(self) -> Sanitizer:
        return Sanitizer("recorder", self._record, self.order)


async def test_leading_blank_lines_go_but_the_first_lines_indentation_stays(
    make_app: AppFactory,
) -> None:
    after_builtins = Recorder(750)
    reply = "\n \n\t\n    indented_call()\nthen prose\n"
    assert await deliver(make_app, reply, after_builtins) == ["indented_call()\nthen prose"]
    # Step 7 keeps the indentation; only the pipeline's final trim removes it.
    assert after_builtins.seen == ["    indented_call()\nthen prose\n"]


# -- silence, ordering, untouched text -------------------------------------------------------


async def test_a_reply_of_only_tool_xml_is_silent_but_the_run_completes(
    make_app: AppFactory,
) -> None:
    reply = ('<minimax:tool_call>\n<invoke name="search">\n<parameter name="q">cats'
             "</parameter>\n</invoke>\n</minimax:tool_call>\n<tool_call>{}</tool_call>")
    app, channel, log = await make_app(scripted({"reply": reply}))
    await channel.say("find cats")
    await settle(app)
    assert channel.sent == []
    completed = await log.wait_for("run.completed")
    assert completed.payload["silent"] is True
    assert completed.payload["content"] == ""
    session = await app.store.get("default:test:direct:u1")
    assert [(m.role, m.content) for m in session.messages] == [
        ("user", "find cats"), ("assistant", reply)]


async def test_no_reply_after_a_thinking_block_is_silent(make_app: AppFactory) -> None:
    app, channel, log = await make_app(
        scripted({"reply": "<think>Nobody asked me anything.</think>NO_REPLY"}))
    await channel.say("talking to someone else")
    await settle(app)
    assert channel.sent == []
    assert (await log.wait_for("run.completed")).payload["silent"] is True


_FINAL_BLOCK = re.compile(r"<final>(.*?)</final>", re.DOTALL)


class OnlyFinal:
    """A plugin sanitizer: keep just the first <final> block, if there is one."""

    def __init__(self, order: int) -> None:
        self.order = order

    @staticmethod
    def _only_final(text: str) -> str:
        m = _FINAL_BLOCK.search(text)
        return m.group(1) if m else text

    @hookimpl
    def roost_output_sanitizers(self) -> Sanitizer:
        return Sanitizer("only-final", self._only_final, self.order)


@pytest.mark.parametrize(("order", "expected"), [
    (250, "wrong"),  # before thinking is stripped: picks the <final> inside the reasoning
    (350, "Right answer."),  # between steps 3 and 4: reasoning gone, <final> still there
    (450, "Preamble. Right answer."),  # after step 4: no <final> left to pick
])
async def test_plugin_sanitizers_run_at_their_order_among_the_builtins(
    make_app: AppFactory, order: int, expected: str,
) -> None:
    reply = "<think>Draft: <final>wrong</final></think>Preamble. <final>Right answer.</final>"
    assert await deliver(make_app, reply, OnlyFinal(order)) == [expected]


MARKDOWN_REPLY = '''
Here's how to read your notes in Python:

```python
def read_notes(path: str) -> list[str]:
    with open(path) as f:
        lines = f.readlines()

    return [line.strip() for line in lines]


def main() -> None:
    for note in read_notes("notes.md"):
        print(note)

        print(note)
```

Some models wrap reasoning in `<think>` tags and answers in `<final>…</final>`;
a tool call written as text looks like ``<tool_call>{"name": "x"}</tool_call>``, or:

~~~xml
<tool_call>
{"name": "read_file", "arguments": {"path": "notes.md"}}
</tool_call>
~~~

Log lines look like this:

```
[System Message] rotated logs

[System Message] rotated logs
[Tool Call: read_file]
```

1. Run `python main.py`
   - it prints each note **twice**
2. Compare with a < b and b > a, or [1, 2] and [Tool Call: x] mid-line.

> A quote with <angle brackets> and [brackets].

| a | b |
|---|---|
| 1 | 2 |

    indented code block
'''


async def test_code_blocks_and_normal_markdown_pass_through_unchanged(
    make_app: AppFactory,
) -> None:
    assert await deliver(make_app, MARKDOWN_REPLY) == [MARKDOWN_REPLY.strip()]
    for step in STEPS[:-1]:
        assert step(MARKDOWN_REPLY) == MARKDOWN_REPLY, step.__name__


def test_builtins_use_orders_100_to_700_in_pipeline_order() -> None:
    assert [(s.order, s.func) for s in BUILTINS] == [
        ((i + 1) * 100, f) for i, f in enumerate(STEPS)]


# -- edge cases, step by step ----------------------------------------------------------------

CASES: list[tuple[Callable[[str], str], str, str]] = [
    # 1. tool XML
    (strip_garbled_tool_xml, "Done.\n\n<function_calls><invoke name=\"a\"><parameter nam",
     "Done.\n\n"),  # unclosed: cut off mid-call, removed to the end
    (strip_garbled_tool_xml, "Hi <tool_call>x</tool_call> there", "Hi there"),
    (strip_garbled_tool_xml, "Before\n<TOOL_USE id=\"1\">\nx\n</TOOL_USE>\nAfter", "Before\nAfter"),
    (strip_garbled_tool_xml, "a</tool_call> b", "a b"),  # stray closing tag
    (strip_garbled_tool_xml, "ok <tool_call /> done", "ok done"),
    (strip_garbled_tool_xml,
     "ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "ok"),
    (strip_garbled_tool_xml, "<tool_call>\n{}\n</tool_call>\n\n  \n", ""),  # all garbage
    (strip_garbled_tool_xml, "Set the <parameter> value; see <invoke>.", "Set the <parameter> "
     "value; see <invoke>."),  # without name= these are prose
    (strip_garbled_tool_xml, "<tool_caller> is a class", "<tool_caller> is a class"),
    (strip_garbled_tool_xml, "Use `<tool_call>` to start", "Use `<tool_call>` to start"),
    # 2. text tool calls
    (strip_text_tool_calls, "[Tool Call: x]\n{}\nmore json\n\nAnswer", "Answer"),
    (strip_text_tool_calls, "Intro\n[tool result for x]\nout\n\nAnswer", "Intro\n\nAnswer"),
    (strip_text_tool_calls, "[Tool Result x]\n```\na\n\nb\n```\n\nAnswer", "Answer"),
    (strip_text_tool_calls, "See [Tool Call: x] here", "See [Tool Call: x] here"),
    (strip_text_tool_calls, "Answer\n\n[Tool Call: x]\n{}", "Answer\n\n"),
    # 3. thinking
    (strip_thinking_tags, "reasoning\nmore</think>\n\nAnswer", "Answer"),  # template opened it
    (strip_thinking_tags, "<think>a</think>x</think>y", "xy"),  # later orphans: tag only
    (strip_thinking_tags, "<think>never closed reasoning", "never closed reasoning"),
    (strip_thinking_tags, "Answer.\n\n<thinking>cut off", "Answer.\n\n"),
    (strip_thinking_tags, "<Thinking>a\n```py\nx = 1\n```\n</THINKING>Answer", "Answer"),
    (strip_thinking_tags, "<think>mixed up</thought>Answer", "Answer"),
    (strip_thinking_tags, '<antThinking id="1">plan</antThinking>Answer', "Answer"),
    (strip_thinking_tags, "A\n\n<think>x</think>\n\nB", "A\n\nB"),
    (strip_thinking_tags, "Use `<think>` and `</think>`.", "Use `<think>` and `</think>`."),
    (strip_thinking_tags, "<thinker> stays", "<thinker> stays"),
    # 4. final
    (unwrap_final_tags, "Pre <final>x</final> post", "Pre x post"),
    (unwrap_final_tags, "<FINAL>\nx\n</final>", "x\n"),
    (unwrap_final_tags, "`<final>` stays", "`<final>` stays"),
    # 5. system messages
    (strip_echoed_system_messages, "[system message] x\ny\n\nHi", "Hi"),
    (strip_echoed_system_messages, "Hi\n  [System Message] x\n\nBye", "Hi\n\nBye"),
    (strip_echoed_system_messages, "Quote: [System Message] x", "Quote: [System Message] x"),
    # 6. duplicates
    (collapse_duplicate_paragraphs, "A\n\nA\n\nA\n\nB\n\nA", "A\n\nB\n\nA"),
    (collapse_duplicate_paragraphs, "A\nB\n\nA\nB\n\n\nC\n", "A\nB\n\n\nC\n"),
    (collapse_duplicate_paragraphs, "```\nx\n\nx\n```\n\n```\nx\n\nx\n```", "```\nx\n\nx\n```\n"),
    (collapse_duplicate_paragraphs, "one line", "one line"),
    # 7. leading blank lines
    (strip_leading_blank_lines, "\n  \n\t  code\n", "\t  code\n"),
    (strip_leading_blank_lines, " \n \n ", ""),
    (strip_leading_blank_lines, "  no newline", "  no newline"),
]


@pytest.mark.parametrize(("step", "text", "expected"), CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_step_edge_cases(step: Callable[[str], str], text: str, expected: str) -> None:
    assert step(text) == expected


def test_steps_are_documented() -> None:
    for step in STEPS:
        assert step.__doc__ and len(step.__doc__) > 60, step.__name__


# -- robustness ------------------------------------------------------------------------------

TOKENS = [
    "<tool_call>", "</tool_call>", "<tool_call", "<minimax:tool_call>", '<invoke name="x">',
    "</invoke>", '<parameter name="p">', "</parameter>", "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>", "<think>", "</think>", "<THINKING>", "</thought>", "<final>",
    "</final>", "[Tool Call: x]", "[Tool Result x]", "[Historical context: y]",
    "[System Message]", "```", "```py", "~~~", "`", "``", "\n", "\n\n", " \n", "\r\n", " ",
    "\t", "word", "Word.", "<", ">", "/", "[", "]", "{", "}", "é", "\u2028", "\x00",
]


def test_random_inputs_never_raise_and_only_delete() -> None:
    rng = random.Random(20240601)
    for _ in range(3000):
        text = "".join(rng.choice(TOKENS) for _ in range(rng.randrange(0, 40)))
        for step in STEPS:
            out = step(text)
            assert isinstance(out, str)
            assert is_subsequence(out, text), (step.__name__, text)
        assert is_subsequence(run_pipeline(text, BUILTINS), text)
    for _ in range(500):
        text = "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(0, 200)))
        for step in STEPS:
            assert is_subsequence(step(text), text), (step.__name__, text)


def test_pipeline_passes_a_sanitizer_only_text_holding_what_it_needs() -> None:
    seen: list[str] = []

    def record(text: str) -> str:
        seen.append(text)
        return text.replace("<b>", "")

    tags = Sanitizer("tags", record, needs="<>")
    assert run_pipeline("plain hello", [tags]) == "plain hello"
    assert seen == []
    assert run_pipeline("a <b>bold", [tags]) == "a bold"
    assert seen == ["a <b>bold"]


def test_builtins_skipped_for_lack_of_what_they_need_change_nothing() -> None:
    # Every built-in says what its artifacts contain, so a plain reply is not scanned...
    assert all(s.needs for s in BUILTINS)
    # ...and skipping it changes no result: each step leaves text without its needs as it
    # is (up to what the final trim removes), and the pipeline equals calling every step.
    always = [dataclasses.replace(s, needs="") for s in BUILTINS]
    rng = random.Random(20261127)
    for _ in range(3000):
        text = "".join(rng.choice(TOKENS) for _ in range(rng.randrange(0, 40)))
        assert run_pipeline(text, BUILTINS) == run_pipeline(text, always), text
        for s in BUILTINS:
            lacking = "".join(c for c in text if c not in s.needs)
            assert s.func(lacking).strip() == lacking.strip(), (s.name, lacking)
            if lacking.strip():
                assert s.func(lacking) == lacking, (s.name, lacking)


ADVERSARIAL = [
    "<tool_call", "<tool_call>", "</tool_call>", "<minimax:", '<invoke name="x">',
    "<invoke name=", "<parameter name=x ", "<tool_call " + "a" * 255, "<｜tool▁calls▁begin｜>",
    "<｜tool▁", "<think>", "</think>", "<think", "<thinking" + " " * 300, "<think>`", "<final ",
    "`", "``a", "`a``b```c````d", "```\n", "~~~\n", "[Tool Call: x]\n", "\n\n[Tool Result\n",
    "[System Message]\n", "a\n\n", " \n", "\n", "a <x> b ", "<",
]


@pytest.mark.parametrize("unit", ADVERSARIAL)
def test_large_adversarial_inputs_finish(unit: str) -> None:
    # The regexes have bounded repetition and every closing-tag search either
    # advances the scan or ends it, so this stays linear; no timing needed.
    text = (unit * (200_000 // len(unit) + 1))[:200_000]
    for step in STEPS:
        assert len(step(text)) <= len(text)
    assert len(run_pipeline(text, BUILTINS)) <= len(text)


async def test_streamed_text_never_shows_thinking_or_tool_markup(make_app: AppFactory) -> None:
    reply = "<think>secret plan: flatter them</think>Hello <b>there</b>, friend."
    app, channel, _ = await make_app(scripted({"reply": reply, "chunk": 3}), stream=True)
    await channel.say("hi")
    await settle(app)
    pushed = [t for t in channel.streams[0] if t is not None]
    assert pushed[-1] == "Hello <b>there</b>, friend."
    assert all("secret" not in t and "think" not in t for t in pushed)
    assert all(not t.endswith("<") and not t.endswith("<b") for t in pushed)
