"""Log output: plain text lines for people, or one JSON object per line for log shippers.

``ROOST_LOG_FORMAT=json`` makes every line on stderr a JSON object with ``ts`` (UTC,
ISO 8601 with milliseconds), ``level``, ``logger`` and ``message``, plus ``exc_info``
(the traceback as text) and ``stack_info`` when the record has them. The handler sits
on the root logger, so third-party libraries' records come out the same way; Python
warnings are routed through logging (``py.warnings``) and uncaught exceptions are
logged instead of printed. Secrets are already masked by the time a record reaches a
formatter (:mod:`bot.observability.redact` rewrites each record as it is made).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import threading
from types import TracebackType
from typing import Any, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")


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
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
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
