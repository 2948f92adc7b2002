"""Tokens spent, per user, group chat and agent, per UTC day and month (schema step 14).

Counted from the usage each provider reports for a run (input plus output
tokens; input counts every prompt token, those read from or written to the
provider's prompt cache included, which are also counted apart); budgets
(:mod:`bot.engine.budgets`) read these counters before a run calls the model.
Subjects: a user is ``channel:user_id``, a group ``channel:chat_id``, an agent its name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import aiosqlite

from bot.storage.db import Writer

Scope = Literal["user", "group", "agent"]


def day_of(moment: float) -> str:
    """The UTC day of a timestamp: ``2026-11-23``."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d")


def month_of(moment: float) -> str:
    """The UTC month of a timestamp: ``2026-11``."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class Spent:
    """One subject's counters for one period."""

    subject: str
    input_tokens: int
    output_tokens: int
    runs: int
    cost: float = 0.0
    cache_read_tokens: int = 0
    """Of ``input_tokens``, those read from the prompt cache."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, those written to the prompt cache."""

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


class UsageStore:
    """The usage counters, on the shared connection and writer."""

    def __init__(self, db: aiosqlite.Connection, lock: Any, writer: Writer,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.lock = lock
        self.writer = writer
        self.clock = clock
        """Wall-clock seconds deciding the day and month; tests replace it."""

    def record(self, subjects: list[tuple[Scope, str]], input_tokens: int,
               output_tokens: int, cost: float = 0.0, moment: float | None = None, *,
               cache_read_tokens: int = 0, cache_write_tokens: int = 0) -> None:
        """Add one run's tokens (and their cost) to each subject's day and month (queued;
        committed with the next write). The cache counts are parts of ``input_tokens``."""
        moment = self.clock() if moment is None else moment
        rows = [(scope, subject, period, input_tokens, output_tokens, cost, cache_read_tokens,
                 cache_write_tokens)
                for scope, subject in subjects
                for period in (day_of(moment), month_of(moment))]

        async def body(db: aiosqlite.Connection) -> None:
            await db.executemany(
                "INSERT INTO usage (scope, subject, period, input_tokens, output_tokens, cost,"
                " cache_read_tokens, cache_write_tokens, runs)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (scope, period, subject)"
                # Qualified: PostgreSQL reads a bare name here as ambiguous.
                " DO UPDATE SET input_tokens = usage.input_tokens + excluded.input_tokens,"
                " output_tokens = usage.output_tokens + excluded.output_tokens,"
                " cost = usage.cost + excluded.cost,"
                " cache_read_tokens = usage.cache_read_tokens + excluded.cache_read_tokens,"
                " cache_write_tokens = usage.cache_write_tokens + excluded.cache_write_tokens,"
                " runs = usage.runs + 1",
                rows)

        self.writer.write_later(body, what="counting tokens spent")

    async def flush(self) -> None:
        """Wait until every recorded run is committed."""
        await self.writer.write(_nothing, what="counting tokens spent")

    async def spent(self, scope: Scope, subject: str, period: str) -> int:
        """Tokens ``subject`` spent in ``period`` (a day or a month as :func:`day_of` gives)."""
        async with self.lock, self.db.execute(
            "SELECT input_tokens + output_tokens FROM usage"
            " WHERE scope = ? AND period = ? AND subject = ?", (scope, period, subject),
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def cost(self, scope: Scope, subject: str, period: str) -> float:
        """What ``subject``'s tokens in ``period`` cost by the price table."""
        async with self.lock, self.db.execute(
            "SELECT cost FROM usage WHERE scope = ? AND period = ? AND subject = ?",
            (scope, period, subject),
        ) as cur:
            row = await cur.fetchone()
        return float(row[0]) if row is not None else 0.0

    async def top(self, scope: Scope, period: str, limit: int = 10) -> list[Spent]:
        """The biggest spenders of ``scope`` in ``period``, most tokens first."""
        async with self.lock, self.db.execute(
            "SELECT subject, input_tokens, output_tokens, runs, cost, cache_read_tokens,"
            " cache_write_tokens FROM usage WHERE scope = ? AND period = ?"
            " ORDER BY input_tokens + output_tokens DESC, subject LIMIT ?",
            (scope, period, limit),
        ) as cur:
            rows = await cur.fetchall()
        return [Spent(str(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]), int(r[5]),
                      int(r[6])) for r in rows]

    async def totals(self, scope: Scope, subject: str, period: str) -> Spent:
        """``subject``'s counters for ``period`` (zeros when it spent nothing)."""
        async with self.lock, self.db.execute(
            "SELECT subject, input_tokens, output_tokens, runs, cost, cache_read_tokens,"
            " cache_write_tokens FROM usage WHERE scope = ? AND period = ? AND subject = ?",
            (scope, period, subject),
        ) as cur:
            r = await cur.fetchone()
        if r is None:
            return Spent(subject, 0, 0, 0)
        return Spent(str(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]), int(r[5]),
                     int(r[6]))


async def _nothing(db: aiosqlite.Connection) -> None:
    return None
