"""`roost chat`: the banner, tool lines, errors with their ID, exit codes, line editing and
the demo, as a person sees them (subprocesses) and in-process for the prompt."""

from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from bot.contracts.messages import InboundMessage, OutboundMessage
from channels.console import ConsoleChannel, describe_arguments
from tests.cli_forks import run_roost
from tests.roost_forks import popen
from tests.test_first_contact import clean_env, roost

ERROR_LINE = re.compile(r"^roost> ✗ .+ \[Error ID: err_\d{8}_\d{6}_[0-9a-f]{6}\]$")


def chat(*args: str, cwd: Path, lines: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``roost chat *args`` with ``lines`` piped to it, as a process of its own
    (:mod:`tests.cli_forks`)."""
    return run_roost(["chat", *args], cwd=cwd, env=clean_env(**env), input=lines)


def test_the_demo_shows_tool_calls_memory_and_status_with_true_replies(tmp_path: Path) -> None:
    result = chat("--demo", cwd=tmp_path, lines=(
        "hi\nremember that I like tea\nwhat do you remember?\nlist my files\n/status\n"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "⚙ write_file MEMORY.md → ok" in out
    assert 'Noted in MEMORY.md: "I like tea"' in out
    assert "⚙ memory_get MEMORY.md → ok" in out
    # The memory answer quotes what memory_get returned, not a canned sentence.
    memory = out.split("From my memory (MEMORY.md):", 1)[1]
    assert memory.index("- I like tea") < memory.index("⚙ list_files → ok")
    assert "TOOL_EXECUTION_SUMMARY" not in out
    assert "MEMORY.md (" in out.split("Your workspace holds:", 1)[1]
    assert "Model: claude-sonnet-5-5 via scripted" in out  # /status
    assert (tmp_path / "data/workspaces/console/local/MEMORY.md").read_text() == "- I like tea\n"
    banner = result.stderr.strip().splitlines()
    assert len(banner) == 1
    assert "demo script, no model" in banner[0] and "data: ./data" in banner[0]
    assert "/help" in banner[0]


def test_quiet_hides_the_tool_lines(tmp_path: Path) -> None:
    result = chat("--demo", "--quiet", cwd=tmp_path, lines="remember that I like tea\n")
    assert result.returncode == 0, result.stderr
    assert "⚙" not in result.stdout and "Noted in MEMORY.md" in result.stdout


def test_piped_lines_are_separate_turns_answered_in_order(tmp_path: Path) -> None:
    # With the default merge window, follow-ups typed during a run would merge into it;
    # piped lines wait for the answer before the next is read.
    result = chat("--demo", cwd=tmp_path, lines="remember that I like tea\nhello\nhow are you\n")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.index("Noted in MEMORY.md") < out.index("Hello! I'm Roost") \
        < out.index("(demo) You said: how are you")


def test_stdin_from_dev_null_ends_the_chat_cleanly(tmp_path: Path) -> None:
    # /dev/null is a character device epoll refuses to watch: it is read like a file.
    result = run_roost(["chat", "--demo"], cwd=tmp_path, env=clean_env(), input=None)
    assert result.returncode == 0, result.stderr
    assert "error" not in result.stderr.lower(), result.stderr


def test_a_demo_reminder_fires_in_the_open_chat(tmp_path: Path) -> None:
    process = popen(["chat", "--demo"], cwd=tmp_path, env=clean_env(),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write("remind me in 1 second to stretch\n")
        process.stdin.flush()
        seen = []
        for line in process.stdout:  # waits on the output itself, no sleeping
            seen.append(line)
            if "Reminder:" in line:
                break
        assert "⚙ cron add at in 1 second → ok\n" in seen
        assert any(line.startswith("roost> Scheduled job ") for line in seen)
        assert seen[-1] == "roost> ⏰ Reminder: stretch\n"
    finally:
        process.stdin.close()
        process.wait(timeout=60)
        process.stdout.close()
        assert process.stderr is not None
        process.stderr.close()
    assert process.returncode == 0


def test_a_failed_answer_is_one_line_with_its_error_id_and_exit_code_1(tmp_path: Path) -> None:
    script = tmp_path / "down.yaml"
    script.write_text('turns:\n  - error: "the model is down\\nsecond line"\n')
    result = chat("-m", "hello", cwd=tmp_path, ROOST_PROVIDER="scripted",
                  ROOST_SCRIPT=str(script))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]), lines
    assert "Sorry, I couldn't answer that: the model is down" in lines[0]
    error_id = lines[0].rsplit("Error ID: ", 1)[1].rstrip("]")
    shown = roost("errors", "show", error_id, cwd=tmp_path)
    assert shown.returncode == 0 and "ProviderError" in shown.stdout  # the traceback is kept
    assert "Traceback" in (tmp_path / "data" / "chat.log").read_text()


def test_a_good_answer_exits_0(tmp_path: Path) -> None:
    result = chat("--demo", "-m", "hello", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == ""


# -- in process ----------------------------------------------------------------------


def test_tool_lines_name_the_telling_arguments_and_are_dim_on_a_terminal() -> None:
    assert describe_arguments({"path": "notes.md", "content": "- tea\n"}) == "notes.md"
    assert describe_arguments({"action": "add", "schedule": "every 2h", "message": "x"}) \
        == "add every 2h"
    assert describe_arguments({"query": "q" * 60}) == "q" * 39 + "…"

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    console = ConsoleChannel(out=out, read_stdin=False)
    console.tool_started("1", "read_file", {"path": "notes.md"})
    console.tool_finished("1", "read_file", is_error=True,
                          result="Tool 'read_file' failed: no such file\n[Error ID: err_1]")
    assert out.getvalue() == ("\x1b[2m⚙ read_file notes.md → error: Tool 'read_file' failed: "
                              "no such file\x1b[0m\n")


async def test_a_tool_line_after_a_streamed_fragment_starts_its_own_line() -> None:
    out = io.StringIO()
    console = ConsoleChannel(out=out, read_stdin=False)
    message = InboundMessage(channel="console", chat_id="console", chat_type="direct",
                             sender_id="local", sender_name="me", text="x", message_id="1")
    stream = console.open_stream(message)
    assert stream is not None
    await stream.push("Looking")
    console.tool_started("a", "list_files", {})
    console.tool_finished("a", "list_files", is_error=False, result="./")
    await stream.finish("Looking")
    await console.send(OutboundMessage("console", "console", "done"))
    assert out.getvalue() == "roost> Looking\n⚙ list_files → ok\n\nroost> done\n"


async def test_the_prompt_edits_lines_and_recalls_history_with_the_up_arrow() -> None:
    said: list[str] = []
    heard = asyncio.Event()

    async def handler(message: InboundMessage) -> None:
        said.append(message.text)
        heard.set()

    with create_pipe_input() as keys:
        session: PromptSession[Any] = PromptSession(
            input=keys, output=DummyOutput(), history=InMemoryHistory())
        console = ConsoleChannel(out=io.StringIO(), prompt_session=session)
        await console.start(handler)
        # "helo", left arrow, "l" -> "hello"; then Up recalls it; Ctrl-D ends the chat.
        keys.send_text("helo\x1b[Dl\r")
        await asyncio.wait_for(heard.wait(), 30)
        heard.clear()
        keys.send_text("\x1b[A")
        keys.send_text("\r")
        await asyncio.wait_for(heard.wait(), 30)
        keys.send_text("\x04")
        await asyncio.wait_for(console.eof.wait(), 30)
        await console.stop()
    assert said == ["hello", "hello"]


def test_prompt_toolkit_is_a_declared_dependency() -> None:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert any(dep.startswith("prompt_toolkit>=") and "<" in dep
               for dep in pyproject["project"]["dependencies"])
    assert sys.modules.get("prompt_toolkit") is not None
