"""The console channel: a terminal chat that goes through the same path as the platforms."""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
import sys
from collections.abc import AsyncIterator
from typing import TextIO

from bot.contracts.channel import Channel, InboundHandler, ReplyStream
from bot.contracts.messages import InboundMessage, OutboundMessage

CHAT_ID = "console"


class ConsoleChannel(Channel):
    """Reads lines from stdin (when interactive) and prints replies to stdout."""

    name = "console"

    def __init__(self, *, user_id: str = "local", user_name: str = "",
                 out: TextIO | None = None, read_stdin: bool = True,
                 stream: bool = True) -> None:
        self.user_id = user_id
        self.user_name = user_name or os.environ.get("USER", "") or user_id
        self.out = out or sys.stdout
        self.read_stdin = read_stdin
        self.stream = stream
        self.eof = asyncio.Event()
        self._handler: InboundHandler | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._tty = self.out.isatty()

    async def start(self, handler: InboundHandler) -> None:
        """Begin reading stdin in the background when ``read_stdin`` is set."""
        self._handler = handler
        if self.read_stdin:
            self._reader = asyncio.create_task(self._read_loop())
            self._prompt()

    async def stop(self) -> None:
        """Stop reading."""
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def say(self, text: str) -> None:
        """Submit ``text`` as the console user (``roost chat -m``)."""
        assert self._handler is not None, "start() the channel first"
        await self._handler(InboundMessage(
            channel=self.name, chat_id=CHAT_ID, chat_type="direct", sender_id=self.user_id,
            sender_name=self.user_name, text=text, message_id=str(next(self._ids)),
        ))

    async def send(self, message: OutboundMessage) -> None:
        """Print a reply (notices and errors are marked); files are printed as their path."""
        mark = {"reply": "", "notice": "[notice] ", "error": "[error] "}[message.kind]
        if message.text or not message.files:
            self._write(f"roost> {mark}{message.text}\n")
        for file in message.files:
            caption = f" — {file.caption}" if file.caption else ""
            self._write(f"roost> [file: {file.path} ({file.mime_type}, {file.size} bytes)]"
                        f"{caption}\n")
        self._prompt()

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """Stream replies as they are generated, unless streaming is off."""
        return _ConsoleStream(self) if self.stream else None

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _prompt(self) -> None:
        if self._tty and self.read_stdin:
            self._write("you> ")

    async def _read_loop(self) -> None:
        async for line in _stdin_lines():
            text = line.rstrip("\r\n")
            if text.strip():
                await self.say(text)
            else:
                self._prompt()
        self.eof.set()


class _ConsoleStream:
    def __init__(self, channel: ConsoleChannel) -> None:
        self.channel = channel
        self.shown = ""
        self.message_id: str | None = None

    async def push(self, text_so_far: str) -> None:
        if not self.shown:
            self.channel._write("roost> ")
        if text_so_far.startswith(self.shown):
            self.channel._write(text_so_far[len(self.shown):])
            self.shown = text_so_far

    async def finish(self, final_text: str | None) -> None:
        if final_text is None:
            if self.shown:
                self.channel._write(" [withdrawn]\n")
        elif not self.shown:
            self.channel._write(f"roost> {final_text}\n")
        elif final_text == self.shown.strip():
            self.channel._write("\n")
        else:
            # The final text was cleaned up after streaming; show the clean one.
            self.channel._write(f"\nroost> {final_text}\n")
        self.channel._prompt()


async def _stdin_lines() -> AsyncIterator[str]:
    """Yield stdin lines without blocking the loop (pipes, ttys and plain files)."""
    loop = asyncio.get_running_loop()
    mode = os.fstat(sys.stdin.fileno()).st_mode
    if stat.S_ISREG(mode):
        # epoll cannot watch regular files; they never block anyway.
        while line := await asyncio.to_thread(sys.stdin.readline):
            yield line
        return
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line_bytes := await reader.readline():
        yield line_bytes.decode("utf-8", errors="replace")
