"""The console channel: a terminal chat that goes through the same path as the platforms.

In a terminal, lines are read with prompt_toolkit: arrow keys, Ctrl-A/E, history
(kept in ``history_file``) and Ctrl-R search, with replies printed above the prompt.
When stdin is not a terminal (a pipe, a file), lines are read plainly; with
``wait_idle`` each one is answered before the next is read, so piped messages are
separate turns rather than follow-ups merged into one run.

Besides replies, the console shows what a run does, one dim line per tool call
(``⚙ read_file notes.md → ok``; ``quiet`` hides them), and a failed answer as one
line ending with the stored error's ID (``[Error ID: err_…]``), which
``roost errors show`` prints in full.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from bot.contracts.channel import Capabilities, Channel, InboundHandler, ReplyStream
from bot.contracts.messages import Button, ButtonPress, InboundMessage, OutboundMessage

CHAT_ID = "console"
PROMPT = "you> "
ANSWERS = {"y": 0, "yes": 0, "n": 1, "no": 1, "a": 2}
"""Console answers to an approval prompt: the index of its button (Approve, Deny,
Approve for this session)."""
DIM, RESET = "\x1b[2m", "\x1b[0m"
ARGUMENT_CHARS = 40
"""A tool argument shown in a tool line is cut to this many characters."""


class ConsoleChannel(Channel):
    """Reads lines from stdin (when interactive) and prints replies to stdout."""

    name = "console"
    capabilities = Capabilities(buttons=True)
    """An approval prompt's buttons are asked as y/n/a."""

    def __init__(self, *, user_id: str = "local", user_name: str = "",
                 out: TextIO | None = None, read_stdin: bool = True,
                 stream: bool = True, quiet: bool = False,
                 wait_idle: Callable[[], Awaitable[None]] | None = None,
                 history_file: Path | None = None, prompt_session: Any = None) -> None:
        self.user_id = user_id
        self.user_name = user_name or os.environ.get("USER", "") or user_id
        self._out = out
        self.read_stdin = read_stdin
        self.stream = stream
        self.quiet = quiet
        self.wait_idle = wait_idle
        self.history_file = history_file
        self.eof = asyncio.Event()
        self._handler: InboundHandler | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._tty = self.out.isatty()
        self._session = prompt_session
        """A prompt_toolkit session (tests pass one on a pipe input)."""
        self._line_start = True
        self._calls: dict[str, tuple[str, str]] = {}
        self._error_id: str | None = None
        self._asking: tuple[str, list[Button]] | None = None
        self.asked = asyncio.Event()
        """Set while an approval prompt waits for y/n/a."""

    @property
    def out(self) -> TextIO:
        """Where replies go; ``sys.stdout`` as it is now (prompt_toolkit replaces it)."""
        return self._out or sys.stdout

    async def start(self, handler: InboundHandler) -> None:
        """Begin reading stdin in the background when ``read_stdin`` is set."""
        self._handler = handler
        if self.read_stdin:
            if self._session is None and self._tty and sys.stdin.isatty():
                self._session = _prompt_session(self.history_file)
            self._reader = asyncio.create_task(self._read_loop())
            self._prompt()

    async def stop(self) -> None:
        """Stop reading."""
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def say(self, text: str) -> None:
        """Submit ``text`` as the console user (``roost chat -m``); while an approval
        prompt is open, ``y``/``n``/``a`` answer it (Approve, Deny, for this session)."""
        assert self._handler is not None, "start() the channel first"
        choice = ANSWERS.get(text.strip().lower())
        if self._asking is not None and choice is not None:
            message_id, buttons = self._asking
            self._asking = None
            self.asked.clear()
            await self._handler(ButtonPress(
                channel=self.name, chat_id=CHAT_ID, message_id=message_id,
                data=buttons[choice].data, user_id=self.user_id, user_name=self.user_name,
                press_id=f"console-{next(self._ids)}"))
            return
        await self._handler(InboundMessage(
            channel=self.name, chat_id=CHAT_ID, chat_type="direct", sender_id=self.user_id,
            sender_name=self.user_name, text=text, message_id=str(next(self._ids)),
        ))

    async def send(self, message: OutboundMessage) -> str | None:
        """Print a reply (notices and errors are marked); files are printed as their path.
        A message with buttons (an approval prompt) asks for y/n/a and gets an id."""
        if message.kind == "error" or self._error_id is not None:
            self._error(message.text)
        else:
            mark = {"reply": "", "notice": "[notice] ", "error": ""}[message.kind]
            if message.text or not message.files:
                self._line(f"roost> {mark}{message.text}")
        for file in message.files:
            caption = f" — {file.caption}" if file.caption else ""
            self._line(f"roost> [file: {file.path} ({file.mime_type}, {file.size} bytes)]"
                       f"{caption}")
        if message.buttons:
            ident = f"out-{next(self._ids)}"
            self._asking = (ident, [b for row in message.buttons for b in row])
            self._line("roost> answer y (approve), n (deny) or a (approve for this session)")
            self.asked.set()
            self._prompt()
            return ident
        self._prompt()
        return None

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """Stream replies as they are generated, unless streaming is off."""
        return _ConsoleStream(self) if self.stream else None

    # -- what a run does (fed by the command line's run-event observer) ---------------

    def tool_started(self, call_id: str, name: str, arguments: Mapping[str, Any]) -> None:
        """Remember a tool call; its line is printed when its result arrives."""
        self._calls[call_id] = (name, describe_arguments(arguments))

    def tool_finished(self, call_id: str, name: str, *, is_error: bool, result: str) -> None:
        """One dim line for a finished tool call, unless ``quiet``."""
        shown, arguments = self._calls.pop(call_id, (name, ""))
        if self.quiet:
            return
        outcome = "ok" if not is_error else "error: " + _first_line(result, 60)
        text = f"⚙ {shown}{' ' + arguments if arguments else ''} → {outcome}"
        self._line(f"{DIM}{text}{RESET}" if self._tty else text)

    def run_failed(self, error_id: str | None) -> None:
        """The next reply is the apology of a failed run: show it as an error with its ID."""
        self._error_id = error_id or ""

    # -- output -----------------------------------------------------------------------

    def _error(self, text: str) -> None:
        error_id, self._error_id = self._error_id, None
        line = " ".join(text.split())
        if error_id:
            line += f" [Error ID: {error_id}]"
        self._line(f"roost> ✗ {line}")

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self._line_start = text.endswith("\n")

    def _line(self, text: str) -> None:
        """``text`` on a line of its own, even after a reply streamed without a newline."""
        self._write(("" if self._line_start else "\n") + text + "\n")

    def _prompt(self) -> None:
        # prompt_toolkit draws its own prompt.
        if self._tty and self.read_stdin and self._session is None:
            self._write(PROMPT)

    async def _read_loop(self) -> None:
        lines = _session_lines(self._session) if self._session is not None else _stdin_lines()
        try:
            async for line in lines:
                text = line.rstrip("\r\n")
                if not text.strip():
                    self._prompt()
                    continue
                await self.say(text)
                if self.wait_idle is not None and self._session is None:
                    # Until idle, or until a paused run asks a question to answer.
                    waits = {asyncio.ensure_future(self.wait_idle()),
                             asyncio.ensure_future(self.asked.wait())}
                    _, left = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    for task in left:
                        task.cancel()
        finally:
            self.eof.set()


