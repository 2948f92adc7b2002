"""The last log records of this process, kept in memory for the Control UI's live tail.

:class:`LogRing` is a logging handler that appends each record to a bounded deque
and does nothing else: no formatting, no I/O, no lock beyond the handler's own.
The records are already redacted (:mod:`bot.observability.redact` rewrites each as
it is made); readers mask again with the same function when they show them.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from bot.observability.redact import redact

CAPACITY = 1000
"""Records kept; the oldest goes when another comes."""


@dataclass(frozen=True, slots=True)
class LogLine:
    """One record as shown: sequence number, time, level, logger and masked text."""

    seq: int
    created: float
    level: str
    levelno: int
    logger: str
    message: str


class LogRing(logging.Handler):
    """Keeps the last ``capacity`` records; :meth:`since` reads those after a sequence number."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        super().__init__(logging.NOTSET)
        self._records: deque[tuple[int, logging.LogRecord]] = deque(maxlen=capacity)
        self.seq = 0
        """The sequence number of the last record kept (0: none yet)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.seq += 1
        self._records.append((self.seq, record))

    def since(self, seq: int = 0) -> list[LogLine]:
        """The kept records numbered above ``seq``, oldest first, masked."""
        self.acquire()  # emit() holds it too: no record is appended while copying
        try:
            kept = [(n, r) for n, r in self._records if n > seq]
        finally:
            self.release()
        return [_line(n, r) for n, r in kept]

    def attach(self) -> None:
        """Start keeping the root logger's records."""
        logging.getLogger().addHandler(self)

    def detach(self) -> None:
        """Stop keeping records."""
        logging.getLogger().removeHandler(self)


def _line(seq: int, record: logging.LogRecord) -> LogLine:
    try:
        message = record.getMessage()
    except Exception:
        message = str(record.msg)
    if record.exc_text:
        message = f"{message}\n{record.exc_text}"
    return LogLine(seq, record.created, record.levelname, record.levelno, record.name,
                   redact(message))
