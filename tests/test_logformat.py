"""bot.observability.logformat: lines an event loop logs are written in batches, in order."""

from __future__ import annotations

import asyncio
import io
import logging

from bot.observability.logformat import TEXT_FORMAT, BatchingStreamHandler, TextFormatter


class _Stream(io.StringIO):
    """Records each write; ``written`` is set on the first one."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.written: asyncio.Event | None = None

    def write(self, text: str) -> int:
        self.writes.append(text)
        if self.written is not None:
            self.written.set()
        return super().write(text)


def _logger(stream: _Stream, delay: float = 0.01) -> tuple[logging.Logger, BatchingStreamHandler]:
    handler = BatchingStreamHandler(stream, delay=delay)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("roost.tests.logformat")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, handler


async def test_info_lines_of_the_loop_are_written_together_in_one_write() -> None:
    stream = _Stream()
    stream.written = asyncio.Event()
    logger, _ = _logger(stream)
    for n in range(3):
        logger.info("run %d done", n)
    assert stream.writes == []
    await stream.written.wait()
    assert stream.writes == ["INFO run 0 done\nINFO run 1 done\nINFO run 2 done\n"]


async def test_a_warning_writes_the_waiting_lines_and_itself_at_once_in_order() -> None:
    stream = _Stream()
    logger, _ = _logger(stream, delay=3600)
    logger.info("first")
    logger.warning("second")
    assert stream.getvalue() == "INFO first\nWARNING second\n"


def test_a_line_logged_outside_an_event_loop_is_written_at_once() -> None:
    stream = _Stream()
    logger, _ = _logger(stream)
    logger.info("now")
    assert stream.getvalue() == "INFO now\n"


async def test_flush_at_shutdown_writes_the_waiting_lines() -> None:
    stream = _Stream()
    logger, handler = _logger(stream, delay=3600)
    logger.info("pending")
    handler.flush()
    assert stream.getvalue() == "INFO pending\n"


def test_a_line_after_the_loop_ended_is_not_left_behind_a_dead_timer() -> None:
    stream = _Stream()
    logger, _ = _logger(stream, delay=3600)

    async def log_in_loop() -> None:
        logger.info("in the loop")

    asyncio.run(log_in_loop())
    logger.info("after")
    assert stream.getvalue() == "INFO in the loop\nINFO after\n"


def test_text_formatter_writes_what_the_standard_formatter_writes() -> None:
    record = logging.LogRecord("roost.x", logging.INFO, __file__, 1, "hi %s", ("there",), None)
    again = logging.LogRecord("roost.x", logging.INFO, __file__, 1, "second", (), None)
    again.created, again.msecs = record.created + 0.5, (record.msecs + 500) % 1000
    fast, standard = TextFormatter(), logging.Formatter(TEXT_FORMAT)
    for r in (record, again):
        assert fast.format(r) == standard.format(r)