class _ConsoleStream:
    def __init__(self, channel: ConsoleChannel) -> None:
        self.channel = channel
        self.shown = ""
        self.message_id: str | None = None

    async def push(self, text_so_far: str) -> None:
        if self.channel._error_id is not None:
            return
        if not self.shown:
            self.channel._write(("" if self.channel._line_start else "\n") + "roost> ")
        if text_so_far.startswith(self.shown):
            self.channel._write(text_so_far[len(self.shown):])
            self.shown = text_so_far

    async def finish(self, final_text: str | None) -> None:
        channel = self.channel
        if channel._error_id is not None and final_text is not None:
            channel._error(final_text)
        elif final_text is None:
            if self.shown:
                channel._write(" [withdrawn]\n")
        elif not self.shown:
            channel._line(f"roost> {final_text}")
        elif final_text == self.shown.strip():
            channel._write("\n")
        else:
            # The final text was cleaned up after streaming; show the clean one.
            channel._line(f"roost> {final_text}")
        channel._prompt()


_BULK_ARGUMENTS = frozenset({"content", "text", "body", "data", "new_text", "old_text"})
"""Arguments that carry a payload rather than say what the call is about."""


def describe_arguments(arguments: Mapping[str, Any]) -> str:
    """The telling part of a tool call's arguments: up to two short one-line strings."""
    shown: list[str] = []
    for key, value in arguments.items() if isinstance(arguments, Mapping) else ():
        if key in _BULK_ARGUMENTS:
            continue
        if isinstance(value, str) and value.strip() and "\n" not in value.strip():
            value = value.strip()
            shown.append(value if len(value) <= ARGUMENT_CHARS
                         else value[:ARGUMENT_CHARS - 1] + "…")
            if len(shown) == 2:
                break
    return " ".join(shown)


def _first_line(text: str, limit: int) -> str:
    line = next((part for part in text.splitlines() if part.strip()), "").strip()
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _prompt_session(history_file: Path | None) -> Any:
    """A prompt_toolkit session with history in ``history_file`` (kept across chats)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    history: Any = InMemoryHistory()
    if history_file is not None:
        try:
            history_file.parent.mkdir(parents=True, exist_ok=True)
            history = FileHistory(str(history_file))
        except OSError:
            pass  # a read-only data directory: history for this chat only
    return PromptSession(history=history)


async def _session_lines(session: Any) -> AsyncIterator[str]:
    """Lines typed at a prompt_toolkit prompt; output printed meanwhile goes above it."""
    from prompt_toolkit.patch_stdout import patch_stdout

    with patch_stdout(raw=True):
        while True:
            try:
                yield await session.prompt_async(PROMPT)
            except KeyboardInterrupt:
                continue  # Ctrl-C clears the line, as in a shell; Ctrl-D quits
            except EOFError:
                return


async def _stdin_lines() -> AsyncIterator[str]:
    """Yield stdin lines without blocking the loop (pipes, ttys and plain files)."""
    loop = asyncio.get_running_loop()
    mode = os.fstat(sys.stdin.fileno()).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or sys.stdin.isatty()):
        # epoll cannot watch regular files or devices such as /dev/null; they never block.
        while line := await asyncio.to_thread(sys.stdin.readline):
            yield line
        return
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line_bytes := await reader.readline():
        yield line_bytes.decode("utf-8", errors="replace")
