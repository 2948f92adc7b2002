"""Log output: plain text lines for people, or one JSON object per line for log shippers.

``ROOST_LOG_FORMAT=json`` makes every line on stderr a JSON object with ``ts`` (UTC,
ISO 8601 with milliseconds), ``level``, ``logger`` and ``message``, plus ``exc_info``
(the traceback as text) and ``stack_info`` when the record has them. The handler sits
on the root logger, so third-party libraries' records come out the same way; Python
warnings are routed through logging (``py.warnings``) and uncaught exceptions are
logged instead of printed. Secrets are already masked by the time a record reaches a
formatter (:mod:`bot.observability.redact` rewrites each record as it is made).

Lines logged in an event loop's thread below WARNING are written at most once
per :data:`BATCH_DELAY` seconds (:class:`BatchingStreamHandler`): a line that
comes after a quiet spell is written at once, lines that follow it within the
delay wait and go out together. A busy service logs a line per run, and one
write per line was a system call per chat message. A WARNING or worse, a line
from another thread and the exit (``logging.shutdown``) write what waits at
once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
BATCH_DELAY = 0.02
"""Seconds between two writes of INFO lines logged in the event loop."""
BATCH_LINES = 256
"""Waiting lines that are written at once, delay or not."""


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT` with the date and time formatted once per second, not per line."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """``YYYY-MM-DD HH:MM:SS,mmm`` in local time, as :class:`logging.Formatter` writes it."""
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"


class BatchingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the lines an event loop logs in batches (see the module)."""

    def __init__(self, stream: TextIO, delay: float = BATCH_DELAY) -> None:
        super().__init__(stream)
        self.delay = delay
        self._lines: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._written = -delay

    def emit(self, record: logging.LogRecord) -> None:
        """Format ``record`` now; write it with the others waiting, now or shortly."""
        try:
            self._lines.append(self.format(record))
            if record.levelno >= logging.WARNING or len(self._lines) >= BATCH_LINES:
                self._write()
                return
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is None:
                self._write()
            elif self._timer is None or self._timer_loop is not loop:
                # (A timer of a loop that has since ended would never fire.)
                wait = self._written + self.delay - time.monotonic()
                if wait <= 0:
                    self._write()  # after a quiet spell: nothing to wait for
                else:
                    self._timer = loop.call_later(wait, self._flush_later)
                    self._timer_loop = loop
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        """Write the waiting lines, then flush the stream."""
        with self.lock:  # type: ignore[union-attr]  # created in Handler.__init__
            self._write()

    def _flush_later(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._timer = None
            # Logging must not fail the loop (as Handler.handleError does not).
            with contextlib.suppress(Exception):
                self._write()

    def _write(self) -> None:
        if self._timer is not None and self._timer_loop is not None:
            if not self._timer_loop.is_closed():
                self._timer.cancel()
            self._timer = None
        lines, self._lines = self._lines, []
        self._written = time.monotonic()
        if lines and self.stream is not None:
            self.stream.write("\n".join(lines) + "\n")
        if self.stream is not None and hasattr(self.stream, "flush"):
            self.stream.flush()


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in the text are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as ``{"ts", "level", "logger", "message"[, "exc_info", "stack_info"]}``."""
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = record.stack_info
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str, *, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Log ``level`` and above to ``stream`` (stderr) as ``fmt`` (``text`` or ``json``).

    Like :func:`logging.basicConfig`, it leaves a root logger that already has
    handlers alone (an embedding application's, or pytest's).
    """
    handler = BatchingStreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    logging.captureWarnings(True)
    if fmt == "json":
        # A traceback printed by the interpreter would be many non-JSON lines.
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_thread_uncaught


def _log_uncaught(kind: type[BaseException], value: BaseException,
                  tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("roost").critical("uncaught exception", exc_info=(kind, value, tb))


def _log_thread_uncaught(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None:
        return
    logging.getLogger("roost").critical(
        "uncaught exception in thread %s", args.thread.name if args.thread else "?",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
