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


async def test_a_line_after_a_quiet_spell_is_written_at_once_and_the_next_ones_together(
) -> None:
    stream = _Stream()
    logger, _ = _logger(stream, delay=0.3)  # longer than a loaded machine's stall
    logger.info("run 0 done")
    assert stream.writes == ["INFO run 0 done\n"]
    stream.written = asyncio.Event()
    for n in (1, 2):
        logger.info("run %d done", n)
    assert stream.writes == ["INFO run 0 done\n"]
    await stream.written.wait()
    assert stream.writes == ["INFO run 0 done\n", "INFO run 1 done\nINFO run 2 done\n"]


async def test_a_warning_writes_the_waiting_lines_and_itself_at_once_in_order() -> None:
    stream = _Stream()
    logger, _ = _logger(stream, delay=3600)
    logger.info("first")
    logger.info("second")
    assert stream.getvalue() == "INFO first\n"
    logger.warning("third")
    assert stream.getvalue() == "INFO first\nINFO second\nWARNING third\n"


def test_a_line_logged_outside_an_event_loop_is_written_at_once() -> None:
    stream = _Stream()
    logger, _ = _logger(stream)
    logger.info("now")
    assert stream.getvalue() == "INFO now\n"


async def test_flush_at_shutdown_writes_the_waiting_lines() -> None:
    stream = _Stream()
    logger, handler = _logger(stream, delay=3600)
    logger.info("written")
    logger.info("pending")
    assert stream.getvalue() == "INFO written\n"
    handler.flush()
    assert stream.getvalue() == "INFO written\nINFO pending\n"


def test_a_line_after_the_loop_ended_is_not_left_behind_a_dead_timer() -> None:
    stream = _Stream()
    logger, _ = _logger(stream, delay=3600)

    async def log_in_loop() -> None:
        logger.info("in the loop")
        logger.info("waiting")

    asyncio.run(log_in_loop())
    logger.info("after")
    assert stream.getvalue() == "INFO in the loop\nINFO waiting\nINFO after\n"


def test_text_formatter_writes_what_the_standard_formatter_writes() -> None:
    record = logging.LogRecord("roost.x", logging.INFO, __file__, 1, "hi %s", ("there",), None)
    again = logging.LogRecord("roost.x", logging.INFO, __file__, 1, "second", (), None)
    again.created, again.msecs = record.created + 0.5, (record.msecs + 500) % 1000
    fast, standard = TextFormatter(), logging.Formatter(TEXT_FORMAT)
    for r in (record, again):
        assert fast.format(r) == standard.format(r)
